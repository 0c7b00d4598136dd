"""The fake Bot API's member, moderation, poll and message methods, and the public way to add a method, via telebot."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import telebot
from telebot import apihelper, types

from telegram_fence.errors import ConfigurationError
from telegram_fence.testing import ApiError, FakeBotAPI

GROUP = -1001234567890


def refused(fn: Callable[[], Any]) -> apihelper.ApiTelegramException:
    """Run ``fn`` and return the ``ApiTelegramException`` it must raise."""
    with pytest.raises(apihelper.ApiTelegramException) as info:
        fn()
    return info.value


def test_get_chat_member_answers_a_telebot_chat_member(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """getChatMember answers `member` by default and what set_member scripted, parsed by telebot into its types."""
    fake_bot_api.push_message(GROUP, "hi", user_id=7)
    member = fake_bot.get_chat_member(GROUP, 7)
    assert isinstance(member, types.ChatMember) and member.status == "member" and member.user.id == 7
    fake_bot_api.set_member(GROUP, 8, "administrator", can_delete_messages=True)
    admin = fake_bot.get_chat_member(GROUP, 8)
    assert admin.status == "administrator" and admin.can_delete_messages is True
    assert [m.user.id for m in fake_bot.get_chat_administrators(GROUP)] == [8]
    assert fake_bot.get_chat_member_count(GROUP) == 3  # users 7 and 8, and the bot
    assert fake_bot.get_chat(GROUP).id == GROUP
    assert refused(lambda: fake_bot.get_chat_member(5, 6)).description == "Bad Request: user not found"
    with pytest.raises(ConfigurationError):
        fake_bot_api.set_member(GROUP, 9, "boss")


def test_ban_unban_restrict_and_tag_change_what_get_chat_member_answers(
    fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot
) -> None:
    """banChatMember, unbanChatMember, restrictChatMember and setChatMemberTag move the member's status."""
    fake_bot_api.push_message(GROUP, "spam", user_id=7)
    assert fake_bot.ban_chat_member(GROUP, 7, until_date=2_000_000_000)
    assert fake_bot_api.member(GROUP, 7) == {"status": "kicked", "until_date": 2_000_000_000,
                                              "user": fake_bot_api.member(GROUP, 7)["user"]}
    assert fake_bot.unban_chat_member(GROUP, 7, only_if_banned=True)
    assert fake_bot.get_chat_member(GROUP, 7).status == "left"
    permissions = types.ChatPermissions(can_send_messages=False)
    assert fake_bot.restrict_chat_member(GROUP, 7, permissions=permissions)
    restricted = fake_bot.get_chat_member(GROUP, 7)
    assert restricted.status == "restricted" and restricted.can_send_messages is False
    assert fake_bot.set_chat_member_tag(GROUP, 8, "helper")
    assert fake_bot_api.member(GROUP, 8)["tag"] == "helper"
    private = refused(lambda: fake_bot.ban_chat_member(42, 42))
    assert private.error_code == 400 and "supergroup and channel chats only" in private.description
    assert [c.method for c in fake_bot_api.calls][-1] == "banChatMember"


def test_ban_with_revoke_messages_deletes_the_users_messages(
    fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot
) -> None:
    """revoke_messages=True removes every message of the banned user in that chat, and only theirs."""
    fake_bot_api.push_message(GROUP, "one", user_id=7, message_id=10)
    fake_bot_api.push_message(GROUP, "two", user_id=7, message_id=11)
    fake_bot_api.push_message(GROUP, "other", user_id=8, message_id=12)
    assert fake_bot.ban_chat_member(GROUP, 7, revoke_messages=True)
    assert [fake_bot_api.has_message(GROUP, m) for m in (10, 11, 12)] == [False, False, True]


