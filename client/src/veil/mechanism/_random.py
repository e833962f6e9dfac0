"""Random sources for on-device randomization.

Every random decision a mechanism makes is one of two integer operations, so that no
floating-point rounding can shift a probability:

- ``below(n)``: a uniform integer in [0, n);
- ``bits64()``: a uniform integer in [0, 2**64), compared with an integer threshold T, which
  is true with probability exactly T / 2**64.

The default source is the operating system's CSPRNG (os.urandom). The seeded source and the word source
exist for simulation, load generation and replaying a keystream in tests; never use them on a
device.
"""

from __future__ import annotations

import os
import random
import threading
from array import array
from collections.abc import Sequence
from typing import Protocol

from ._errors import MechanismError

__all__ = ["RandomSource", "SystemRandomSource", "SeededRandomSource", "WordRandomSource"]

_WORD = 1 << 32
_LOW = _WORD - 1  # product & _LOW == product % 2**32


class RandomSource(Protocol):
    def below(self, n: int) -> int:
        """A uniform integer in [0, n), n >= 1."""

    def bits64(self) -> int:
        """A uniform integer in [0, 2**64)."""


class _WordDraws:
    """Decisions drawn from uint32 words (``_next``), in the order the batch kernels consume
    them: ``bits64`` takes two words (the first is the high half); ``below`` is Lemire's
    multiply-shift with rejection, one word per try, so it is exactly uniform."""

    def _next(self) -> int:
        raise NotImplementedError

    def below(self, n: int) -> int:
        if not 1 <= n <= _WORD:
            raise MechanismError("A word source can only draw below n for 1 <= n <= 2**32.")
        product = self._next() * n
        low = product & _LOW
        if low < n:
            # Reject the lowest (2**32 mod n) values of `low` so every result has the same
            # number of words mapping to it.
            floor = (_WORD - n) % n
            while low < floor:
                product = self._next() * n
                low = product & _LOW
        return product >> 32

    def bits64(self) -> int:
        return (self._next() << 32) | self._next()


class SystemRandomSource(_WordDraws):
    """The OS CSPRNG (``os.urandom``): the default, and the only source fit for a device.

    Words are read from the OS a block of 4 KiB at a time (one system call serves some 1000
    draws, where a call per draw made a report at k = 1024 cost ~0.35 ms) and drawn from as
    WordRandomSource draws them. The unread words of a block are as secret as the true value
    they are about to randomize, and never leave the process. Each thread reads its own block
    (no lock, and no two threads share a word); a forked child throws away every block it
    inherited, or it would repeat its parent's next decisions."""

    def _next(self) -> int:
        blocks = _blocks
        position = getattr(blocks, "position", _BLOCK_WORDS)
        if position < _BLOCK_WORDS and blocks.forks == _forks:
            blocks.position = position + 1
            return blocks.words[position]
        blocks.words = array("I", os.urandom(4 * _BLOCK_WORDS))
        blocks.forks = _forks
        blocks.position = 1
        return blocks.words[0]


_BLOCK_WORDS = 1024


class _Blocks(threading.local):
    words: array[int]
    forks: int
    position: int


_blocks = _Blocks()  # this thread's block of OS words and the next position in it
_forks = 0  # bumped in a forked child: blocks read before the fork are stale


def _forget_blocks() -> None:
    """Every thread's block is read again from the OS before its next draw."""
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forget_blocks)
if array("I").itemsize != 4:  # C unsigned int is 32 bits on every platform Python supports
    raise ImportError("veil.mechanism needs 4-byte unsigned ints in array('I').")


class SeededRandomSource:
    """A seeded Mersenne Twister: reproducible and fast, for simulation only (not secure)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def below(self, n: int) -> int:
        return self._rng.randrange(n)

    def bits64(self) -> int:
        return self._rng.getrandbits(64)


class WordRandomSource(_WordDraws):
    """Decisions drawn from a given sequence of uint32 words, as the OS source draws them.

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
