"""Immutable value records that compile to fast native classes.

The core makes a Decision per decision and the simulator a record per request and
per finished sequence, millions per run. As NamedTuples each costs a Python-level
constructor call (~1-3 us at these widths); as classes compiled by mypyc with
`Final` attributes they cost ~0.1 us and stay read-only (an assignment raises
AttributeError in the compiled build; mypy rejects it in the sources). This base
gives them a NamedTuple's value semantics: equality, hashing, repr, `astuple()`
and `replace()`, driven by the subclass's `_fields` (its __init__ parameters, in
order).
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="Record")


class Record:
    """Base of the value records: subclasses set `_fields` and assign each field once."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def astuple(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self._fields)

    def asdict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self._fields}

    def replace(self: R, **changes: Any) -> R:
        """A copy with some fields changed (NamedTuple's _replace)."""
        unknown = set(changes) - set(self._fields)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no fields {sorted(unknown)}")
        return type(self)(**{**self.asdict(), **changes})

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Record)
        return self.astuple() == other.astuple()

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(self.astuple())

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({inner})"
