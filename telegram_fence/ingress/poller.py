"""The poller: one thread that long-polls ``getUpdates`` and records each batch before confirming it.

Telegram confirms a batch when the next ``getUpdates`` carries a higher ``offset``: the poller asks with the cursor
it read from the store when it began leading, raised only by batches the store committed. It ends (saying why, once,
through ``on_end``) on a revoked token, a 409 lasting ``conflict_grace``, or a failure it cannot classify as
passing. Also here: :class:`Admission` (``Fence.pause``/``resume``) and :func:`screen`/:func:`unauthorized`."""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from telebot import apihelper

from .. import errors, telegram
from ..errors import Conflict, LeadershipLost, RetryAfter, SchemaError, StoreCorrupt, TelegramError, Unauthorized
from ..retry import poll_backoff, retry_after_wait
from ..store import UpdateStore
from ..store.contract import PollLeadership
from ..textlog import IN_MESSAGE
from ..updates import UnreadableUpdate
from .long_poll import LongPoll, UpdateBatch, get_updates

__all__ = ["Admission", "Poller", "screen", "unauthorized"]

log = logging.getLogger("telegram_fence.poller")

#: How long the poller waits for the poll leadership while the database cannot be reached before it ends.
LEAD_FAILURE_LIMIT = 60.0
_CANNOT_LEAD = "cannot take the poll leadership"
#: Update ids at or above this are not Telegram's, and could not be stored with the offset after them.
MAX_UPDATE_ID = 2**62


class Admission:
    """Whether the application accepts work; the poller waits for it before every long poll. Thread-safe."""

    def __init__(self, accepting: bool = True) -> None:
        self._cv = threading.Condition()
        self.accepting = accepting
        self._stopping = False

    def set(self, accepting: bool) -> None:
        with self._cv:
            self.accepting = accepting
            self._cv.notify_all()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()

    def wait(self) -> bool:
        """Block until accepting (``True``) or stopping (``False``)."""
        with self._cv:
            self._cv.wait_for(lambda: self.accepting or self._stopping)
            return not self._stopping


def screen(batch: Sequence[Any], offset: int) -> list[Mapping[str, Any]]:
    """The items of ``batch`` (asked for with ``offset``) to record, in order: the updates the store can keep,
    without replays below ``offset`` (only a faulty proxy sends them, and their rows may be pruned already).
    What is dropped is logged."""
    valid = [u for u in batch if (type(u) is dict or isinstance(u, Mapping))
             and type(u.get("update_id")) is int and 0 <= u["update_id"] < MAX_UPDATE_ID]
    if len(valid) != len(batch):
        log.error("getUpdates answered items without a usable update_id (an integer below 2**62); "
                  "they cannot be stored", extra={"dropped": len(batch) - len(valid)})
    fresh = [u for u in valid if u["update_id"] >= offset] if offset > 0 else valid
    if len(fresh) != len(valid):
        log.warning("getUpdates answered updates below the offset it was sent; dropped as replays",
                    extra={"offset": offset, "dropped": len(valid) - len(fresh)})
    return fresh


def unauthorized(updates: Sequence[Mapping[str, Any]], authorize: Callable[[Any], bool] | None) -> Collection[int]:
    """The ids among ``updates`` that ``authorize`` refuses (stored as skipped); one that raises refuses (logged).
    An :class:`~telegram_fence.updates.UnreadableUpdate` is never asked about (the store keeps it as an exhaustion)."""
    if authorize is None:
        return ()
    skip = set()
    for update in updates:
        if isinstance(update, UnreadableUpdate):
            continue
        try:
            allowed = bool(authorize(update))
        except Exception as exc:
            log.error("authorize() raised; the update is skipped", extra={"update_id": update["update_id"], "err": exc})
            allowed = False
        if not allowed:
            skip.add(update["update_id"])
    return skip


