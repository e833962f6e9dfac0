"""A bucket's periods with data as SQLite and Redis keep them: one text value, the period
indexes between commas (",-1,20000,20001,"), so that a Lua script can test one for membership
with a plain find and append it, and a read gets it with the bucket's other fields."""

from __future__ import annotations

from collections.abc import Iterable

from ..counts import PERIOD_NOT_SAID

__all__ = ["periods_text", "periods_of", "NONE_RECORDED"]

NONE_RECORDED = f",{PERIOD_NOT_SAID},"  # a bucket written before periods were recorded


def periods_text(periods: Iterable[int]) -> str:
    return "," + "".join(f"{int(p)}," for p in sorted(periods))


def periods_of(text: str | bytes | None) -> frozenset[int]:
    """The periods in a text periods_text wrote; None (a bucket kept from before): not said."""
    if text is None:
        text = NONE_RECORDED
    if isinstance(text, bytes):
        text = text.decode("ascii")
    return frozenset(int(p) for p in text.split(",") if p)
