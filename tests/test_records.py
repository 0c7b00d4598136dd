"""``telegram_fence.records.Record``: the value classes' base keeps what their frozen dataclasses promised."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

from telegram_fence.conversation.values import StateKey
from telegram_fence.records import Record
from telegram_fence.store.values import Unstorable


class Point(Record):
    """A test value: two fields."""

    __slots__ = ("y", "x")  # noqa: RUF023 (any order: the fields' order is __init__'s)
    x: int
    y: Any

    def __init__(self, x: int, y: Any = None) -> None:
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "y", y)


def test_a_record_is_equal_and_hashed_by_value_within_its_class() -> None:
    """Two records of one class with equal fields are equal and hash alike; another class's never is."""
    assert Point(1, "a") == Point(1, "a") and hash(Point(1, "a")) == hash(Point(1, "a"))
    assert Point(1, "a") != Point(1, "b") and Point(1, "a") != Point(2, "a")
    assert Unstorable("x") == Unstorable("x") and {Unstorable("x"): 1}[Unstorable("x")] == 1
    assert Point(1) != (1, None) and Unstorable("x") != "x"


def test_a_record_refuses_assignment_and_deletion() -> None:
    """After __init__ a field cannot be assigned or deleted, and no other attribute can be added."""
    point = Point(1)
    with pytest.raises(AttributeError, match="immutable"):
        point.x = 2  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del point.x
    with pytest.raises(AttributeError):
        point.z = 3  # type: ignore[attr-defined]
    assert point.x == 1 and not hasattr(point, "__dict__")


def test_repr_names_the_fields_in_init_order() -> None:
    """repr shows Class(field=value, ...) in __init__'s order."""
    assert repr(Point(1, "a")) == "Point(x=1, y='a')"
    assert repr(StateKey(1, "", 0, 5, 6)) == ("StateKey(bot_id=1, business_connection_id='', message_thread_id=0, "
                                              "chat_id=5, user_id=6)")


def test_copies_pickles_replaces_and_matches() -> None:
    """copy, deepcopy and pickle give an equal record; _replace changes the named fields; match reads the fields
    positionally in __init__'s order."""
    point = Point(1, [2])
    assert copy.copy(point) == point and copy.deepcopy(point) == point
    assert pickle.loads(pickle.dumps(point)) == point
    assert point._replace(x=5) == Point(5, [2]) and point == Point(1, [2])
    with pytest.raises(TypeError):
        point._replace(z=1)
    match point:
        case Point(x, y):
            assert (x, y) == (1, [2])
        case _:
            pytest.fail("no match")


def test_slots_must_name_the_init_parameters() -> None:
    """A subclass whose __slots__, annotations and __init__ name different fields, or that has no __slots__, is
    refused (a field added as a dataclass would add it, ``name: type = default``, fails at import)."""
    with pytest.raises(TypeError, match="__slots__"):
        class Wrong(Record):
            __slots__ = ("a",)

            def __init__(self, a: int, b: int) -> None:
                pass

    with pytest.raises(TypeError, match="__slots__"):
        class NoSlots(Record):
            def __init__(self, a: int) -> None:
                pass

    with pytest.raises(TypeError, match="__slots__"):
        class Unslotted(Record):
            __slots__ = ("a",)
            a: int
            b: int | None = None

            def __init__(self, a: int) -> None:
                pass
