"""Files from a local Bot API server (``telegram-bot-api --local``), served only from the bot's own directory (a
symlink swapped in after the check included); error messages mask bot tokens."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, BinaryIO

from .errors import ConfigurationError, FileAccessRefused
from .telegram import call, mask_tokens

__all__ = ["DirectoryCheck", "LocalFiles"]

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO swapped in must not block the open
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_WALK_BENEATH = bool(_O_NOFOLLOW and _O_DIRECTORY and os.open in os.supports_dir_fd)


@dataclass(frozen=True)
class DirectoryCheck:
    """The answer of :meth:`LocalFiles.check`: ``ok``, and in ``reason`` what is wrong (or "ok")."""

    ok: bool
    reason: str
    path: str

    def __bool__(self) -> bool:
        return self.ok


def _show(path: object) -> str:
    text = path if isinstance(path, str) else repr(path)
    if len(text) > 300:
        text = text[:150] + "…" + text[-100:]
    return mask_tokens(repr(text) if isinstance(path, str) else text)


def _reason(exc: BaseException) -> str:
    """What went wrong, without the path: the OS's words for an ``OSError``, else the exception's type."""
    if isinstance(exc, OSError) and exc.strerror:
        return str(exc.strerror)
    return type(exc).__name__


def _scrubbed(exc: BaseException) -> BaseException:
    """A copy of ``exc`` fit to chain as a cause: an ``OSError``'s file names are masked (they hold the token)."""
    if isinstance(exc, OSError):
        copy = type(exc)(exc.errno, exc.strerror or type(exc).__name__)
        copy.filename = None if exc.filename is None else _show(exc.filename)
        copy.filename2 = None if exc.filename2 is None else _show(exc.filename2)
        return copy
    return type(exc)(mask_tokens(str(exc))) if isinstance(exc, ValueError) else RuntimeError(type(exc).__name__)


def _inside(real: str, base: str) -> bool:
    if real == base:
        return False
    try:
        return os.path.commonpath([real, base]) == base
    except ValueError:  # different drives, or mixed absolute and relative
        return False


