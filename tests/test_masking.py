"""Token masking: no bot secret survives in text, however tokens are glued together."""

from __future__ import annotations

import pytest

from telegram_fence.telegram import mask_tokens

T1 = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw0"
T2 = "987654321:ZZHdqTcvCH1vGWJxfSeofSAs0K5PALDsawq"


@pytest.mark.parametrize(
    "text",
    [T1, f"/bot{T1}/getUpdates", T1 + T2, T1 + "abc" + T2, f"{T1}/{T2}", f"{T1}:{T2}", f"a={T1}&b={T2}"],
)
def test_no_secret_survives(text: str) -> None:
    """Every token's secret part is gone from the masked text, including a second token glued to the first."""
    masked = mask_tokens(text)
    for token in (T1, T2):
        assert token.split(":")[1] not in masked
        assert token.split(":")[1][:20] not in masked


def test_configured_secrets_and_bot_id_kept() -> None:
    """Configured secrets are masked too; the public bot id before the colon is kept."""
    masked = mask_tokens(f"call {T1} with password hunter2", secrets=["hunter2", ""])
    assert masked == "call 123456789:*** with password ***"
