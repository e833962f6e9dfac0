"""The error root of veil.release: every misuse raises a subclass of ValueError."""

from __future__ import annotations

__all__ = ["ReleaseError", "TableError", "PartitionError", "InfeasibleBlockError"]


class ReleaseError(ValueError):
    """A release was asked for something it cannot do; the message is one sentence."""


class TableError(ReleaseError):
    """The input table is malformed: a missing column, a ragged row, a value out of range."""


class PartitionError(ReleaseError):
    """A partition spec is malformed or does not fit the data; the message names the variable and value."""


class InfeasibleBlockError(ReleaseError):
    """A partition set cannot hold a block large enough for the goal: coarsen the partition."""
