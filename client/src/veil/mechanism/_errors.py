"""The error root of veil.mechanism: every misuse raises a subclass of ValueError."""

from __future__ import annotations


class MechanismError(ValueError):
    """A mechanism was asked for something it cannot do (bad k, epsilon, value or report)."""
