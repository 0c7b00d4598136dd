"""Runs a bot script as ``python script.py`` would, pointed at a fake Bot API server (the test's environment, not part
of the script): ``example_bot_child.py SCRIPT API_URL FILE_URL``. The script reads its token from ``BOT_TOKEN``."""

from __future__ import annotations

import runpy
import sys

from telegram_fence.telegram import set_api_server

if __name__ == "__main__":
    script, api_url, file_url = sys.argv[1:4]
    set_api_server(api_url, file_url)
    runpy.run_path(script, run_name="__main__")
