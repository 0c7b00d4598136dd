"""``updates``: which chat an update belongs to (its ordering line), whatever the dict holds."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest

from telegram_fence.updates import chat_id_of


@pytest.mark.parametrize(
    ("update", "chat"),
    [
        ({"update_id": 1, "message": {"chat": {"id": 5}}}, 5),
        ({"update_id": 1, "edited_message": {"chat": {"id": -100123}}}, -100123),
        ({"update_id": 1, "channel_post": {"chat": {"id": -7}}}, -7),
        ({"update_id": 1, "my_chat_member": {"chat": {"id": 9}}}, 9),
        ({"update_id": 1, "chat_join_request": {"chat": {"id": 11}}}, 11),
        ({"update_id": 1, "callback_query": {"id": "q", "message": {"chat": {"id": 3}}}}, 3),
        ({"update_id": 1, "callback_query": {"id": "q", "inline_message_id": "m"}}, None),
        ({"update_id": 1, "inline_query": {"id": "q", "query": ""}}, None),
        ({"update_id": 1, "poll": {"id": "p"}}, None),
        ({"update_id": 1}, None),
        # malformed: never raises, never takes a bool or a string for a chat id
        ({"update_id": 1, "message": {"chat": {"id": True}}}, None),
        ({"update_id": 1, "message": {"chat": {"id": "5"}}}, None),
        ({"update_id": 1, "message": {"chat": None}}, None),
        ({"update_id": 1, "message": ["chat"]}, None),
        ({"update_id": 1, "message": "text"}, None),
        ({"update_id": 1, "callback_query": {"message": {"chat": 4}}}, None),
        # beyond 64 bits: no chat (no store column holds it), at the bounds: the id
        ({"update_id": 1, "message": {"chat": {"id": 2**63}}}, None),
        ({"update_id": 1, "message": {"chat": {"id": -(2**63) - 1}}}, None),
        ({"update_id": 1, "message": {"chat": {"id": 2**63 - 1}}}, 2**63 - 1),
        ({"update_id": 1, "message": {"chat": {"id": -(2**63)}}}, -(2**63)),
    ],
)
def test_chat_id_of(update: dict[str, Any], chat: int | None) -> None:
    assert chat_id_of(update) == chat


def test_other_mappings_are_read_like_dicts() -> None:
    """Not only plain dicts: any Mapping (here an OrderedDict at every level) gives the same answer."""
    update = OrderedDict(update_id=1, message=OrderedDict(chat=OrderedDict(id=42)))
    assert chat_id_of(update) == 42
