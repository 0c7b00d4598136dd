"""docs/webhook.md's programs for real WSGI servers, run as written: ``app.py`` + ``gunicorn.conf.py`` under the
page's gunicorn command line, and ``serve.py`` under waitress, each against the fake Bot API.

test_docs.py cannot run them (gunicorn imports ``app.py``; ``serve.py`` blocks in waitress), so they are marked
not-run there and run here. The only things changed are the port (a free one instead of 8080) and, for the swapped
secret, ``Fence.webhook_check_interval`` (half a second instead of a minute). telebot is pointed at the fake by a
``sitecustomize`` module on the child's path, as tests/docs_runner.py does for the other snippets.
Each server is stopped the three ways the page promises: SIGTERM (the fence stops cleanly), a webhook another host
holds at start (one line, no traceback, nothing registered), and the webhook's secret swapped while it runs (the
fence ends and takes the server down). The page's first program (``run_webhook``) is also run against a webhook
another host holds, the one path tests/test_docs.py does not take.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import gunicorn  # noqa: F401  (the test extras install it: the programs below need it)
import pytest
import waitress  # noqa: F401

from telegram_fence.testing import FakeBotAPI

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "webhook.md").read_text(encoding="utf-8")


_SITE = """import os
from telebot import apihelper
apihelper.API_URL = os.environ["TELEGRAM_API_URL"]
if os.environ.get("TF_TEST_CHECK_INTERVAL"):
    from telegram_fence import Fence
    Fence.webhook_check_interval = float(os.environ["TF_TEST_CHECK_INTERVAL"])
"""


def _program(name: str) -> str:
    """The page's python block whose first line is ``# NAME``."""
    found = [code for code in re.findall(r"```python\n(.*?)```", PAGE, re.S) if code.startswith(f"# {name}")]
    assert len(found) == 1, f"docs/webhook.md has {len(found)} blocks starting with '# {name}'"
    return found[0]


def _gunicorn_line() -> list[str]:
    """The page's gunicorn command line, split as a shell would."""
    lines = re.findall(r"^```\n(gunicorn [^\n]*)\n```$", PAGE, re.M)
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Served:
    code: int
    output: str
    api: FakeBotAPI
    db: Path


def _command(server: str, port: int) -> list[str]:
    if server == "gunicorn":
        argv = [arg.replace("127.0.0.1:8080", f"127.0.0.1:{port}") for arg in _gunicorn_line()]
        assert f"127.0.0.1:{port}" in argv, argv
        return [sys.executable, "-m", *argv]
    return [sys.executable, "serve.py"]


def _serve(server: str, scenario: str, tmp_path: Path) -> Served:
    """Run ``server`` with the page's files in ``tmp_path`` through ``scenario``; return how it ended."""
    work, site = tmp_path / "work", tmp_path / "site"
    work.mkdir()
    site.mkdir()
    for name in ("app.py", "gunicorn.conf.py", "serve.py"):
        (work / name).write_text(_program(name), encoding="utf-8")
    (site / "sitecustomize.py").write_text(_SITE, encoding="utf-8")
    port = _free_port()
    with FakeBotAPI() as api:
        base = api.api_url.split("/bot")[0]
        if scenario == "taken":
            urllib.request.urlopen(f"{base}/bot{api.token}/setWebhook?url=http://127.0.0.1:9/elsewhere").read()
        env = dict(os.environ, TELEGRAM_BOT_TOKEN=api.token, TELEGRAM_API_URL=api.api_url, PORT=str(port),
                   WEBHOOK_URL=f"http://127.0.0.1:{port}/telegram/hook", WEBHOOK_SECRET="docs-secret",
                   PYTHONPATH=os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]))
        if scenario == "swapped":  # the watch's check finds Telegram's 401 within half a second
            env["TF_TEST_CHECK_INTERVAL"] = "0.5"
        child = subprocess.Popen(_command(server, port), cwd=work, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        try:
            if scenario != "taken":
                api.push_message(42, "hello")
                assert api.wait_for(lambda: bool(api.sent) or child.poll() is not None, timeout=30)
                assert [m.text for m in api.sent_to(42)] == ["hello"], "the served bot did not answer"
            if scenario == "sigterm":
                child.send_signal(signal.SIGTERM)
            elif scenario == "swapped":  # the same URL registered again with another secret, by someone else
                url = api.calls_to("setWebhook")[-1].params["url"]
                query = urllib.parse.urlencode({"url": url, "secret_token": "someone-elses"})
                urllib.request.urlopen(f"{base}/bot{api.token}/setWebhook?{query}").read()
                for n in range(5):
                    api.push_message(42, f"refused {n}")
            output, _ = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
        return Served(child.returncode, output, api, work / "bot.db")


def _generation(db: Path) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "telegram_fence", "status", str(db), "--json"], capture_output=True,
                          text=True, timeout=60, check=True)
    generation = json.loads(done.stdout)["generation"]
    assert isinstance(generation, dict)
    return generation


