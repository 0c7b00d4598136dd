"""``CallJournal``: the attempt extension and telebot request sender that journals, replays and rate-limits every
Bot API call a handler makes.

A call outside an attempt (the poller, the operator channel, a broadcast, any other thread) is not journaled but
waits for the rate limits. May import ``errors``, ``store`` (types), ``telegram`` and ``calls.*`` (layer 2).
Thread safety: one object serves every thread; an attempt's state lives in its thread's ``Frame``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..errors import CallMismatch, CallUncertain, ConfigurationError, OwnershipLost
from ..store import Identity
from ..telegram import (
    Answer,
    Forward,
    api_url,
    classify,
    install_request_sender,
    mask_tokens,
    method_of_url,
    never_left,
    prepare_request,
    written,
)
from . import verdicts
from .frame import Frame, QueuedCall, UncertainCall, active, leave, peek, stale_step
from .frame import begin as frame_begin
from .journal import CallRow, Journal, JournalStore
from .limits import LimitedSender, Limits, Rates, fence_journals, passing
from .limits import paid as _paid
from .resend import FIRST, Resender
from .verdicts import NO_RESULT, stand_in

__all__ = ["CallJournal"]

log = logging.getLogger("telegram_fence.calls.journaled")

#: Calls in flight named one line each in the start's log (the rest are counted).
_UNKNOWN_LINES = 50


class CallJournal:
    """Journal, replay and rate-limit the Bot API calls of a fence's handlers.

    ``token``: the bot's (to send queued calls); ``rates``: proactive limits (shared through ``store``);
    ``on_uncertain(call)``: told of each call that became uncertain (must not block; what it raises is logged);
    ``raise_uncertain``: raise :class:`CallUncertain` from an uncertain call instead of returning ``None``.
    """

    def __init__(self, store: JournalStore, token: str, *, rates: Rates | None = None,
                 on_uncertain: Callable[[UncertainCall], Any] | None = None, raise_uncertain: bool = False,
                 logger: logging.Logger | None = None) -> None:
        self._journal = Journal(store)
        self._token = token
        self.limits = Limits(rates, share=self._journal)
        self._on_uncertain = on_uncertain
        self._raise_uncertain = raise_uncertain
        self._log = logger or log
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._undo: Callable[[], None] | None = None
        self._resender = Resender(self._deliver, self._log)
        # Calls outside a handler; a durable step's call is checked again right before it leaves.
        self._outside = LimitedSender(self.limits, stop=self._resender.stopping, check=_not_stale)

    # --- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Install the request sender and start the resend thread with the calls an earlier run left queued (a
        failure to read those is logged: they stay queued)."""
        self._undo = install_request_sender(self._send)
        fence_journals(+1)
        try:
            for update_id, seq in self._journal.queued(limit=100_000):
                self._resender.add(update_id, seq)
        except Exception:
            self._log.warning("reading the calls left queued by an earlier run failed; they stay queued",
                              exc_info=True)
        self._report_unknown()
        self._resender.start()

    def _report_unknown(self) -> None:
        """Log (WARNING) each call in flight (``intent``: left by a process that stopped mid-request, or being sent)
        and how many calls of unknown outcome the journal holds (a failure to read them, its cause)."""
        try:
            rows = self._journal.in_flight(limit=_UNKNOWN_LINES)
            counts = self._journal.counts()
        except Exception as exc:
            self._log.warning("reading the calls of unknown outcome failed (%s)", mask_tokens(repr(exc)))
            return
        in_flight, uncertain = counts.get(verdicts.INTENT, 0), counts.get(verdicts.UNCERTAIN, 0)
        for row in rows if in_flight else ():
            self._log.warning("update %s: %s (call %s, chat %s) was in flight when its process stopped (or is "
                              "being sent by another process): it may or may not have reached Telegram and is not "
                              "sent again", row.update_id, row.method, row.seq, row.chat_id,
                              extra={"update_id": row.update_id, "method": row.method, "seq": row.seq,
                                     "chat_id": row.chat_id})
        if in_flight or uncertain:
            self._log.warning("the call journal holds %d calls that may or may not have reached Telegram (%d "
                              "uncertain, %d in flight when a process stopped or being sent now); none is sent "
                              "again; `telegram-fence calls DB --uncertain` lists them", in_flight + uncertain,
                              uncertain, in_flight)

    def stop_resending(self, timeout: float | None = None) -> bool:
        """Stop the resend thread (its calls stay queued) and wait up to ``timeout``; ``True`` when it ended."""
        self._resender.stop()
        return self._resender.join(timeout)

    def stop(self) -> None:
        """Stop resending (without waiting) and take the request sender out again. Idempotent."""
        self._resender.stop()
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()
            fence_journals(-1)

    def stats(self) -> dict[str, Any]:
        """What this process's handlers' calls came to since start, and the journal's uncertain count."""
        with self._lock:
            counts = dict(self._counts)
        result: dict[str, Any] = {name: counts.get(name, 0) for name in
                                  ("sent", "refused", "replayed", "uncertain", "retried", "mismatched", "queued")}
        result["paused"] = self.limits.paused
        result["resending"] = self._resender.pending()  # queued calls waiting for another try
        result["resend_tries"] = self._resender.resent  # tries the resend thread made since start
        result["journal_error"] = None
        try:
            result["journal"] = self._journal.counts()
        except Exception as exc:  # stats never fail for a busy or closed store: the reason is kept instead
            result["journal"] = None
            result["journal_error"] = mask_tokens(" ".join(str(exc).split()) or type(exc).__name__)[:300]
        return result

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    # --- attempt hooks (runtime.attempt.AttemptExtension) --------------------------------------

    def begin(self, ctx: Any) -> None:
        frame_begin(ctx)  # its frame is made when the attempt first needs one (a call, queue_calls, ...)

    def before_commit(self, ctx: Any, conn: Any, complete: bool) -> None:
        frame = peek()
        if frame is None or not frame.pending:
            return
        current = getattr(ctx, "transactions_begun", 0)
        # Calls made in this block, or outside any, commit now; those of an earlier block that rolled back
        # are dropped (their block's writes are gone, so must their messages be).
        due = [q for q in frame.pending if q.transaction in (0, current)]
        frame.pending.clear()
        self._journal.queue(conn, frame.identity, [(q.seq, q.method, q.chat_id, q.digest, q.request) for q in due])
        frame.written.extend(due)

    def after_commit(self, ctx: Any, complete: bool) -> None:
        frame = peek()
        if frame is None or not frame.written:
            return
        written, frame.written = frame.written, []
        update_id = frame.identity.update_id
        for index, queued in enumerate(written):
            if self._resender.waiting_for(update_id):  # an earlier call of this update waits: keep the order
                later: float | None = 0.0
            else:
                try:
                    later = self._deliver(update_id, queued.seq, frame.identity.claim_id,
                                          json.loads(queued.request))
                except Exception as exc:  # after_commit must not raise: the resend thread tries it again
                    self._log.warning("update %s: sending queued call %s failed (%s); it stays queued and is "
                                      "tried again", update_id, queued.seq, exc, extra={"update_id": update_id})
                    later = FIRST
            if later is not None:  # it and the calls queued after it go to the resend thread, in order
                for rest in written[index:]:
                    self._resender.add(update_id, rest.seq, max(later, FIRST))
                return

    def end(self, ctx: Any, ok: bool) -> None:
        frame = peek()
        try:
            if frame is not None and frame.pending:  # calls of a block that rolled back are dropped
                frame.pending[:] = [q for q in frame.pending if q.transaction == 0]
            if ok and frame is not None and frame.pending and not ctx.completed:
                with ctx.transaction(complete=True):
                    pass  # before_commit writes the pending calls, after_commit sends them
        finally:
            leave()

    # --- the request sender ---------------------------------------------------------------------

    def _send(self, http: str, url: str, params: Any, files: Any, timeout: Any, proxies: Any,
              forward: Forward) -> Any:
        frame = active()
        method = method_of_url(url)
        if not verdicts.journaled(method):
            return forward(http, url, params, files, timeout, proxies)
        if frame is None:  # outside a handler (or in a durable step): waits for the limits, not journaled
            return self._outside(http, url, params, files, timeout, proxies, forward)
        seq = frame.next_seq
        frame.next_seq += 1
        chat_id = verdicts.chat_of(params)
        digest = verdicts.fingerprint(method, params, files)
        if frame.queueing or getattr(frame.ctx, "open_transactions", 0):
            # Inside ctx.transaction() the journal's rows would commit (or roll back) with the caller's: the
            # call is queued and sent after the commit, as inside queue_calls().
            return self._queue(frame, seq, method, chat_id, digest, http, url, params, files)
        # Built before anything is journaled: what building raises (a text telebot cannot encode, a closed file)
        # certainly never left, and reaches the handler as telebot raised it, leaving no row.
        send = forward.prepare(http, url, params, files, timeout, proxies)
        return self._request(frame, seq, method, chat_id, digest, params, send)

    def _request(self, frame: Frame, seq: int, method: str, chat_id: int | None, digest: str, params: Any,
                 send: Callable[[], Any]) -> Any:
        """Write the intent of call ``seq`` (or replay the row there), send it and record its outcome. A call that
        must wait for the rate limits forgets its intent and writes it again, fenced, after the wait
        (``OwnershipLost``, nothing sent, for a stale attempt)."""
        identity, paid = frame.identity, _paid(params)
        settled = bool(getattr(frame.ctx, "completed", False))  # journaled without the ownership check
        row, paused = self._journal.open_call(identity, seq, method, chat_id, digest, settled=settled)
        shared: float | None = paused  # when the shared pauses end, as the intent's statement read them
        while row is None:
            if not self.limits.ready(chat_id, paid=paid, shared=shared):
                self._journal.forget(identity, seq)
                lost = None if settled else getattr(frame.ctx, "owner_lost", None)
                if not self.limits.wait(chat_id, paid=paid, stop=lost):  # told it lost its update: ask
                    if not frame.ctx.owns():
                        raise OwnershipLost(identity, "lost during a wait for the rate limits; not sent")
                    self.limits.wait(chat_id, paid=paid)
                row, _ = self._journal.open_call(identity, seq, method, chat_id, digest, settled=settled)
                if row is not None:
                    break
            shared = None  # a call sent again after a 429 reads the pauses afresh
            try:
                with passing():
                    answer = send()
            except Exception as exc:
                error = classify(exc, method)
                if _never_left(exc):  # a later attempt sends it; the handler gets telebot's exception
                    self._journal.forget(identity, seq)
                    self._count("retried")
                    raise
                self._journal.record(identity, seq, verdicts.UNCERTAIN, None, None)
                return self._uncertain(frame, seq, method, chat_id, str(error), params)
            status, text, verdict = self.limits.judge(answer, chat_id)
            if verdict.state is None:
                if verdict.resend:
                    continue
                self._journal.forget(identity, seq)
                return answer
            if not self._journal.record(identity, seq, verdict.state, status, text):
                self._log.warning("update %s: %s (call %s) was answered after another attempt of the update "
                                  "found it in flight and made it uncertain; the journal keeps it uncertain",
                                  identity.update_id, method, seq, extra={"update_id": identity.update_id})
            if verdict.state == verdicts.UNCERTAIN:
                return self._uncertain(frame, seq, method, chat_id, f"HTTP {status}", params)
            self._count(verdict.state)
            return answer
        return self._replay(frame, row, method, digest, params)  # journaled already by an earlier attempt

    def _replay(self, frame: Frame, row: CallRow, method: str, digest: str, params: Any) -> Any:
        action, changed = verdicts.replay_of(row.state, row.method, row.fingerprint, method, digest)
        if action == "mismatch":
            self._count("mismatched")
            self._log.error("update %s: call %s is %s but the journal has %s there; nothing sent",
                            row.update_id, row.seq, method, row.method, extra={"update_id": row.update_id})
            raise CallMismatch(row.update_id, row.seq, row.method, method)
        if changed:
            self._count("mismatched")
            self._log.warning("update %s: call %s (%s) has other arguments than the journaled one; the journaled "
                              "call stands and is not sent again", row.update_id, row.seq, method,
                              extra={"update_id": row.update_id})
        self._count("replayed")
        if action == "answer":
            return Answer(row.status or 200, row.answer or NO_RESULT)
        if action == "queued":
            return Answer(200, stand_in(method, params))
        return self._uncertain(frame, row.seq, method, row.chat_id, "an earlier attempt ended while it was sent",
                               params, replayed=True)

    def _uncertain(self, frame: Frame, seq: int, method: str, chat_id: int | None, reason: str, params: Any, *,
                   replayed: bool = False) -> Any:
        """Record ``frame``'s call ``seq`` as uncertain (logged and told unless ``replayed``); its stand-in answer,
        or :class:`CallUncertain` when the fence was asked to raise."""
        call = UncertainCall(frame.identity.update_id, seq, method, chat_id, mask_tokens(reason))
        frame.uncertain.append(call)
        if not replayed:
            self._tell(call, "")
        if self._raise_uncertain:
            raise CallUncertain(call.update_id, seq, method, call.error)
        return Answer(200, stand_in(method, params))

    # --- queued calls ---------------------------------------------------------------------------

    def _queue(self, frame: Frame, seq: int, method: str, chat_id: int | None, digest: str, http: str, url: str,
               params: Any, files: Any) -> Any:
        if files:
            raise ConfigurationError(f"{method} uploads a file; a queued call cannot carry one (send it directly)")
        if getattr(frame.ctx, "completed", False):
            raise ConfigurationError("the update is already settled: queue calls in or before the "
                                     "ctx.transaction(complete=True) that settles it")
        row = self._journal.find(frame.identity, seq)
        if row is not None:  # an earlier attempt committed this call already
            return self._replay(frame, row, method, digest, params)
        plain = _plain_params(params)
        prepare_request(http, url, plain)  # what cannot be built raises here, as telebot would, not after the commit
        request = json.dumps({"http": http, "method": method, "params": plain})
        block = getattr(frame.ctx, "transactions_begun", 0) if getattr(frame.ctx, "open_transactions", 0) else 0
        frame.pending.append(QueuedCall(seq, method, chat_id, digest, request, block))
        self._count("queued")
        return Answer(200, stand_in(method, params))

    def _deliver(self, update_id: int, seq: int, claim_id: str, request: dict[str, Any] | None = None) -> float | None:
        """Send the queued call ``(update_id, seq)`` once, as ``claim_id``, and record its outcome.

        It waits for the rate limits while the row is still ``queued``, then takes it (whoever loses that race
        sends nothing) and sends it. ``None`` when it is done with; else it stays queued and the value is the
        seconds before another try. Raises the classified error (queued again) when the send never left."""
        if request is None:
            request = self._journal.queued_request(update_id, seq)
            if request is None:
                return None
        method = str(request["method"])
        params = request.get("params") or None
        chat_id = verdicts.chat_of(params)
        sender = Identity(update_id, 0, claim_id)
        while True:
            if not self.limits.wait(chat_id, paid=_paid(params), stop=self._resender.stopping):
                return 0.0  # the fence is stopping: it stays queued, and the next start sends it
            try:
                send = prepare_request(str(request.get("http", "post")), api_url(self._token, method), params)
            except Exception as exc:  # it can never be sent: refused here, once
                if self._journal.take_queued(update_id, seq, claim_id) is not None:
                    self._journal.record(sender, seq, verdicts.REFUSED, None, None, flush=True)
                    self._count("refused")
                    self._log.error("update %s: queued %s (call %s) cannot be built, recorded refused, not sent: "
                                    "%s", update_id, method, seq, mask_tokens(repr(exc)),
                                    extra={"update_id": update_id, "method": method, "seq": seq})
                return None
            if self._journal.take_queued(update_id, seq, claim_id) is None:
                return None  # another sender took it
            try:
                answer = send()
            except Exception as exc:
                error = classify(exc, method)
                if _never_left(exc):
                    self._journal.requeue(sender, seq)
                    raise error from exc
                self._journal.record(sender, seq, verdicts.UNCERTAIN, None, None, flush=True)
                self._tell(UncertainCall(update_id, seq, method, chat_id, mask_tokens(str(error))), "queued ")
                return None
            status, text, verdict = self.limits.judge(answer, chat_id)
            if verdict.state is None:  # nothing was done: queued again, before any wait
                self._journal.requeue(sender, seq)
                if verdict.resend:
                    continue
                return verdict.pause
            self._journal.record(sender, seq, verdict.state, status, text, flush=True)
            if verdict.state == verdicts.UNCERTAIN:
                self._tell(UncertainCall(update_id, seq, method, chat_id, f"HTTP {status}"), "queued ")
            else:
                self._count(verdict.state)
            return None

    def _tell(self, call: UncertainCall, queued: str) -> None:
        """Count, log and tell ``on_uncertain`` of ``call`` that became uncertain (``queued``: ``"queued "`` or "")."""
        self._count("uncertain")
        self._log.warning("update %s: %s%s (call %s) may or may not have reached Telegram: recorded uncertain, not "
                          "sent again (%s)", call.update_id, queued, call.method, call.seq, call.error,
                          extra={"update_id": call.update_id, "method": call.method, "seq": call.seq,
                                 "chat_id": call.chat_id})
        if self._on_uncertain is not None:
            try:
                self._on_uncertain(call)
            except Exception:
                self._log.error("on_uncertain raised", exc_info=True)


def _never_left(exc: BaseException) -> bool:
    """Whether the request that just failed with ``exc`` on this thread certainly never left."""
    return written() is False or never_left(exc)


def _not_stale(method: str) -> None:
    """Raise :class:`OwnershipLost` (nothing sent) for a durable step's call whose attempt lost its update."""
    stale = stale_step()
    if stale is not None:
        raise OwnershipLost(stale.identity, f"its update was taken away while a step ran; {method} not sent")


def _plain_params(params: Any) -> dict[str, Any]:
    return {str(k): (v if isinstance(v, (str, int, float, bool)) or v is None else str(v))
            for k, v in (params or {}).items()}

