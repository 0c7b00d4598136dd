"""The webhook intake's group commit through a writer's hand-off (``GroupHandOff``), with a real writer thread,
real SQLite files and real HTTP (the stdlib threaded server)."""

from __future__ import annotations

import io
import json
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from helpers import eventually, serving, stored_ids
from pg_support import store_of
from webhook_support import SECRET, post, update

from telegram_fence import SqliteUpdateStore
from telegram_fence.ingress.webhook import GroupHandOff, WebhookIntake
from telegram_fence.ingress.wsgi_server import WsgiServer

Take = Callable[[], Any]
Done = Callable[[BaseException | None], None]


class ThreadWriter:
    """A writer of its own thread taking the intake's posts in order, as a fence's dispatcher does: ``take()`` when
    it begins, ``store.record`` in one transaction, ``done(error)``. ``hold`` keeps it between taking a group and
    recording it (a commit in progress; ``taking`` is set then); ``fail`` answers the next group with that error
    instead of recording it; ``serving=False`` refuses posts."""

    def __init__(self, store: SqliteUpdateStore) -> None:
        self._store = store
        self._posts: queue.Queue[tuple[Take, Done] | None] = queue.Queue()
        self.serving = True
        self.hold = threading.Event()
        self.hold.set()
        self.taking = threading.Event()  # set when it took a group and waits at the hold
        self.fail: BaseException | None = None
        self.posts = 0
        self.groups: list[list[int]] = []
        self.threads: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="test-writer", daemon=True)
        self._thread.start()

    def post(self, take: Take, done: Done) -> object | None:
        if not self.serving:
            return None
        ticket = (take, done)
        self.posts += 1
        self._posts.put(ticket)
        return ticket

    def orphaned(self, ticket: object) -> bool:
        if self.serving:
            return False
        with self._posts.mutex:
            if ticket in self._posts.queue:
                self._posts.queue.remove(ticket)  # type: ignore[arg-type]
                return True
        return False

    def stop(self) -> None:
        self._posts.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        while True:
            ticket = self._posts.get()
            if ticket is None:
                return
            take, done = ticket
            taken = take()
            if taken is None:
                done(None)
                continue
            self.taking.set()
            self.hold.wait()
            updates, kwargs = taken
            self.threads.add(threading.current_thread().name)
            error: BaseException | None = None
            try:
                if self.fail is not None:
                    error, self.fail = self.fail, None
                else:
                    self._store.record(updates, 0, **kwargs)
                    self.groups.append([u["update_id"] for u in updates])
            except Exception as exc:
                error = exc
            done(error)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteUpdateStore]:
    with store_of("sqlite", tmp_path, busy_timeout=0.2) as s:
        yield s


@pytest.fixture
def writer(store: SqliteUpdateStore) -> Iterator[ThreadWriter]:
    w = ThreadWriter(store)
    try:
        yield w
    finally:
        w.hold.set()
        w.stop()






def body(update_id: int) -> bytes:
    return json.dumps(update(update_id, chat=update_id)).encode()


def committers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "fence-webhook-commit"]


def test_a_writer_s_hand_off_is_a_group_handoff(writer: ThreadWriter) -> None:
    """The protocol the intake checks a hand-off against is the one this test's writer (and a fence's) offers."""
    assert isinstance(writer, GroupHandOff)


def test_deliveries_queued_while_the_writer_commits_are_one_post_and_one_group(
    store: SqliteUpdateStore, writer: ThreadWriter
) -> None:
    """While the writer commits delivery 1's group, the next delivery posts one more and the nine after it post
    nothing: the writer takes all ten when it begins, in one record on its own thread; each is answered 200 only
    after its commit, and the intake starts no committer thread."""
    app = WebhookIntake(store, SECRET, hand_off=writer)
    results: dict[int, int] = {}
    writer.hold.clear()
    with serving(app) as port:
        def deliver(update_id: int) -> None:
            results[update_id] = post(port, body(update_id))[0]

        threads = [threading.Thread(target=deliver, args=(i,)) for i in range(1, 12)]
        threads[0].start()
        assert writer.taking.wait(10)
        for thread in threads[1:]:
            thread.start()
        assert eventually(lambda: app.stats()["waiting"] == 10)
        assert results == {} and stored_ids(store) == []  # nobody answered before the commit
        writer.hold.set()
        for thread in threads:
            thread.join(20)
        assert committers() == []
    assert results == {i: 200 for i in range(1, 12)}
    assert writer.posts == 2 and [sorted(g) for g in writer.groups] == [[1], list(range(2, 12))]
    assert writer.threads == {"test-writer"}
    assert stored_ids(store) == list(range(1, 12))
    assert app.stats()["commits"] == 2 and app.stats()["stored"] == 11


def test_while_no_writer_takes_posts_the_delivery_commits_on_its_own_thread(
    store: SqliteUpdateStore, writer: ThreadWriter
) -> None:
    """A hand-off that takes no posts (its writer not started, or ended): each delivery is committed on its
    request thread and answered 200; no committer thread starts."""
    writer.serving = False
    app = WebhookIntake(store, SECRET, hand_off=writer)
    with serving(app) as port:
        assert [post(port, body(i))[0] for i in (1, 2, 3)] == [200, 200, 200]
        assert committers() == []
    assert stored_ids(store) == [1, 2, 3] and writer.groups == []


