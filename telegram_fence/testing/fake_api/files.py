"""Files of the fake Bot API: ``getFile``, uploads and downloads, hosted (in memory) or local (``--local``: absolute
paths under ``local_dir``).
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ConfigurationError
from .answers import ApiError
from .records import UploadedFile

__all__ = ["FileStore", "StoredFile"]


@dataclass
class StoredFile:
    """One file ``getFile`` knows."""

    file_id: str
    file_unique_id: str
    file_path: str
    content: bytes | None  # None: on disk (local mode)


class FileStore:
    """The files the fake knows, by id and by path. Thread-safe: every method takes ``cond``."""

    def __init__(self, cond: threading.Condition, bot_id: int, local_dir: Path | None) -> None:
        self.cond = cond
        self.bot_id = bot_id
        self.local_dir = local_dir
        self._by_id: dict[str, StoredFile] = {}
        self._by_path: dict[str, StoredFile] = {}
        self._seq = itertools.count(1)

    def add(self, file_id: str | None, path: str | os.PathLike[str], content: bytes | None) -> str:
        """``FakeBotAPI.add_file``: make ``getFile(file_id)`` answer ``path``; returns the file id."""
        raw = Path(path)
        if self.local_dir is not None:
            full = raw if raw.is_absolute() else self.local_dir / raw
            if content is not None:
                full.parent.mkdir(parents=True, exist_ok=True)
                full.write_bytes(content)
            file_path, stored = str(full), None
        else:
            if raw.is_absolute():
                raise ConfigurationError(
                    f"path {str(path)!r} is absolute, but absolute file paths exist only in local mode "
                    "(FakeBotAPI(local_dir=...))"
                )
            file_path, stored = raw.as_posix(), content or b""
        return self._register(file_id, file_path, stored)

    def _register(self, file_id: str | None, file_path: str, content: bytes | None) -> str:
        with self.cond:
            seq = next(self._seq)
            file_id = file_id or f"FAKE-FILE-{self.bot_id}-{seq}"
            record = StoredFile(file_id, f"U{seq:06d}", file_path, content)
            self._by_id[file_id] = record
            self._by_path[file_path] = record
            return file_id

    def keep_upload(self, media: UploadedFile, field_name: str) -> tuple[str, str, int]:
        """Keep an uploaded photo or document; returns ``(file_id, file name, size)``."""
        folder = "photos" if field_name == "photo" else "documents"
        with self.cond:
            name = media.filename or f"file_{next(self._seq)}"
            rel = f"{folder}/{next(self._seq)}_{Path(name).name}"
        if self.local_dir is not None:
            full = self.local_dir / rel
            full.parent.mkdir(parents=True, exist_ok=True)
            full.write_bytes(media.content)
            file_id = self._register(None, str(full), None)
        else:
            file_id = self._register(None, rel, media.content)
        return file_id, name, len(media.content)

    def name_of(self, file_id: str) -> str:
        """The base name of a known file, ``"file"`` for an unknown id (sent by id, as Telegram allows)."""
        with self.cond:
            record = self._by_id.get(file_id)
        return Path(record.file_path).name if record else "file"

    def get_file(self, params: dict[str, Any]) -> Any:
        """``getFile``: the ``File`` object of ``file_id``; raises the 400 for an unknown id."""
        file_id = str(params.get("file_id") or "")
        with self.cond:
            record = self._by_id.get(file_id)
        if record is None:
            raise ApiError(400, "Bad Request: invalid file_id")
        if record.content is not None:
            size = len(record.content)
        else:
            try:
                size = os.path.getsize(record.file_path)
            except OSError:
                size = 0
        return {
            "file_id": record.file_id,
            "file_unique_id": record.file_unique_id,
            "file_size": size,
            "file_path": record.file_path,
        }

    def content_at(self, file_path: str) -> bytes | None:
        """The content served for a download of ``file_path``; None if unknown or on disk (local mode)."""
        with self.cond:
            record = self._by_path.get(file_path)
        return None if record is None else record.content
