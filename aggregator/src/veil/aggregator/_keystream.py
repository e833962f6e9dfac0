"""Random word sources for the batch kernels.

A keystream is an endless sequence of uint32 words. ``fill(out)`` writes the next ``out.size``
words into a 1-D contiguous uint32 array; the sequence does not depend on how it is split
into fills, so a driver may refill in any chunk sizes and still consume one continuous stream.
"""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from . import _kernels

__all__ = ["Keystream", "AesCtrKeystream", "FastKeystream"]


class Keystream(Protocol):
    def fill(self, out: np.ndarray) -> None:
        """Write the next out.size words of the stream into out (1-D, contiguous, uint32)."""


class AesCtrKeystream:
    """AES-256 in counter mode, encrypting zeros: word i is bytes 4i..4i+3 of the blocks
    AES_key(nonce), AES_key(nonce + 1), ..., read in native byte order (little-endian on every
    platform numba targets).

    Why this is a cryptographically secure generator: AES under a secret, uniformly random key
    is a pseudorandom permutation, so its outputs on distinct counter blocks cannot be told
    from independent uniform blocks by anyone without the key, except for the fact that a
    permutation never repeats a block, which takes about 2**64 blocks (2**68 words) to notice.
    This is the generator at the core of NIST SP 800-90A's CTR_DRBG. The key comes from the
    operating system's CSPRNG and lives only in this object; the nonce is the first counter
    block, and may be fixed because every stream gets a fresh key.
    """

    def __init__(self, key: bytes | None = None, nonce: bytes | None = None) -> None:
        key = os.urandom(32) if key is None else bytes(key)
        nonce = bytes(16) if nonce is None else bytes(nonce)
        if len(key) != 32 or len(nonce) != 16:
            raise ValueError("AES-256-CTR needs a 32-byte key and a 16-byte nonce.")
        self._encryptor = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()
        self._zeros = memoryview(bytearray())

    def fill(self, out: np.ndarray) -> None:
        size = out.size * 4
        if len(self._zeros) < size:
            self._zeros = memoryview(bytearray(size))
        # Counter mode is a stream cipher: the ciphertext of zeros is the keystream itself,
        # written straight into out's memory.
        # (numpy declares ndarray a buffer to type checkers only from Python 3.12 on)
        self._encryptor.update_into(self._zeros[:size], out.view(np.uint8))  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return "AesCtrKeystream(AES-256-CTR, secret key)"


class FastKeystream:
    """SFC64 (Chris Doty-Humphrey's Small Fast Chaotic generator; see _kernels.sfc64_fill)
    seeded as numpy.random.SFC64(seed) is, through numpy's SeedSequence: the words are exactly
    numpy.random.SFC64(seed).random_raw()'s 64-bit outputs, each split into two words, low half
    first. A numba kernel writes them straight into out, with no temporary arrays.

    For simulation only: fast and reproducible per seed, but NOT cryptographically secure (its
    state can be recovered from its output). Never use it to randomize real reports.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        # a, b, c, counter after numpy's seeding, then a pending high half and whether there
        # is one (a fill of odd length leaves it for the next fill).
        self._state = np.zeros(6, np.uint64)
        self._state[:4] = np.random.SFC64(seed).state["state"]["state"]

    def fill(self, out: np.ndarray) -> None:
        if out.dtype != np.uint32 or out.ndim != 1:
            raise TypeError("A keystream fills a one-dimensional uint32 array.")
        _kernels.sfc64_fill(self._state, out)

    def __repr__(self) -> str:
        return f"FastKeystream(seed={self.seed!r}, SFC64, simulation only, not secure)"
