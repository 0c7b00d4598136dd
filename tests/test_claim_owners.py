"""A claim names the process that holds it: a process of this host that is gone (killed, or its PID reused by
another) is known dead; a live one, this process, another host's or a malformed tag never is."""

from __future__ import annotations

import subprocess
import sys

from telegram_fence.store.owners import TAG_SEPARATOR, owner_is_alive, owner_is_dead, owner_tag
from telegram_fence.store.values import new_claim_ids


def _tag_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    start = int(text[text.rfind(")") + 2:].split()[19])
    return f"{owner_tag().split('.')[0]}.{pid:x}.{start:x}"


def test_a_claim_id_begins_with_the_tag_of_the_process_that_made_it() -> None:
    """Claim ids carry this process's owner tag before their random part; this process is not dead."""
    first, second = new_claim_ids(2)
    assert first.startswith(owner_tag() + TAG_SEPARATOR) and second.startswith(owner_tag() + TAG_SEPARATOR)
    assert owner_tag() != ""
    assert first != second and not owner_is_dead(owner_tag())


def test_a_killed_process_is_dead_and_a_running_one_is_not() -> None:
    """A running child is alive; once SIGKILLed and reaped it is dead; the same PID with another start time is dead
    too (a reused PID); another host's tag and malformed tags are neither known dead nor known alive."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tag = _tag_of(child.pid)
        host, pid, start = tag.split(".")
        assert not owner_is_dead(tag) and owner_is_alive(tag)
        assert owner_is_dead(f"{host}.{pid}.{int(start, 16) + 1:x}")
    finally:
        child.kill()
        child.wait()
    assert owner_is_dead(tag) and not owner_is_alive(tag)
    assert owner_is_alive(owner_tag())
    assert not owner_is_dead(f"0000beef.{pid}.{start}") and not owner_is_alive(f"0000beef.{pid}.{start}")
    for malformed in ["", "x", f"{host}.zz.1", f"{host}..", f"{host}.0.0"]:
        assert not owner_is_dead(malformed) and not owner_is_alive(malformed)
