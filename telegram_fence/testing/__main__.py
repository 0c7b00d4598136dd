"""``python -m telegram_fence.testing``: the fake Bot API server on its own, to try a bot without Telegram.

Prints ``TELEGRAM_BOT_TOKEN`` and ``TELEGRAM_API_URL`` for the bot, sends each stdin line as a message from chat
``--chat`` (default 42) and prints what the bot sends as ``bot -> CHAT: TEXT``. SIGINT/SIGTERM stop it (exit 0);
bad arguments exit 2, a port that cannot be bound exits 1.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from .fake_api import FakeBotAPI

__all__ = ["main"]

_PROG = "python -m telegram_fence.testing"


def _interrupt(_signum: int, _frame: Any) -> NoReturn:
    raise KeyboardInterrupt


def _echo(api: FakeBotAPI, stop: threading.Event) -> None:
    """Print every message the bot sends, in order, until ``stop`` is set (and then the ones already sent)."""
    shown = 0
    while not stop.is_set():
        api.wait_for(lambda: len(api.sent) > shown or stop.is_set(), timeout=1.0)  # noqa: B023 (called at once)
        sent = api.sent
        for message in sent[shown:]:
            print(f"bot -> {message.chat_id}: {message.text}", flush=True)
        shown = len(sent)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit status."""
    parser = argparse.ArgumentParser(prog=_PROG, description="Run the fake Bot API server alone: each line on stdin "
                                     "is a user's message to the bot; what the bot sends is printed.")
    parser.error = lambda message: parser.exit(2, f"{_PROG}: {message}\n")  # type: ignore[method-assign]
    parser.add_argument("--port", type=int, default=0, help="the port to listen on, on 127.0.0.1 (default: a free one)")
    parser.add_argument("--chat", type=int, default=42, help="the chat (and user) id of the lines typed (default 42)")
    parser.add_argument("--token", default=None, help="the bot token it accepts (default: a new random one)")
    args = parser.parse_args(argv)
    try:
        api = FakeBotAPI(port=args.port, token=args.token).start()
    except OSError as exc:
        print(f"{_PROG}: cannot listen on 127.0.0.1:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bad token or port (ConfigurationError): one line
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    echo = threading.Thread(target=_echo, args=(api, stop), name="fake-api-echo", daemon=True)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        print(f"TELEGRAM_BOT_TOKEN={api.token}\nTELEGRAM_API_URL={api.base_url}")
        print(f"# the fake Bot API server listens; each line typed is a message from chat {args.chat}; "
              "Ctrl-C stops it", flush=True)
        echo.start()
        for line in sys.stdin:  # a signal interrupts the read
            if line.strip():
                api.push_message(args.chat, line.rstrip("\n"))
        threading.Event().wait()  # stdin ended: serve on until a signal
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        if echo.ident is not None:
            echo.join(5)
        api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
