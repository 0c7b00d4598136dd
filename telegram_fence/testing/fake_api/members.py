"""Chat members of the fake Bot API: getChat, getChatMember and friends, bans, restrictions, tags, leaveChat;
:class:`MemberControls` sets and reads a member's status. After ``leaveChat`` sends to that chat get the 403.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ...errors import ConfigurationError
from .answers import ApiError, as_bool, as_int, as_json, chat_dict, user_dict
from .chats import Chats

__all__ = ["MEMBER_STATUSES", "MemberControls", "Members"]

#: The statuses of Telegram's ``ChatMember`` variants.
MEMBER_STATUSES = ("creator", "administrator", "member", "restricted", "left", "kicked")
_PRESENT = ("creator", "administrator", "member", "restricted")
_PERMISSIONS = (
    "can_send_messages", "can_send_audios", "can_send_documents", "can_send_photos", "can_send_videos",
    "can_send_video_notes", "can_send_voice_notes", "can_send_polls", "can_send_other_messages",
    "can_add_web_page_previews", "can_change_info", "can_invite_users", "can_pin_messages", "can_manage_topics",
)


#: The fields each ``ChatMember`` variant must carry (telebot refuses to build one without them).
_REQUIRED: dict[str, dict[str, Any]] = {
    "creator": {"is_anonymous": False},
    "administrator": {
        "can_be_edited": False, "is_anonymous": False, "can_manage_chat": True, "can_delete_messages": False,
        "can_manage_video_chats": False, "can_restrict_members": False, "can_promote_members": False,
        "can_change_info": False, "can_invite_users": False, "can_post_stories": False, "can_edit_stories": False,
        "can_delete_stories": False,
    },
    "restricted": {"is_member": True, "until_date": 0, **dict.fromkeys(_PERMISSIONS, True)},
    "kicked": {"until_date": 0},
}


class Members:
    """Who is in which chat, with which status. Thread-safe: every method takes ``cond`` (re-entrant)."""

    def __init__(self, cond: threading.Condition, chats: Chats) -> None:
        self.cond = cond
        self.chats = chats
        self.status: dict[tuple[int, int], dict[str, Any]] = {}

    def table(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        """The handlers by Bot API method name."""
        return {
            "getChat": self.get_chat,
            "getChatMember": self.get_chat_member,
            "getChatAdministrators": self.get_chat_administrators,
            "getChatMemberCount": self.get_chat_member_count,
            "banChatMember": self.ban_chat_member,
            "unbanChatMember": self.unban_chat_member,
            "restrictChatMember": self.restrict_chat_member,
            "promoteChatMember": self.promote_chat_member,
            "setChatMemberTag": self.set_chat_member_tag,
            "leaveChat": self.leave_chat,
        }

    def member(self, chat_id: int, user_id: int) -> dict[str, Any]:
        """The ``ChatMember`` object of ``user_id`` in ``chat_id`` (a copy), with every field its variant requires."""
        with self.cond:
            fields = dict(self.status.get((chat_id, user_id), {"status": "member"}))
        fields = {**_REQUIRED.get(fields["status"], {}), **fields}
        if user_id == self.chats.bot_id:
            user = self.chats.bot_user()
            if chat_id in self.chats.left:
                fields = {"status": "left"}
        else:
            user = user_dict(user_id)
        return {**fields, "user": user}

    def set(self, chat_id: int, user_id: int, fields: dict[str, Any]) -> None:
        with self.cond:
            self.status[(chat_id, user_id)] = fields

    def _user(self, params: dict[str, Any]) -> int:
        user_id = as_int(params, "user_id")
        if user_id is None:
            raise ApiError(400, "Bad Request: invalid user_id specified")
        return user_id

    def _group(self, params: dict[str, Any]) -> int:
        chat_id = self.chats.chat_of(params)
        if chat_id > 0:
            raise ApiError(400, "Bad Request: method is available for supergroup and channel chats only")
        return chat_id

    def get_chat(self, params: dict[str, Any]) -> Any:
        chat_id = self.chats.chat_of(params)
        chat = chat_dict(chat_id)
        if chat_id > 0:
            chat["first_name"] = f"User {chat_id}"
        chat.update(accent_color_id=0, max_reaction_count=11, accepted_gift_types={
            "unlimited_gifts": False, "limited_gifts": False, "unique_gifts": False, "premium_subscription": False,
            "gifts_from_channels": False,
        })
        return chat

    def get_chat_member(self, params: dict[str, Any]) -> Any:
        chat_id = self.chats.chat_of(params)
        user_id = self._user(params)
        if chat_id > 0 and user_id not in (chat_id, self.chats.bot_id):
            raise ApiError(400, "Bad Request: user not found")
        return self.member(chat_id, user_id)

    def get_chat_administrators(self, params: dict[str, Any]) -> Any:
        chat_id = self.chats.chat_of(params)
        with self.cond:
            users = [uid for (chat, uid), f in self.status.items()
                     if chat == chat_id and f["status"] in ("creator", "administrator")]
        return [self.member(chat_id, uid) for uid in sorted(users)]

    def get_chat_member_count(self, params: dict[str, Any]) -> Any:
        chat_id = self.chats.chat_of(params)
        with self.cond:
            users = {uid for (chat, uid) in self.status if chat == chat_id}
            users |= {uid for (chat, _mid), uid in self.chats.user_messages.items() if chat == chat_id}
            users.add(self.chats.bot_id)
            return sum(1 for uid in users if self.member(chat_id, uid)["status"] in _PRESENT)

    def ban_chat_member(self, params: dict[str, Any]) -> Any:
        chat_id = self._group(params)
        user_id = self._user(params)
        if user_id == self.chats.bot_id:
            raise ApiError(400, "Bad Request: can't remove chat owner")
        with self.cond:
            if self.status.get((chat_id, user_id), {}).get("status") == "creator":
                raise ApiError(400, "Bad Request: can't remove chat owner")
            self.status[(chat_id, user_id)] = {"status": "kicked", "until_date": as_int(params, "until_date") or 0}
            if as_bool(params.get("revoke_messages")):
                for key in [k for k, uid in self.chats.user_messages.items() if k[0] == chat_id and uid == user_id]:
                    del self.chats.user_messages[key]
        return True

    def unban_chat_member(self, params: dict[str, Any]) -> Any:
        chat_id = self._group(params)
        user_id = self._user(params)
        with self.cond:
            current = self.status.get((chat_id, user_id), {"status": "member"})["status"]
            if as_bool(params.get("only_if_banned")) and current != "kicked":
                return True
            if current in ("creator", "administrator"):
                raise ApiError(400, "Bad Request: user is an administrator of the chat")
            self.status[(chat_id, user_id)] = {"status": "left"}
        return True

    def restrict_chat_member(self, params: dict[str, Any]) -> Any:
        chat_id = self._group(params)
        user_id = self._user(params)
        permissions = as_json(params, "permissions", dict)
        fields: dict[str, Any] = {"status": "restricted", "is_member": True,
                                  "until_date": as_int(params, "until_date") or 0}
        fields.update({name: bool(permissions.get(name, False)) for name in _PERMISSIONS})
        with self.cond:
            if self.status.get((chat_id, user_id), {}).get("status") == "creator":
                raise ApiError(400, "Bad Request: can't restrict chat owner")
            self.status[(chat_id, user_id)] = fields
        return True

    def promote_chat_member(self, params: dict[str, Any]) -> Any:
        chat_id = self._group(params)
        user_id = self._user(params)
        rights = {k: as_bool(v) for k, v in params.items() if k.startswith("can_") or k == "is_anonymous"}
        fields: dict[str, Any] = {"status": "administrator" if any(rights.values()) else "member"}
        if fields["status"] == "administrator":
            fields.update(rights, can_be_edited=True)
        with self.cond:
            self.status[(chat_id, user_id)] = fields
        return True

    def set_chat_member_tag(self, params: dict[str, Any]) -> Any:
        chat_id = self._group(params)
        user_id = self._user(params)
        tag = params.get("tag")
        with self.cond:
            fields = dict(self.status.get((chat_id, user_id), {"status": "member"}))
            if fields["status"] not in _PRESENT:
                raise ApiError(400, "Bad Request: user is not a member of the chat")
            if tag:
                fields["tag"] = str(tag)
            else:
                fields.pop("tag", None)
            self.status[(chat_id, user_id)] = fields
        return True

    def leave_chat(self, params: dict[str, Any]) -> Any:
        chat_id = self.chats.chat_of(params)
        if chat_id > 0:
            raise ApiError(400, "Bad Request: chat member status can't be changed in private chats")
        with self.cond:
            self.chats.left.add(chat_id)
        return True


class MemberControls:
    """The member-scripting methods of ``FakeBotAPI`` (a base class of it); state in ``self._members``."""

    _members: Members

    def set_member(self, chat_id: int, user_id: int, status: str = "member", **fields: Any) -> None:
        """Give ``user_id`` a ``status`` in ``chat_id`` (one of :data:`MEMBER_STATUSES`), with any extra
        ``ChatMember`` fields (``until_date``, ``can_delete_messages``, ``custom_title``, ...)."""
        if status not in MEMBER_STATUSES:
            raise ConfigurationError(f"status must be one of {', '.join(MEMBER_STATUSES)}, got {status!r}")
        self._members.set(chat_id, user_id, {"status": status, **fields})

    def member(self, chat_id: int, user_id: int) -> dict[str, Any]:
        """What ``getChatMember`` answers for ``user_id`` in ``chat_id`` now (``status``, ``user``, ...)."""
        return self._members.member(chat_id, user_id)

    def has_left(self, chat_id: int) -> bool:
        """Whether the bot left ``chat_id`` with ``leaveChat`` (sends there are then refused with 403)."""
        with self._members.cond:
            return chat_id in self._members.chats.left
