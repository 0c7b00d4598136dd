"""Run one documentation snippet (or example) as a program, pointed at the fake Bot API server.

Usage: ``python docs_runner.py SNIPPET.py`` in the directory the snippet may write to, with
``TELEGRAM_API_URL`` and ``TELEGRAM_FILE_URL`` (telebot's format strings) in the environment. The
snippet runs as ``__main__``; afterwards every ``test_*`` function it defined whose only parameter is
``tmp_path`` is called with a fresh directory, as pytest would.
"""

from __future__ import annotations

import inspect
import os
import runpy
import sys
import tempfile
from pathlib import Path

from telebot import apihelper


def main() -> int:
    apihelper.API_URL = os.environ["TELEGRAM_API_URL"]
    apihelper.FILE_URL = os.environ["TELEGRAM_FILE_URL"]
    namespace = runpy.run_path(sys.argv[1], run_name="__main__")
    for name, value in namespace.items():
        if name.startswith("test_") and inspect.isfunction(value):
            parameters = list(inspect.signature(value).parameters)
            if parameters not in ([], ["tmp_path"]):
                raise SystemExit(f"{name} needs fixtures {parameters}; mark the snippet <!-- not-run: ... -->")
            with tempfile.TemporaryDirectory() as tmp:
                value(*([Path(tmp)] if parameters else []))
            print(f"ran {name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
