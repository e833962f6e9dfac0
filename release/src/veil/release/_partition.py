"""The partition variables X* of 001 sec. 5, step 3: one merge of categories per variable.

Post-randomization happens inside partition sets only (all records sharing every X*_i), so a
record's X*-category never changes. The text form, one item per variable, items joined by ';':

    sex                       keep sex: every value is its own group (X* = X; sex never changes)
    age=0-17,18-64,65-        three groups of a numeric variable: 0..17, 18..64, 65 and above
    race=White,Black,*        White, Black, and every other value together
    marital=never|married,widowed|divorced|separated     groups of values joined by '|'

A variable of the post-randomized set that is not named is merged into one group: its values may
change freely. Within a group, elements are joined by '|' and each is a value of the column, a
numeric range LO-HI (inclusive) or LO- (LO and above), or '*' (every value no other group takes).
A token that is itself a value of the column is that value, even if it looks like a range. Every
value of a named variable must fall in exactly one group. Values containing ';', ',', '|' or '='
cannot be written in the text form; pass a mapping instead, e.g.
``{"sex": None, "age": [["0-17"], ["18-64"], ["65-"]], "race": [["White"], ["Black"], ["*"]]}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ._errors import PartitionError

__all__ = ["Partition", "KEEP"]

KEEP = None  # a variable whose every value is its own group
_RANGE = re.compile(r"^(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)?$")

Groups = tuple[tuple[str, ...], ...]


def _quote_values(values: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(v) for v in values[:limit])
    return shown + (", ..." if len(values) > limit else "")


@dataclass(frozen=True)
class Partition:
    """variable -> its groups (each a tuple of elements) or KEEP (None)."""

    spec: Mapping[str, Groups | None]

    def __post_init__(self) -> None:
        normal: dict[str, Groups | None] = {}
        for var, groups in dict(self.spec).items():
            var = str(var).strip()
            if not var:
                raise PartitionError("partition: a variable name is empty.")
            if groups is KEEP or (isinstance(groups, str) and groups.strip().lower() == "keep"):
                normal[var] = KEEP
                continue
            if isinstance(groups, str):
                raise PartitionError(
                    f"partition: the groups of {var!r} must be a list of groups, not the string {groups!r}."
                )
            out = []
            for group in groups:
                elements = tuple(e.strip() for e in (group.split("|") if isinstance(group, str) else group))
                if not elements or any(not e for e in elements):
                    raise PartitionError(f"partition: variable {var!r} has an empty group or element.")
                out.append(elements)
            if not out:
                raise PartitionError(f"partition: variable {var!r} has no groups.")
            normal[var] = tuple(out)
        object.__setattr__(self, "spec", normal)

    @classmethod
    def parse(cls, text: str) -> Partition:
        """Parse the text form (see the module's docstring)."""
        spec: dict[str, Groups | None] = {}
        for item in text.split(";"):
            item = item.strip()
            if not item:
                continue
            var, eq, rhs = item.partition("=")
            var = var.strip()
            if not var:
                raise PartitionError(f"partition: {item!r} names no variable before '='.")
            if var in spec:
                raise PartitionError(f"partition: variable {var!r} is named twice.")
            if not eq:
                spec[var] = KEEP
                continue
            groups = []
            for group in rhs.split(","):
                elements = tuple(e.strip() for e in group.split("|"))
                if any(not e for e in elements):
                    raise PartitionError(f"partition: variable {var!r} has an empty group in {rhs.strip()!r}.")
                groups.append(elements)
            spec[var] = tuple(groups)
        return cls(spec)

    @classmethod
    def of(cls, value: str | Partition | Mapping[str, object] | None) -> Partition:
        if value is None:
            return cls({})
        if isinstance(value, Partition):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        return cls(value)  # type: ignore[arg-type]

    @property
    def variables(self) -> tuple[str, ...]:
        return tuple(self.spec)

    def text(self) -> str:
        items = []
        for var, groups in self.spec.items():
            items.append(var if groups is KEEP else var + "=" + ",".join("|".join(g) for g in groups))
        return ";".join(items)

    def describe(self, variables: Sequence[str]) -> dict[str, object]:
        """For a report: each post-randomized variable's groups, "keep" or "free"."""
        out: dict[str, object] = {}
        for var in variables:
            groups = self.spec.get(var, "free")
            out[var] = "keep" if groups is KEEP else groups if groups == "free" else ["|".join(g) for g in groups]
        return out

    def resolve(self, variable: str, categories: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """Each category's group index, and the groups' labels, for one variable's categories."""
        cats = [str(c) for c in np.asarray(categories).tolist()]
        if variable not in self.spec:
            return np.zeros(len(cats), dtype=np.int64), ["*"]
        groups = self.spec[variable]
        if groups is KEEP:
            return np.arange(len(cats), dtype=np.int64), cats
        index = {c: i for i, c in enumerate(cats)}
        numbers = []
        for c in cats:
            try:
                x = float(c)
                numbers.append(x if x == x else None)
            except ValueError:
                numbers.append(None)
        group_of = np.full(len(cats), -1, dtype=np.int64)
        labels = ["|".join(g) for g in groups]
        rest = None
        for g, elements in enumerate(groups):
            for e in elements:
                if e == "*":
                    if rest is not None:
                        raise PartitionError(f"partition: variable {variable!r} uses '*' twice.")
                    rest = g
                    continue
                if e in index:
                    members = [index[e]]
                else:
                    match = _RANGE.match(e)
                    if match is None:
                        raise PartitionError(
                            f"partition: {e!r} is not a value of column {variable!r} (its values: "
                            f"{_quote_values(cats)}) nor a range LO-HI or LO-."
                        )
                    lo = float(match.group(1))
                    hi = float(match.group(2)) if match.group(2) else float("inf")
                    if hi < lo:
                        raise PartitionError(f"partition: range {e!r} of variable {variable!r} ends before it starts.")
                    members = [i for i, x in enumerate(numbers) if x is not None and lo <= x <= hi]
                for i in members:
                    if group_of[i] not in (-1, g):
                        raise PartitionError(
                            f"partition: value {cats[i]!r} of column {variable!r} falls in two groups "
                            f"({labels[group_of[i]]!r} and {labels[g]!r})."
                        )
                    group_of[i] = g
        missing = [cats[i] for i in np.flatnonzero(group_of < 0)]
        if missing:
            if rest is None:
                raise PartitionError(
                    f"partition: value {missing[0]!r} of column {variable!r} is in no group; add it "
                    f"to a group or add a '*' group."
                )
            group_of[group_of < 0] = rest
        return group_of, labels
