"""Request routing of the fake Bot API: records the call, applies latency and faults, checks the token."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .answers import ApiError, Response, error_response, ok_response, retry_header
from .chats import Chats
from .faults import FaultScript
from .methods import Handler
from .records import Call, Records
from .server import Drop, parse_body
from .updates import UpdateQueue

__all__ = ["Dispatcher"]

class Dispatcher:
    """Answers requests (a :data:`~.server.Dispatch` callable). Thread-safe: called from every connection
    thread at once; shared state lives in the helpers it was given, each guarded by ``cond``.
    """

    def __init__(
        self,
        *,
        token: str,
        cond: threading.Condition,
        stopping: threading.Event,
        records: Records,
        faults: FaultScript,
        chats: Chats,
        updates: UpdateQueue,
        handlers: dict[str, Handler],
    ) -> None:
        self.token = token
        self.cond = cond
        self.stopping = stopping
        self.records = records
        self.faults = faults
        self.chats = chats
        self.updates = updates
        self.handlers = {name.lower(): handler for name, handler in handlers.items()}

    def add(self, name: str, handler: Handler) -> None:
        """Answer ``name`` (any case, as Telegram matches) with ``handler`` from now on, replacing a built-in one.

        The table is replaced, never changed in place, so requests being routed meanwhile see the old or the new.
        """
        with self.cond:
            self.handlers = {**self.handlers, name.lower(): handler}

    def __call__(self, raw_path: str, headers: Any, body: bytes, conn: Any = None) -> Response:
        """Answer one request; raises :class:`~.server.Drop` to hang up without an answer."""
        split = urlsplit(raw_path)
        path = unquote(split.path)
        if not path.startswith("/bot") or "/" not in path[4:]:
            return error_response(ApiError(404, "Not Found"))
        token, _, method = path[4:].partition("/")
        key = method.lower()
        try:
            params: dict[str, Any] = dict(parse_qsl(split.query, keep_blank_values=True))
            params.update(parse_body(headers.get("Content-Type") or "", body))
        except ApiError as exc:
            return error_response(exc)
        self.records.add_call(Call(method, params, time.time()))
        latency = self.faults.latency_of(key)
        try:
            if latency:
                self.stopping.wait(latency)
            fault = self.faults.take(key)
            if fault is not None:
                if fault.kind == "delay":
                    self.stopping.wait(fault.seconds)
                elif fault.kind == "malformed":
                    return 200, fault.body, "text/html; charset=utf-8", []
                elif fault.kind == "fail":
                    error = ApiError(fault.status, fault.description, fault.retry_after)
                    if fault.html:
                        page = f"<html><body><h1>{fault.status} {fault.description}</h1></body></html>"
                        return fault.status, page.encode(), "text/html; charset=utf-8", retry_header(error)
                    return error_response(error)
                elif fault.kind == "drop":
                    if fault.executed:
                        with contextlib.suppress(ApiError):
                            self._execute(token, key, params, conn)
                    raise Drop
            result = self._execute(token, key, params, conn)
        except ApiError as exc:
            return error_response(exc)
        finally:
            with self.cond:
                self.cond.notify_all()
        return ok_response(result)

    def _execute(self, token: str, key: str, params: dict[str, Any], conn: Any) -> Any:
        if token != self.token or self.chats.revoked:
            raise ApiError(401, "Unauthorized")
        if key == "getupdates":
            return self.updates.get_updates(params, conn)
        handler = self.handlers.get(key)
        if handler is None:
            raise ApiError(404, "Not Found")
        return handler(params)
