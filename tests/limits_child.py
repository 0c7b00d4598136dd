"""Child process for the shared rate-limit tests: imports the command line, says ``ready``, waits for a line on
stdin, then runs ``telegram-fence ARGV...`` and exits with its status (so the parent's timing does not include
Python's start-up)."""

from __future__ import annotations

import sys

from telegram_fence.cli.main import main


def run(argv: list[str]) -> int:
    print("ready", flush=True)
    if not sys.stdin.readline():
        return 99
    return main(argv)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