def test_a_post_its_writer_never_took_is_committed_by_its_poster(
    store: SqliteUpdateStore, writer: ThreadWriter
) -> None:
    """The writer goes away with a post still untaken: the delivery that posted it takes it back within about
    half a second, commits it on its own thread and is answered 200 (nothing waits for a writer that is gone)."""
    app = WebhookIntake(store, SECRET, hand_off=writer)
    writer.hold.clear()
    with serving(app) as port:
        first = threading.Thread(target=lambda: post(port, body(1)))
        first.start()
        assert writer.taking.wait(10)  # the writer holds group 1, taken but not yet recorded
        results: list[int] = []
        second = threading.Thread(target=lambda: results.append(post(port, body(2))[0]))
        second.start()
        assert eventually(lambda: writer.posts == 2)
        writer.serving = False  # post 2 is in its queue, never to be taken
        second.join(10)
        assert results == [200] and 2 in stored_ids(store)
        writer.hold.set()
        first.join(10)
    assert stored_ids(store) == [1, 2]


def test_a_group_the_writer_failed_is_recorded_one_by_one(store: SqliteUpdateStore, writer: ThreadWriter) -> None:
    """The writer's transaction for a group fails: its deliveries are recorded again one at a time from their own
    threads (one counted fallback), each answered for its own commit: all 200 here; the next group is the
    writer's again."""
    app = WebhookIntake(store, SECRET, hand_off=writer)
    writer.hold.clear()
    results: dict[int, int] = {}
    with serving(app) as port:
        def deliver(update_id: int) -> None:
            results[update_id] = post(port, body(update_id))[0]

        threads = [threading.Thread(target=deliver, args=(i,)) for i in range(1, 6)]
        threads[0].start()
        assert writer.taking.wait(10)
        for thread in threads[1:]:
            thread.start()
        assert eventually(lambda: app.stats()["waiting"] == 4)
        writer.fail = RuntimeError("disk full")
        writer.hold.set()
        for thread in threads:
            thread.join(20)
    assert results == {i: 200 for i in range(1, 6)}
    assert stored_ids(store) == [1, 2, 3, 4, 5] and [sorted(g) for g in writer.groups] == [[2, 3, 4, 5]]
    assert app.stats()["fallbacks"] == 1


def test_close_waits_for_the_group_in_the_writer(store: SqliteUpdateStore, writer: ThreadWriter) -> None:
    """``close()`` while a group is posted but not yet committed: it returns only after that group was committed
    and answered (and says whether it ended within its timeout); later deliveries answer 503."""
    app = WebhookIntake(store, SECRET, hand_off=writer)
    writer.hold.clear()
    server = WsgiServer(app, "127.0.0.1", 0)
    server.start()
    try:
        results: list[int] = []
        first = threading.Thread(target=lambda: results.append(post(server.port, body(1))[0]))
        first.start()
        assert writer.taking.wait(10)
        assert app.close(0.2) is False  # the group is still in the writer
        assert post(server.port, body(2))[0] == 503
        writer.hold.set()
        assert app.close(10) is True
        first.join(10)
        assert results == [200]
    finally:
        server.stop()
        assert server.join(10)
    assert stored_ids(store) == [1]


def test_a_committed_group_is_answered_even_while_its_first_request_thread_cannot_run(
    store: SqliteUpdateStore, writer: ThreadWriter
) -> None:
    """Once the writer committed a group, every delivery of it is woken by the writer itself: with the request thread
    of the group's first delivery held right after it woke (a trace function stops it there), the other four are
    still answered 200; none waits for another request thread to pass the wake-up on."""
    app = WebhookIntake(store, SECRET, hand_off=writer)
    results: dict[int, int] = {}
    stalled, resume = threading.Event(), threading.Event()

    def hold_once_answered(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_name != "_handed":
            return None

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            delivery = frame.f_locals.get("delivery")
            if event == "line" and not resume.is_set() and getattr(delivery, "status", 0) == 200:
                stalled.set()  # woken by its commit: held here until the test lets it go
                resume.wait(30)
            return local

        return local

    def deliver(update_id: int, traced: bool = False) -> None:
        if traced:
            sys.settrace(hold_once_answered)
        data = body(update_id)
        environ = {"REQUEST_METHOD": "POST", "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": SECRET,
                   "CONTENT_LENGTH": str(len(data)), "wsgi.input": io.BytesIO(data)}
        answer: list[str] = []
        app(environ, lambda status, headers, exc_info=None: answer.append(status))
        results[update_id] = int(answer[0].split()[0])

    writer.hold.clear()
    first = threading.Thread(target=deliver, args=(1,))
    first.start()
    assert writer.taking.wait(10)  # group [1] taken and held: the next deliveries queue behind it
    held = threading.Thread(target=deliver, args=(2, True))
    held.start()
    assert eventually(lambda: app.stats()["waiting"] == 1)
    others = [threading.Thread(target=deliver, args=(i,)) for i in range(3, 7)]
    for thread in others:
        thread.start()
    assert eventually(lambda: app.stats()["waiting"] == 5)
    writer.hold.set()
    try:
        assert stalled.wait(20)
        assert eventually(lambda: all(results.get(i) == 200 for i in range(3, 7)), timeout=10), results
    finally:
        resume.set()
        for thread in (first, held, *others):
            thread.join(20)
    assert results == {i: 200 for i in range(1, 7)}
    assert [sorted(g) for g in writer.groups] == [[1], [2, 3, 4, 5, 6]]
