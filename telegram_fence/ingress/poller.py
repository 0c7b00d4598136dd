"""The poller: one thread that long-polls ``getUpdates`` and records each batch before confirming it.

Telegram confirms a batch when the next ``getUpdates`` carries a higher ``offset``. The poller
reads that offset from the store, so it only ever confirms what the store holds: if recording a
batch fails, the cursor stays and the same offset is asked again.

The poller ends (and says why, once, through ``on_end``) on a revoked token, on another instance
holding the token for longer than ``conflict_grace``, or on a failure it cannot classify as
passing. It never recovers in-process from an end: the fence shuts down and exits non-zero, and a
supervisor (systemd, Docker) restarts it.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from telebot import apihelper

from .. import telegram
from ..errors import (
    Ambiguous,
    Conflict,
    LeadershipLost,
    RetryAfter,
    SchemaError,
    StoreCorrupt,
    TelegramError,
    Transient,
    Unauthorized,
)
from ..retry import poll_backoff, retry_after_wait
from ..store import UpdateStore
from ..store.contract import PollLeadership
from ..textlog import IN_MESSAGE
from .admission import Admission
from .long_poll import LongPoll, UpdateBatch, get_updates
from .screening import screen, unauthorized

__all__ = ["Poller"]

log = logging.getLogger("telegram_fence.poller")

#: How long the poller waits for the poll leadership while the database cannot be reached before it ends (with
#: the reason, so the fence ends too): a poller that cannot lead says so in ``last_error`` at once, and gives up
#: after this bound instead of looking alive forever.
LEAD_FAILURE_LIMIT = 60.0
_CANNOT_LEAD = "cannot take the poll leadership"


class Poller:
    """Runs the ``getUpdates`` → ``record`` loop on a thread named ``fence-poller``.

    Not meant to be shared: the fence owns one. ``call_started`` (monotonic seconds, or ``None``)
    tells the watchdog whether a call is in progress and since when. ``write(fn)`` runs the generation's store
    writes (begin, progress, end; the fence passes its pool's writer, so they are the dispatcher's while it runs);
    without it they run on the calling thread. The backlog waits in the store and at Telegram: the poller fetches
    whenever the last batch is recorded.
    """

    def __init__(
        self,
        *,
        token: str,
        store: UpdateStore,
        admission: Admission,
        stop: threading.Event,
        on_end: Callable[[str], None],
        long_poll_timeout: float = 25.0,
        allowed_updates: Sequence[str] | None = None,
        authorize: Callable[[Any], bool] | None = None,
        on_record: Callable[..., None] | None = None,
        conflict_grace: float = 60.0,
        record: Callable[..., int] | None = None,
        leadership: PollLeadership | None = None,
        monitored: UpdateStore | None = None,
        accepts_body: bool = False,
        read_timeout: float | None = None,
        skip_pending: bool = False,
        write: Callable[[Callable[[], Any]], Any] | None = None,
    ) -> None:
        self._token = token
        self._store = store
        self._admission = admission
        self._stop = stop
        self._record_batch = record or store.record
        self._on_end = on_end
        self._long_poll = long_poll_timeout
        self._allowed = allowed_updates
        self._authorize = authorize
        self._on_record = on_record
        self._conflict_grace = conflict_grace
        self._leadership = leadership  # several processes on one database: only the leader polls
        self._monitored = monitored  # the store's generations, or None
        self._write: Callable[[Callable[[], Any]], Any] = write or (lambda fn: fn())
        self._accepts_body = accepts_body
        self._read_timeout = read_timeout
        self._skip_pending = skip_pending  # drop what waits at Telegram, once, on a store with no cursor yet
        self._connection: LongPoll | None = None
        self.call_started: float | None = None
        self.generation: int | None = None
        self.polls = 0
        self.recorded = 0
        self.last_error: str | None = None
        self._progress_at: float | None = None  # monotonic: started, Telegram answered, or a leadership check did
        self._unled: str | None = None  # why waiting for the poll leadership ended the poller
        self._recorded_offset = 0  # the cursor it asks with never goes below it
        self._thread = threading.Thread(target=self._run, name="fence-poller", daemon=True)


    def start(self) -> None:
        """Take a new generation (before returning, so ``stats()`` never shows an older one as current after
        ``start`` returned; written through ``write``, the pool's writer) and start the thread."""
        self._progress_at = time.monotonic()
        monitored = self._monitored
        if monitored is not None:
            self.generation = int(self._write(lambda: _begin_generation(monitored)))
            log.info("poller started", extra={"generation": self.generation})
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; ``False`` when it is still inside a long poll after ``timeout``."""
        if self._thread.ident is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def interrupt(self) -> None:
        """End a long poll in flight on the poller's own connection (after the stop signal is set); what it was
        reading is neither recorded nor confirmed. A call through telebot (a proxy) runs out and records nothing.
        Safe from any thread, a signal handler included."""
        connection = self._connection
        if connection is not None:
            connection.abort()

    def finish(self, deadline: float, log: logging.Logger = log) -> bool:
        """Interrupt and wait for the thread until ``deadline`` (monotonic); ``True`` when it ended or is left in a
        call through telebot (it records nothing once it returns), ``False`` (logged) when abandoned."""
        self.interrupt()
        while not self.join(min(0.05, max(0.0, deadline - time.monotonic()))):
            if not self.interruptible and self.call_started is not None:
                log.info("leaving the poller's getUpdates (sent through telebot) to run out; "
                         "nothing it returns is recorded or confirmed")
                return True
            if time.monotonic() >= deadline:
                log.warning("the poller did not end within the shutdown bound; abandoning it "
                            "(nothing unrecorded is confirmed)")
                return False
        return True

    @property
    def interruptible(self) -> bool:
        """Whether :meth:`interrupt` can end a call in progress (the poller uses its own connection)."""
        return self._connection is not None

    @property
    def leading(self) -> bool:
        """Whether this process may poll now (always without a poll leadership)."""
        return self._leadership is None or bool(self._leadership.held)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def progress_age(self) -> float | None:
        """Seconds since the start, the last answered ``getUpdates`` or, while another process leads, the last
        answered leadership check (``None`` before the start)."""
        at = self._progress_at
        return None if at is None else max(0.0, time.monotonic() - at)


    def _run(self) -> None:
        if telegram.direct_polling_allowed():
            self._connection = LongPoll(float(apihelper.CONNECT_TIMEOUT or 15))
        try:
            reason = self._loop()
        except (StoreCorrupt, SchemaError) as exc:  # asking Telegram for the same batch again cannot fix these
            log.critical("the poller cannot record: %s", exc)
            reason = f"fence-poller cannot record: {type(exc).__name__}: {telegram.mask_tokens(str(exc))}"
        except BaseException as exc:  # a bug must end the poller loudly, never silently
            log.critical("poller crashed", exc_info=True)
            reason = f"poller crashed: {telegram.mask_tokens(repr(exc))}"
        finally:
            if self._connection is not None:
                self._connection.close()
            if self._leadership is not None:
                self._leadership.release()
        if reason is not None:
            self._end(reason)

    def _end(self, reason: str) -> None:
        reason = telegram.mask_tokens(reason)
        self.end_generation(reason)
        self._on_end(reason)

    def end_generation(self, reason: str) -> None:
        """Record that this generation ended for ``reason`` (the first one stays); failures are logged, not raised."""
        generation, monitored = self.generation, self._monitored
        if generation is not None and monitored is not None:
            try:
                self._write(lambda: monitored.end_generation(generation, reason))
            except Exception:
                log.warning("could not record the poller's end in the store", exc_info=True)

    def _mark_progress(self) -> None:
        """Record that this generation is alive and polling now (best effort)."""
        self._progress_at = time.monotonic()
        generation, monitored = self.generation, self._monitored
        if generation is not None and monitored is not None:
            try:
                self._write(lambda: monitored.mark_progress(generation))
            except Exception:
                log.warning("could not record poller progress", exc_info=True)

    def _wait(self, seconds: float) -> bool:
        """Wait ``seconds`` unless stopped; ``True`` when the wait ran out (keep going)."""
        return not self._stop.wait(max(0.0, seconds))

    def _loop(self) -> str | None:
        failures = 0
        conflict_since: float | None = None
        while not self._stop.is_set():
            if not self._admission.wait():
                break
            if not self._lead():
                return self._unled
            try:
                stored = self._store.next_offset()
            except Exception as exc:  # the store is busy or away for a moment: the poller outlives it
                failures += 1
                self.last_error = telegram.mask_tokens(repr(exc))
                log.error("reading the cursor failed; retrying", extra={"failures": failures, "err": exc})
                if not self._wait(poll_backoff(failures)):
                    break
                continue
            # Never ask below what this poller already saw recorded, whatever the store answers.
            offset = max(stored, self._recorded_offset)
            # skip_pending on a database that never polled: offset -1 makes Telegram forget everything before
            # its newest update and answer that one, which is stored and handled (as telebot's skip_pending does).
            skipping = self._skip_pending and offset == 0
            if skipping:
                offset = -1
            elif self._skip_pending:
                self._skip_pending = False  # a cursor is stored: this database polled before, nothing is dropped
            self.call_started = time.monotonic()
            error: TelegramError | None = None
            batch: list[Any] = []
            try:
                batch = get_updates(
                    self._token,
                    offset,
                    limit=1 if skipping else 100,
                    long_poll_timeout=0 if skipping else self._long_poll,
                    allowed_updates=self._allowed,
                    connection=self._connection,
                    read_timeout=self._read_timeout,
                )
            except TelegramError as exc:
                error = exc
            finally:
                self.call_started = None
            if self._stop.is_set():
                # The stop interrupted the call or came while it ran: nothing of it is recorded
                # (so nothing of it is confirmed) and its failure, if any, is no news.
                break
            if isinstance(error, RetryAfter):
                self.last_error = str(error)
                wait = retry_after_wait(error.seconds)
                log.warning("getUpdates rate limited; waiting", extra={"retry_after": error.seconds, "wait": wait})
                if not self._wait(wait):
                    break
                continue
            if isinstance(error, Unauthorized):
                return f"Telegram refused the bot token (401 Unauthorized: {error.description}); get a valid token"
            if isinstance(error, Conflict):
                # a registered webhook is no passing conflict: end, naming its host
                from .webhook_guard import webhook_conflict  # this rare path only: polling bots never load it

                webhook = webhook_conflict(self._token)
                if webhook is not None:
                    return webhook
                now = time.monotonic()
                conflict_since = conflict_since or now
                self.last_error = str(error)
                if now - conflict_since >= self._conflict_grace:
                    return (
                        f"another poller or a webhook kept this token for {now - conflict_since:.0f} s "
                        f"(409 Conflict: {error.description}); stop the other instance or delete the webhook"
                    )
                failures += 1
                left = max(0.0, self._conflict_grace - (now - conflict_since))
                log.warning("getUpdates conflict (409): another instance is polling with this bot token; retrying, "
                            "this poller ends if it goes on for %.0f s more", left,
                            extra={"failures": failures, "conflict_left": left, IN_MESSAGE: ("conflict_left",)})
                if not self._wait(poll_backoff(failures)):
                    break
                continue
            if isinstance(error, (Transient, Ambiguous)):
                failures += 1
                self.last_error = str(error)
                log.warning("getUpdates at %s failed; retrying", _server(), extra={"failures": failures, "err": error})
                if not self._wait(poll_backoff(failures)):
                    break
                continue
            if error is not None:
                return f"getUpdates failed in a way that retrying cannot fix: {error}"
            failures = 0
            conflict_since = None
            self.polls += 1
            if skipping:
                log.info("skip_pending: Telegram dropped the updates waiting for this bot but the newest (the first "
                         "start of this database); the newest, if any, is handled",
                         extra={"skipped": [u.get("update_id") for u in batch if isinstance(u, Mapping)]})
            if not self._record(batch, offset, skip_all=skipping):
                failures += 1
                if not self._wait(poll_backoff(failures)):
                    break
        return None


    def _lead(self) -> bool:
        """Wait until this process leads the polling (``True``) or must end (``False``: stopping, or the database
        unreachable for :data:`LEAD_FAILURE_LIMIT` s, the reason in ``self._unled``); an attempt that reached the
        database counts as progress, one that did not shows in ``last_error``."""
        leadership = self._leadership
        if leadership is None or leadership.held:
            return True
        log.info("waiting for poll leadership")
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
                    self._unled = (f"{_CANNOT_LEAD} for {LEAD_FAILURE_LIMIT:g} s (the database could not be "
                                   f"reached): {error}")
                    return False
            if acquired:
                log.info("leading the polling", extra={"epoch": leadership.epoch})
                return True
        return False

    def _step_down(self, exc: LeadershipLost) -> None:
        """A record was refused because another process leads now: stop polling until leading again."""
        self.last_error = str(exc)
        log.warning("poll leadership lost; the batch in hand was not recorded (the new leader fetches it)",
                    extra={"epoch": exc.epoch, "current": exc.current})
        if self._leadership is not None:
            self._leadership.release()

    def _record(self, batch: list[Any], offset: int, *, skip_all: bool = False) -> bool:
        """Record ``batch``; ``True`` on success (or nothing to record), ``False`` to retry the same offset.
        ``skip_all``: the batch answers the skip_pending call (recorded as usual; the skip is then done)."""
        if not batch:  # an empty long poll is progress: Telegram answered, nothing was waiting
            self._mark_progress()
            self._skip_pending = self._skip_pending and not skip_all
            return True
        valid = screen(batch, offset)
        if not valid:
            return True
        next_offset = max(offset, max(u["update_id"] for u in valid) + 1)
        kwargs: dict[str, Any] = {}
        skip = unauthorized(valid, self._authorize)
        if skip:
            kwargs["skip"] = skip
        if self.generation is not None:
            kwargs["generation"] = self.generation
        if self._on_record is not None:
            kwargs["on_record"] = self._on_record
        if isinstance(batch, UpdateBatch) and len(valid) == len(batch) and self._accepts_body:
            kwargs["body"] = batch.body  # the payloads as Telegram sent them: nothing to encode again
        try:
            new = self._record_batch(valid, next_offset, **kwargs)
        except LeadershipLost as exc:
            self._step_down(exc)
            return True
        except (StoreCorrupt, SchemaError):
            raise  # a damaged or unusable database: the poller ends with the reason (see _run)
        except Exception as exc:
            self.last_error = telegram.mask_tokens(repr(exc))
            log.error(
                "recording a batch failed; the same offset will be asked again",
                extra={"offset": offset, "err": exc},
            )
            return False
        self.recorded += new
        self._progress_at = time.monotonic()
        if skip_all:
            self._skip_pending = False
        self._recorded_offset = max(self._recorded_offset, next_offset)
        return True


def _begin_generation(monitored: UpdateStore) -> int:
    """A new generation, its progress marked (a start is progress: a health check may not fail before the first poll
    returns), as one write of the writer (one round of the dispatcher, where two made the start wait for two); the
    progress is best effort (logged), as every mark of it."""
    generation = int(monitored.begin_generation())
    try:
        monitored.mark_progress(generation)
    except Exception:
        log.warning("could not record poller progress", exc_info=True)
    return generation


def _server() -> str:
    """``host[:port]`` of the Bot API server telebot is pointed at (the token is in the path, not here): a failure
    to reach it names where it was looked for (a wrong ``TELEGRAM_API_URL``, a proxy, a firewall)."""
    try:
        return urllib.parse.urlsplit(telegram.api_url("TOKEN", "getUpdates")).netloc or "the Bot API server"
    except ValueError:
        return "the Bot API server"
