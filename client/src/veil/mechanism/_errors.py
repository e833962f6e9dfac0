"""The error of veil.mechanism (exported by it): every misuse raises it.

The hierarchy::

    ValueError
    └── MechanismError      a bad k, epsilon, value, report, spec or registration
"""

from __future__ import annotations

__all__ = ["MechanismError"]


class MechanismError(ValueError):
    """A mechanism was asked for something it cannot do (bad k, epsilon, value or report)."""
