"""Random sources for on-device randomization.

Every random decision a mechanism makes is one of two integer operations, so that no
floating-point rounding can shift a probability:

- ``below(n)``: a uniform integer in [0, n);
- ``bits64()``: a uniform integer in [0, 2**64), compared with an integer threshold T, which
  is true with probability exactly T / 2**64.

The default source is the operating system's CSPRNG. The seeded source and the word source
exist for simulation, load generation and replaying a keystream in tests; never use them on a
device.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Sequence
from typing import Protocol

from ._errors import MechanismError

__all__ = ["RandomSource", "SystemRandomSource", "SeededRandomSource", "WordRandomSource"]

_WORD = 1 << 32


class RandomSource(Protocol):
    def below(self, n: int) -> int:
        """A uniform integer in [0, n), n >= 1."""

    def bits64(self) -> int:
        """A uniform integer in [0, 2**64)."""


class SystemRandomSource:
    """The OS CSPRNG (``secrets``): the default, and the only source fit for a device."""

    def below(self, n: int) -> int:
        return secrets.randbelow(n)

    def bits64(self) -> int:
        return secrets.randbits(64)


class SeededRandomSource:
    """A seeded Mersenne Twister: reproducible and fast, for simulation only (not secure)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def below(self, n: int) -> int:
        return self._rng.randrange(n)

    def bits64(self) -> int:
        return self._rng.getrandbits(64)


class WordRandomSource:
    """Decisions drawn from a given sequence of uint32 words, in the order the batch kernels
    consume them: ``bits64`` takes two words (the first is the high half); ``below`` is
    Lemire's multiply-shift with rejection, one word per try, so it is exactly uniform.

    It replays a keystream (e.g. AES-CTR) so that the kernels can be checked report by
    report against this module; it raises MechanismError when the words run out.
    """

    def __init__(self, words: Sequence[int]) -> None:
        self._words = words
        self.position = 0

    def _next(self) -> int:
        if self.position >= len(self._words):
            raise MechanismError("The word source ran out of random words.")
        word = int(self._words[self.position])
        self.position += 1
        return word

    def below(self, n: int) -> int:
        if not 1 <= n <= _WORD:
            raise MechanismError("A word source can only draw below n for 1 <= n <= 2**32.")
        product = self._next() * n
        low = product % _WORD
        if low < n:
            # Reject the lowest (2**32 mod n) values of `low` so every result has the same
            # number of words mapping to it.
            floor = (_WORD - n) % n
            while low < floor:
                product = self._next() * n
                low = product % _WORD
        return product >> 32

    def bits64(self) -> int:
        return (self._next() << 32) | self._next()


def choose(source: RandomSource, n: int, m: int) -> list[int]:
    """m distinct integers drawn uniformly from [0, n), by Floyd's algorithm: m draws, each
    ``below(j + 1)`` for j = n - m .. n - 1; a draw already chosen is replaced by j. Every
    m-subset is equally likely. Returned in the order chosen (callers sort)."""
    chosen: list[int] = []
    seen: set[int] = set()
    for j in range(n - m, n):
        t = source.below(j + 1)
        pick = j if t in seen else t
        seen.add(pick)
        chosen.append(pick)
    return chosen


def bernoulli(source: RandomSource, threshold: int) -> bool:
    """True with probability exactly threshold / 2**64."""
    return source.bits64() < threshold