def test_leave_chat_makes_later_sends_to_it_forbidden(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """After leaveChat the bot is `left` and a send to that chat gets Telegram's 403; other chats are unaffected."""
    fake_bot_api.push_message(GROUP, "bye", user_id=7)
    assert fake_bot.leave_chat(GROUP)
    assert fake_bot_api.has_left(GROUP) and fake_bot_api.member(GROUP, fake_bot_api.bot_id)["status"] == "left"
    error = refused(lambda: fake_bot.send_message(GROUP, "still here?"))
    assert error.error_code == 403 and error.description == "Forbidden: bot is not a member of the supergroup chat"
    assert fake_bot.send_message(42, "elsewhere").text == "elsewhere"
    assert refused(lambda: fake_bot.leave_chat(42)).error_code == 400  # private chats cannot be left


def test_send_poll_and_stop_poll(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """sendPoll answers a Message with a Poll (and refuses fewer than 2 options); stopPoll closes it once."""
    message = fake_bot.send_poll(42, "Lunch?", ["pizza", "soup"], is_anonymous=False)
    assert message.poll.question == "Lunch?" and [o.text for o in message.poll.options] == ["pizza", "soup"]
    assert message.poll.is_anonymous is False and message.poll.is_closed is False
    assert fake_bot_api.sent_to(42)[-1].method == "sendPoll"
    stopped = fake_bot.stop_poll(42, message.message_id)
    assert stopped.is_closed is True
    assert "already been closed" in refused(lambda: fake_bot.stop_poll(42, message.message_id)).description
    assert "at least 2 option" in refused(lambda: fake_bot.send_poll(42, "Only?", ["one"])).description


def test_delete_message_deletes_any_message_once(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """deleteMessage deletes a user's message as well as the bot's own; deleting it again is 400 not found."""
    fake_bot_api.push_message(GROUP, "delete me", user_id=7, message_id=50)
    own = fake_bot.send_message(GROUP, "mine")
    assert fake_bot.delete_message(GROUP, 50) and fake_bot.delete_message(GROUP, own.message_id)
    assert not fake_bot_api.has_message(GROUP, 50) and not fake_bot_api.has_message(GROUP, own.message_id)
    again = refused(lambda: fake_bot.delete_message(GROUP, 50))
    assert again.description == "Bad Request: message to delete not found"
    fake_bot_api.push_message(GROUP, "a", user_id=7, message_id=60)
    assert fake_bot.delete_messages(GROUP, [60, 61])  # Telegram skips the ids that are not there
    assert not fake_bot_api.has_message(GROUP, 60)


def test_forward_copy_pin_react_and_edit_markup(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """forwardMessage, copyMessage, pinChatMessage, setMessageReaction and editMessageReplyMarkup answer as Telegram."""
    original = fake_bot.send_message(42, "news")
    forwarded = fake_bot.forward_message(43, 42, original.message_id)
    assert forwarded.text == "news" and forwarded.chat.id == 43
    copied = fake_bot.copy_message(44, 42, original.message_id)
    assert isinstance(copied, types.MessageID) and fake_bot_api.sent_to(44)[0].text == "news"
    assert fake_bot.pin_chat_message(42, original.message_id) and fake_bot.unpin_chat_message(42, original.message_id)
    assert fake_bot.set_message_reaction(42, original.message_id, [types.ReactionTypeEmoji("👍")])
    markup = types.InlineKeyboardMarkup()
    markup.add(types.InlineKeyboardButton("ok", callback_data="ok"))
    edited = fake_bot.edit_message_reply_markup(42, original.message_id, reply_markup=markup)
    assert edited.reply_markup.keyboard[0][0].callback_data == "ok"
    missing = refused(lambda: fake_bot.forward_message(43, 42, 999))
    assert missing.description == "Bad Request: message to forward not found"


def test_a_test_adds_a_method_through_the_public_api(fake_bot_api: FakeBotAPI, fake_bot: telebot.TeleBot) -> None:
    """add_method answers a method the fake lacks (or refuses with ApiError); the call is recorded under its name."""
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    def send_dice(params: dict[str, Any]) -> Any:
        with lock:
            seen.append(params)
        if params.get("emoji") == "🚫":
            raise ApiError(400, "Bad Request: invalid dice emoji")
        return {"message_id": 1, "date": 0, "chat": {"id": int(params["chat_id"]), "type": "private"},
                "dice": {"emoji": params.get("emoji", "🎲"), "value": 6}}

    fake_bot_api.add_method("sendDice", send_dice)
    message = fake_bot.send_dice(42, emoji="🎯")
    assert message.dice.value == 6 and message.dice.emoji == "🎯"
    error = refused(lambda: fake_bot.send_dice(42, emoji="🚫"))
    assert error.error_code == 400 and error.description == "Bad Request: invalid dice emoji"
    assert [c.method for c in fake_bot_api.calls_to("sendDice")] == ["sendDice", "sendDice"]
    assert len(seen) == 2

    fake_bot_api.add_method("getChatMember", lambda params: {"status": "creator", "is_anonymous": False,
                                                               "user": {"id": 1, "is_bot": False, "first_name": "O"}})
    assert fake_bot.get_chat_member(GROUP, 1).status == "creator"  # a built-in one can be replaced
    fake_bot_api.fail("sendDice", 500, "Internal Server Error")
    assert refused(lambda: fake_bot.send_dice(42)).error_code == 500  # scripted faults apply to added methods
    with pytest.raises(ConfigurationError):
        fake_bot_api.add_method("getUpdates", lambda params: [])
    with pytest.raises(ConfigurationError):
        fake_bot_api.add_method("send dice", send_dice)