@pytest.mark.parametrize("server", ["gunicorn", "waitress"])
def test_sigterm_stops_the_server_and_the_fence_cleanly(server: str, tmp_path: Path) -> None:
    """The served bot answers; SIGTERM (systemd's stop) ends the server with 0 and the fence's generation is
    recorded stopped cleanly (waitress: the page's signal handler; gunicorn: its ``worker_exit`` hook)."""
    served = _serve(server, "sigterm", tmp_path)
    assert served.code == 0, served.output
    assert "Traceback" not in served.output, served.output
    generation = _generation(served.db)
    assert generation["end_reason"] == "clean stop", generation


@pytest.mark.parametrize(("server", "code"), [("gunicorn", 3), ("waitress", 1)])
def test_a_webhook_another_host_holds_stops_the_start_in_one_line(server: str, code: int, tmp_path: Path) -> None:
    """With the webhook registered elsewhere, the program says so in one line, without a traceback, registers
    nothing, and exits non-zero (gunicorn's 3, "worker failed to boot", so its master does not respawn it)."""
    served = _serve(server, "taken", tmp_path)
    assert served.code == code, served.output
    assert "Traceback" not in served.output, served.output
    lines = [line for line in served.output.splitlines() if line.startswith("not started: ")]
    assert len(lines) == 1 and "127.0.0.1:9" in lines[0], served.output
    assert len(served.api.calls_to("setWebhook")) == 1, "only the other host's registration"
    assert served.api.calls_to("getWebhookInfo"), "the program never looked"


@pytest.mark.parametrize(("server", "code"), [("gunicorn", 0), ("waitress", 1)])
def test_a_swapped_secret_ends_the_fence_and_takes_the_server_down(server: str, code: int, tmp_path: Path) -> None:
    """When someone registers the webhook again with another secret, the fence ends (one line with the reason) and
    its ``on_ended`` stops the server: gunicorn's master stops gracefully (0); ``serve.py`` exits 1, as
    ``run_webhook`` returns 1."""
    served = _serve(server, "swapped", tmp_path)
    assert served.code == code, served.output
    assert "Traceback" not in served.output, served.output
    ended = [line for line in served.output.splitlines() if "webhook ended: " in line]
    assert len(ended) == 1 and "another secret_token" in ended[0], served.output
    generation = _generation(served.db)
    assert "another secret_token" in str(generation["end_reason"]), generation


def test_the_run_webhook_example_says_in_one_line_that_another_host_holds_the_webhook(tmp_path: Path) -> None:
    """docs/webhook.md's first program, run as written while the webhook is registered elsewhere: one
    ``not started: …`` line naming that host, exit 1, no traceback, nothing registered."""
    program = tmp_path / "bot.py"
    code = re.findall(r"```python\n(.*?)```", PAGE, re.S)[0]
    assert "fence.run_webhook(" in code and "except WebhookTaken" in code
    program.write_text(code, encoding="utf-8")
    port = _free_port()
    with FakeBotAPI() as api:
        base = api.api_url.split("/bot")[0]
        urllib.request.urlopen(f"{base}/bot{api.token}/setWebhook?url=http://127.0.0.1:9/elsewhere").read()
        env = dict(os.environ, TELEGRAM_BOT_TOKEN=api.token, TELEGRAM_API_URL=api.api_url,
                   TELEGRAM_FILE_URL=api.file_url, PORT=str(port), WEBHOOK_URL=f"http://127.0.0.1:{port}/hook",
                   WEBHOOK_SECRET="docs-secret",
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        done = subprocess.run([sys.executable, str(ROOT / "tests" / "docs_runner.py"), str(program)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=60, check=False)
        assert len(api.calls_to("setWebhook")) == 1, "only the other host's registration"
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("not started: the bot's webhook is registered to "
                                                           "127.0.0.1:9"), done.stderr
