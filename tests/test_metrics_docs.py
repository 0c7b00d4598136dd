"""docs/operations.md's metrics as written: its scrape config and alert rules parse, point where the page's
``metrics=`` example serves, and name only metrics a real scrape has; its table lists every metric a scrape has.

The scrapes are real: a polling fence serving ``metrics=`` over HTTP, and a webhook fence (``webhook_app`` with
``register_webhook`` and one delivery) answering ``GET /metrics`` beside its intake, read with Prometheus' parser.
"""

from __future__ import annotations

import io
import json
import re
import socket
import urllib.request
from pathlib import Path

import telebot
import yaml
from prometheus_client.parser import text_string_to_metric_families

from telegram_fence import Fence
from telegram_fence.testing import FakeBotAPI

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
SECTION = PAGE[PAGE.index("## Metrics and health"):PAGE.index("## Upgrades")]


def _names(text: str) -> set[str]:
    """Every metric name and sample name of an exposition (counters as ``x_total``)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {sample.name for sample in family.samples}
    return names


def _documented() -> set[str]:
    """The names the table gives (``_x`` after a full name is short for ``telegram_fence_x``; labels dropped)."""
    table = [line for line in SECTION.splitlines() if line.startswith("| `telegram_fence_")]
    names = set()
    for row in table:
        for name in re.findall(r"`(telegram_fence_\w+|_\w+)(?:\{\w+\})?`", row.split(" | ")[0]):
            names.add(name if name.startswith("telegram_fence_") else "telegram_fence" + name)
    return names


def _polling_scrape(api: FakeBotAPI, db: str) -> str:
    bot = telebot.TeleBot(api.token)

    @bot.message_handler(func=lambda m: True)
    def echo(message: telebot.types.Message) -> None:
        bot.send_message(message.chat.id, "echo")

    fence = Fence(bot, db, metrics=("127.0.0.1", 0))
    fence.start()
    try:
        api.push_message(1, "hi")
        assert api.wait_sent(1)
        assert fence.metrics_url is not None
        with urllib.request.urlopen(fence.metrics_url + "/metrics", timeout=30) as answer:
            return str(answer.read().decode())
    finally:
        fence.stop()
        assert fence.join()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _webhook_scrape(api: FakeBotAPI, db: str) -> str:
    fence = Fence(telebot.TeleBot(api.token), db)
    app = fence.webhook_app("s3cret", health=True)
    fence.start()
    try:
        fence.register_webhook(f"http://127.0.0.1:{_closed_port()}/hook", secret_token="s3cret")
        body = json.dumps({"update_id": 5, "message": {"message_id": 1, "date": 0, "text": "hi",
                                                        "chat": {"id": 1, "type": "private"}}}).encode()
        status: list[str] = []
        b"".join(app({"REQUEST_METHOD": "POST", "PATH_INFO": "/hook", "CONTENT_LENGTH": str(len(body)),
                      "wsgi.input": io.BytesIO(body), "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": "s3cret"},
                     lambda line, headers: status.append(line)))
        assert status == ["200 OK"], status
        text = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "wsgi.input": io.BytesIO(b"")},
                            lambda line, headers: status.append(line)))
        assert status[-1] == "200 OK"
        return text.decode()
    finally:
        fence.stop()
        assert fence.join()


def test_the_scrape_config_and_alert_rules_parse_and_name_what_a_scrape_has(tmp_path: Path) -> None:
    """The page's prometheus.yml targets the address of its ``metrics=`` example under the job its rules select,
    every ``telegram_fence_`` name of the rules and of the table is in a real scrape, and every metric a scrape
    has is in the table."""
    configs = re.findall(r"```yaml\n(.*?)```", SECTION, re.S)
    assert len(configs) == 2, "a scrape config and a rules file"
    scrape, rules = (yaml.safe_load(text) for text in configs)
    [job] = scrape["scrape_configs"]
    host, port = re.search(r'metrics=\("([\d.]+)", (\d+)\)', SECTION).groups()  # type: ignore[union-attr]
    assert job["static_configs"] == [{"targets": [f"{host}:{port}"]}]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    expressions = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    assert all(rule.get("alert") for group in rules["groups"] for rule in group["rules"])
    assert f'up{{job="{job["job_name"]}"}}' in " ".join(expressions)

    with FakeBotAPI(max_long_poll=0.3) as api:
        scraped = _names(_polling_scrape(api, str(tmp_path / "poll.db")))
        scraped |= _names(_webhook_scrape(api, str(tmp_path / "hook.db")))
    in_rules = {name for expr in expressions for name in re.findall(r"telegram_fence_\w+", expr)}
    assert in_rules and in_rules <= scraped, sorted(in_rules - scraped)
    documented = _documented()
    assert documented <= scraped, f"the table names what no scrape has: {sorted(documented - scraped)}"
    families = {name for name in scraped if not name.endswith("_created")}
    assert families <= documented, f"the table lacks: {sorted(families - documented)}"