class LocalFiles:
    """Resolves and opens ``file_path`` values from a local Bot API server inside ``bot_directory`` (which need
    not exist yet; a non-path raises :class:`~telegram_fence.errors.ConfigurationError`). ``bot`` is the default
    for :meth:`open`. Only reads the file system; safe to share between threads."""

    def __init__(self, bot_directory: str | os.PathLike[str], *, bot: Any = None) -> None:
        if isinstance(bot_directory, bytes) or not isinstance(bot_directory, (str, os.PathLike)):
            raise ConfigurationError(f"bot_directory must be a str or path-like; got {type(bot_directory).__name__}")
        raw = os.fspath(bot_directory)
        if not isinstance(raw, str) or not raw or "\x00" in raw:
            raise ConfigurationError(f"bot_directory must be a non-empty path without NUL bytes; got {_show(raw)}")
        self._directory = os.path.abspath(raw)
        self._bot = bot

    @property
    def directory(self) -> Path:
        """The bot directory (made absolute, symlinks not resolved)."""
        return Path(self._directory)

    def check(self) -> DirectoryCheck:
        """Whether the bot directory exists, is a directory and can be read; ``reason`` names the first problem
        (tokens masked). Never raises."""
        shown = mask_tokens(self._directory)

        def fail(reason: str) -> DirectoryCheck:
            return DirectoryCheck(False, f"{shown}: {reason}", self._directory)

        try:
            if not os.path.lexists(self._directory):
                return fail("does not exist")
            if not os.path.exists(self._directory):
                return fail("is a symlink to something that does not exist")
            real = os.path.realpath(self._directory)
            if not os.path.isdir(real):
                return fail("is not a directory")
            if not os.access(real, os.R_OK | os.X_OK):
                return fail("is not readable by this process (permission denied)")
            with os.scandir(real) as entries:
                next(entries, None)
        except OSError as exc:
            return fail(f"cannot be read: {exc.strerror or type(exc).__name__}")
        return DirectoryCheck(True, "ok", self._directory)

    def resolve(self, file_path: object) -> Path:
        """The real path of ``file_path`` (relative: to the bot directory), a regular file inside the bot directory;
        else :class:`~telegram_fence.errors.FileAccessRefused` naming why, no message or cause holding a token."""
        real, _base, _st = self._resolve(file_path)
        return Path(real)

    def _resolve(self, file_path: object) -> tuple[str, str, os.stat_result]:
        if not isinstance(file_path, str):
            raise FileAccessRefused(f"file_path must be a string; got {type(file_path).__name__}")
        shown = _show(file_path)
        if not file_path:
            raise FileAccessRefused("file_path is empty")
        if "\x00" in file_path:
            raise FileAccessRefused(f"file_path {shown} contains a NUL byte")
        if ".." in PurePath(file_path).parts:
            raise FileAccessRefused(f"file_path {shown} contains a '..' component")
        try:
            base = os.path.realpath(self._directory)
            candidate = file_path if os.path.isabs(file_path) else os.path.join(base, file_path)
            real = os.path.realpath(candidate)
        except (OSError, ValueError, RecursionError) as exc:
            # e.g. a symlink on the path removed or replaced between realpath's lstat and its readlink
            raise FileAccessRefused(
                f"file_path {shown} changed while it was being resolved ({_reason(exc)}); ask getFile again"
            ) from _scrubbed(exc)
        if not _inside(real, base):
            raise FileAccessRefused(
                f"file_path {shown} resolves to {_show(real)}, outside the bot directory {_show(base)}"
            )
        try:
            st = os.stat(real)
        except FileNotFoundError:
            raise FileAccessRefused(f"file_path {shown} does not exist") from None
        except (OSError, ValueError) as exc:
            raise FileAccessRefused(f"file_path {shown} cannot be read: {_reason(exc)}") from _scrubbed(exc)
        if not stat.S_ISREG(st.st_mode):
            raise FileAccessRefused(f"file_path {shown} is not a regular file")
        return real, base, st

    def open(self, file_id: str, bot: Any = None) -> BinaryIO:
        """``getFile`` (through ``bot``, else the constructor's) and open that file for binary reading: exactly the
        file :meth:`resolve` approved (one swapped in after the check raises
        :class:`~telegram_fence.errors.FileAccessRefused`); a failed ``getFile`` raises its ``TelegramError``."""
        if not isinstance(file_id, str) or not file_id:
            raise ConfigurationError(f"file_id must be a non-empty string; got {file_id!r}")
        bot = bot if bot is not None else self._bot
        if bot is None or not callable(getattr(bot, "get_file", None)):
            raise ConfigurationError("open() needs a bot: pass bot=... here or to LocalFiles(..., bot=...)")
        info = call("getFile", bot.get_file, file_id)
        file_path = getattr(info, "file_path", None)
        if not file_path:
            raise FileAccessRefused(f"getFile for {file_id!r} answered without a file_path")
        return self.open_path(file_path)

    def open_path(self, file_path: object) -> BinaryIO:
        """Open ``file_path`` (as :meth:`resolve` judges it) for binary reading; same refusals as :meth:`open`."""
        real, base, st = self._resolve(file_path)
        shown = _show(file_path)
        try:
            fd = self._open_fd(real, base)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                reason = "a symlink appeared on its path between the check and the open"
            elif exc.errno == errno.ENOENT:
                reason = "disappeared between the check and the open"
            else:
                reason = f"could not be opened: {_reason(exc)}"
            raise FileAccessRefused(f"file_path {shown}: {reason}") from _scrubbed(exc)
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                raise FileAccessRefused(f"file_path {shown} changed between the check and the open")
            if _O_NONBLOCK:
                os.set_blocking(fd, True)
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _open_fd(real: str, base: str) -> int:
        flags = os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW | _O_NONBLOCK
        if not _WALK_BENEATH:
            return os.open(real, flags)
        # Walk down from the bot directory one component at a time, refusing symlinks on the way,
        # so nothing swapped in after the realpath check can lead outside.
        parts = os.path.relpath(real, base).split(os.sep)
        dir_fd = os.open(base, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        try:
            for part in parts[:-1]:
                next_fd = os.open(part, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dir_fd)
                os.close(dir_fd)
                dir_fd = next_fd
            return os.open(parts[-1], flags, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
