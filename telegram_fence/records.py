"""``Record``: the base of the package's small immutable value classes, cheap to define at import.

A subclass names its fields in ``__slots__`` (typed by class annotations) and writes an ``__init__`` setting each
with ``object.__setattr__``; the base gives what ``@dataclass(frozen=True, slots=True)`` would (value equality and
hashing, ``repr``, ``__match_args__``, copying, pickling, no assignment) plus ``_replace(**changes)``. Unlike
dataclasses, nothing is compiled at import.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, ClassVar, NoReturn

__all__ = ["Record"]


class Record:
    """An immutable value: fields in ``__slots__``, equal and hashed by value, refusing assignment after
    ``__init__`` (:class:`AttributeError`, as a frozen dataclass's ``FrozenInstanceError`` is one). Defining a
    subclass raises :class:`TypeError` unless its ``__slots__``, its annotations (``ClassVar`` aside) and its
    ``__init__``'s parameters name the same fields."""

    __slots__ = ()
    #: The fields in order: the parameters of ``__init__`` (``__slots__`` names the same, in any order).
    _fields: ClassVar[tuple[str, ...]] = ()
    _values: ClassVar[Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__init__.__code__
        fields = code.co_varnames[1:code.co_argcount]  # __init__'s positional parameters, in order
        slots = {name for klass in cls.__mro__ for name in vars(klass).get("__slots__", ())}
        annotated = {name for name, kind in vars(cls).get("__annotations__", {}).items()
                     if not str(kind).startswith(("ClassVar", "typing.ClassVar"))}
        if "__slots__" not in vars(cls) or not set(fields) == slots == annotated:
            raise TypeError(f"{cls.__name__}: __slots__, the annotated fields and the parameters of __init__ must "
                            "name the same fields")
        cls._fields = fields
        cls.__match_args__ = fields  # type: ignore[attr-defined,misc]
        cls._values = attrgetter(*fields, *fields[:1])  # a tuple, also for one field (hashed and compared only)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return bool(self._values(self) == other._values(other))  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._values(self))

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__qualname__}({shown})"

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"cannot assign to field {name!r}: a {type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"cannot delete field {name!r}: a {type(self).__name__} is immutable")

    def _replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` (field names) made, through ``__init__`` (so its checks run again); as
        ``dataclasses.replace``. :class:`TypeError` for a name that is no field."""
        return type(self)(**{**{name: getattr(self, name) for name in self._fields}, **changes})

    def __reduce__(self) -> tuple[type[Record], tuple[Any, ...]]:
        return type(self), tuple(getattr(self, name) for name in self._fields)