class Poller:
    """Runs the ``getUpdates`` → ``record`` loop on the ``fence-poller`` thread. ``record``/``write(fn)``: the
    fence's writer (a batch; the generation's writes in ``store``); ``leadership``: only its holder polls.
    ``call_started`` (monotonic, or ``None``) shows a call in progress."""

    def __init__(self, *, token: str, store: UpdateStore, admission: Admission, stop: threading.Event,
                 on_end: Callable[[str], None], record: Callable[..., int],
                 write: Callable[[Callable[[], Any]], Any], long_poll_timeout: float = 25.0,
                 allowed_updates: Sequence[str] | None = None, authorize: Callable[[Any], bool] | None = None,
                 on_record: Callable[..., None] | None = None, conflict_grace: float = 60.0,
                 leadership: PollLeadership | None = None, read_timeout: float | None = None,
                 skip_pending: bool = False) -> None:
        self._token, self._store, self._admission, self._stop, self._on_end = token, store, admission, stop, on_end
        self._record_batch, self._write = record, write
        self._long_poll, self._read_timeout, self._allowed = long_poll_timeout, read_timeout, allowed_updates
        self._authorize, self._on_record = authorize, on_record
        self._conflict_grace, self._leadership = conflict_grace, leadership
        self._skip_pending = skip_pending  # drop what waits at Telegram, once, on a store with no cursor yet
        self._connection: LongPoll | None = None
        self._cursor = 0  # the offset to ask with: never lowered
        self._reread = True  # read the stored cursor before the next poll (at the start, after leading anew)
        self.call_started: float | None = None
        self.generation: int | None = None
        self.polls = self.recorded = 0
        self.last_error: str | None = None
        self._progress_at: float | None = None  # monotonic: started, Telegram answered, or a leadership check did
        self._unled: str | None = None  # why waiting for the poll leadership ended the poller
        self._thread = threading.Thread(target=self._run, name="fence-poller", daemon=True)

    def start(self) -> None:
        """Take a new generation, its progress marked (one write), before starting the thread."""
        self._progress_at = time.monotonic()
        store = self._store

        def begin() -> int:
            generation = int(store.begin_generation())
            try:
                store.mark_progress(generation)  # a start is progress: health may not fail before a poll
            except Exception:
                log.warning("could not record poller progress in the store", exc_info=True)
            return generation

        self.generation = int(self._write(begin))
        log.info("poller started", extra={"generation": self.generation})
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; ``False`` when it is still inside a long poll after ``timeout``."""
        if self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def interrupt(self) -> None:
        """End a long poll in flight on the poller's own connection (after the stop signal is set): what it was
        reading is neither recorded nor confirmed. Safe from any thread, a signal handler included."""
        connection = self._connection
        if connection is not None:
            connection.abort()

    def finish(self, deadline: float, log: logging.Logger = log) -> bool:
        """Interrupt and wait for the thread until ``deadline`` (monotonic); ``True`` when it ended or is left in a
        call through telebot (which cannot be interrupted; nothing it returns is recorded), ``False`` (logged)."""
        self.interrupt()
        while not self.join(min(0.05, max(0.0, deadline - time.monotonic()))):
            if self._connection is None and self.call_started is not None:
                log.info("leaving the poller's getUpdates (sent through telebot) to run out; "
                         "nothing it returns is recorded or confirmed")
                return True
            if time.monotonic() >= deadline:
                log.warning("the poller did not end within the shutdown bound; abandoning it "
                            "(nothing unrecorded is confirmed)")
                return False
        return True

    @property
    def leading(self) -> bool:
        """Whether this process may poll now (always without a poll leadership)."""
        return self._leadership is None or bool(self._leadership.held)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stats(self) -> dict[str, Any]:
        """What ``Fence.stats()`` shows of the poller."""
        started = self.call_started
        return {"alive": self.alive, "generation": self.generation, "polls": self.polls, "recorded": self.recorded,
                "in_call_for": None if started is None else time.monotonic() - started,
                "progress_age": self.progress_age, "last_error": self.last_error, "leading": self.leading}

    @property
    def progress_age(self) -> float | None:
        """Seconds since the start, the last answered ``getUpdates`` or (while another process leads) leadership
        check; ``None`` before the start."""
        at = self._progress_at
        return None if at is None else max(0.0, time.monotonic() - at)

    def _run(self) -> None:
        if telegram.direct_polling_allowed():
            self._connection = LongPoll(float(apihelper.CONNECT_TIMEOUT or 15))
        try:
            reason = self._loop()
        except (StoreCorrupt, SchemaError) as exc:  # asking Telegram for the same batch again cannot fix these
            log.critical("the poller cannot record: %s", exc)
            reason = f"fence-poller cannot record: {type(exc).__name__}: {exc}"
        except BaseException as exc:  # a bug must end the poller loudly, never silently
            log.critical("poller crashed", exc_info=True)
            reason = f"poller crashed: {exc!r}"
        finally:
            if self._connection is not None:
                self._connection.close()
            if self._leadership is not None:
                self._leadership.release()
        if reason is not None:
            reason = telegram.mask_tokens(reason)
            self.end_generation(reason)
            self._on_end(reason)

    def end_generation(self, reason: str) -> None:
        """Record that this generation ended for ``reason`` (the first one stays); failures are logged."""
        store, generation = self._store, self.generation
        if generation is not None:
            self._generation_write(lambda: store.end_generation(generation, reason), "the poller's end")

    def _generation_write(self, fn: Callable[[], Any], what: str) -> None:
        try:
            self._write(fn)
        except Exception:
            log.warning("could not record %s in the store", what, exc_info=True)

    def _wait(self, seconds: float) -> bool:
        """Wait ``seconds`` unless stopped; ``True`` when the wait ran out."""
        return not self._stop.wait(max(0.0, seconds))

    def _loop(self) -> str | None:
        failures = 0
        conflict_since: float | None = None
        while not self._stop.is_set() and self._admission.wait():
            if not self._lead():
                return self._unled
            if self._reread:
                try:
                    self._cursor = max(self._cursor, self._store.next_offset())
                    self._reread = False
                except Exception as exc:  # the store is busy or away for a moment: the poller outlives it
                    failures += 1
                    self.last_error = telegram.mask_tokens(repr(exc))
                    log.error("reading the cursor failed; retrying", extra={"failures": failures, "err": exc})
                    if not self._wait(poll_backoff(failures)):
                        break
                    continue
            # skip_pending on a database that never polled: offset -1 makes Telegram forget everything before
            # its newest update and answer that one, which is stored and handled (as telebot's skip_pending does).
            skipping = self._skip_pending = self._skip_pending and self._cursor == 0
            offset = -1 if skipping else self._cursor
            self.call_started = time.monotonic()
            error: TelegramError | None = None
            try:
                batch = get_updates(self._token, offset, limit=1 if skipping else 100,
                                    long_poll_timeout=0 if skipping else self._long_poll,
                                    allowed_updates=self._allowed, connection=self._connection,
                                    read_timeout=self._read_timeout)
            except TelegramError as exc:
                batch, error = [], exc
            finally:
                self.call_started = None
            if self._stop.is_set():
                break  # the stop came during the call: nothing of it is recorded (so nothing confirmed)
            if error is None:
                failures, conflict_since = 0, None
                self.polls += 1
                if skipping:
                    log.info("skip_pending: Telegram dropped the updates waiting for this bot but the newest (the "
                             "first start of this database); the newest, if any, is handled",
                             extra={"skipped": [u.get("update_id") for u in batch if isinstance(u, Mapping)]})
                if self._record(batch, offset, skip_all=skipping):
                    continue
                failures += 1
                wait = poll_backoff(failures)
            elif isinstance(error, RetryAfter):
                self.last_error = str(error)
                wait = retry_after_wait(error.seconds)
                log.warning("getUpdates rate limited; waiting", extra={"retry_after": error.seconds, "wait": wait})
            elif isinstance(error, Unauthorized):
                return f"Telegram refused the bot token (401 Unauthorized: {error.description}); get a valid token"
            elif isinstance(error, Conflict):
                from .webhook_guard import webhook_conflict  # this rare path only: polling bots never load it

                webhook = webhook_conflict(self._token)  # a registered webhook is no passing conflict
                if webhook is not None:
                    return webhook
                now = time.monotonic()
                conflict_since = conflict_since or now
                self.last_error = str(error)
                if now - conflict_since >= self._conflict_grace:
                    return (f"another poller or a webhook kept this token for {now - conflict_since:.0f} s "
                            f"(409 Conflict: {error.description}); stop the other instance or delete the webhook")
                failures += 1
                left = max(0.0, self._conflict_grace - (now - conflict_since))
                log.warning("getUpdates conflict (409): another instance is polling with this bot token; retrying, "
                            "this poller ends if it goes on for %.0f s more", left,
                            extra={"failures": failures, "conflict_left": left, IN_MESSAGE: ("conflict_left",)})
                wait = poll_backoff(failures)
            elif isinstance(error, (errors.Transient, errors.Ambiguous)):
                failures += 1
                self.last_error = str(error)
                log.warning("getUpdates at %s failed; retrying", _server(), extra={"failures": failures, "err": error})
                wait = poll_backoff(failures)
            else:
                return f"getUpdates failed in a way that retrying cannot fix: {error}"
            if not self._wait(wait):
                break
        return None

    def _lead(self) -> bool:
        """Wait until this process leads the polling (``True``; the stored cursor is read again then) or must end
        (``False``: stopping, or the database unreachable for :data:`LEAD_FAILURE_LIMIT` s: ``self._unled``)."""
        leadership = self._leadership
        if leadership is None or leadership.held:
            return True
        log.info("waiting for poll leadership")
        self._reread = True  # another process may have recorded meanwhile
        failing_since: float | None = None
        while not self._stop.is_set():
            acquired = leadership.acquire(timeout=1.0)
            error = leadership.last_error
            if error is None:
                failing_since = None
                self._progress_at = time.monotonic()  # leadership is known: this process leads, or another does
                if self.last_error is not None and self.last_error.startswith(_CANNOT_LEAD):
                    self.last_error = None
            else:
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                self.last_error = f"{_CANNOT_LEAD}: {error}"
                if now - failing_since >= LEAD_FAILURE_LIMIT:
                    self._unled = f"{_CANNOT_LEAD} for {LEAD_FAILURE_LIMIT:g} s (the database could not be " \
                                  f"reached): {error}"
                    return False
            if acquired:
                log.info("leading the polling", extra={"epoch": leadership.epoch})
                return True
        return False

    def _record(self, batch: list[Any], offset: int, *, skip_all: bool = False) -> bool:
        """Record ``batch``; ``True`` on success (or an empty batch), ``False`` to ask the same offset again after a
        backoff (the record failed, or nothing in the batch can be stored).
        ``skip_all``: the batch answers the skip_pending call."""
        if not batch:  # an empty long poll is progress: Telegram answered, nothing was waiting
            self._progress_at = time.monotonic()
            store, generation = self._store, self.generation
            if generation is not None:
                self._generation_write(lambda: store.mark_progress(generation), "poller progress")
            self._skip_pending = self._skip_pending and not skip_all
            return True
        valid = screen(batch, offset)
        if not valid:  # a faulty proxy: asking again at once would spin, so back off as after a failed record
            self.last_error = "getUpdates answered no update that can be stored"
            return False
        next_offset = max(offset, max(u["update_id"] for u in valid) + 1)
        # body: the payloads as Telegram sent them, nothing to encode again
        body = batch.body if isinstance(batch, UpdateBatch) and len(valid) == len(batch) else None
        try:
            new = self._record_batch(valid, next_offset, skip=unauthorized(valid, self._authorize),
                                     generation=self.generation, on_record=self._on_record, body=body)
        except LeadershipLost as exc:  # another process leads now: stop polling until leading again
            self.last_error = str(exc)
            log.warning("poll leadership lost; the batch in hand was not recorded (the new leader fetches it)",
                        extra={"epoch": exc.epoch, "current": exc.current})
            if self._leadership is not None:
                self._leadership.release()
            self._reread = True
            return True
        except (StoreCorrupt, SchemaError):
            raise  # a damaged or unusable database: the poller ends with the reason (see _run)
        except Exception as exc:
            self.last_error = telegram.mask_tokens(repr(exc))
            log.error("recording a batch failed; the same offset will be asked again",
                      extra={"offset": offset, "err": exc})
            self._reread = True  # it may have committed before it failed
            return False
        self.recorded += new
        self._progress_at = time.monotonic()
        self._skip_pending = self._skip_pending and not skip_all
        self._cursor = max(self._cursor, next_offset)
        return True


def _server() -> str:
    """``host[:port]`` of the Bot API server (never the token)."""
    try:
        return urllib.parse.urlsplit(telegram.api_url("TOKEN", "getUpdates")).netloc or "the Bot API server"
    except ValueError:
        return "the Bot API server"
