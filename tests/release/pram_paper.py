"""The release of 001 sec. 7 that the release tests reproduce: its key variables, partition and xi."""

from __future__ import annotations

__all__ = ["KEYS", "PARTITION", "XI"]

KEYS = ["age", "sex", "race", "marital", "area"]
# 001 sec. 7's partition: sex kept, seven age groups, race White / Black / other.
PARTITION = "sex;age=0-17,18-24,25-34,35-44,45-54,55-64,65-;race=White,Black,*"
XI = 0.395
