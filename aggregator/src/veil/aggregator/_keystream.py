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
        self._encryptor.update_into(self._zeros[:size], out.view(np.uint8))

    def __repr__(self) -> str:
        return "AesCtrKeystream(AES-256-CTR, secret key)"


class FastKeystream:
    """numpy's PCG64 from a seed, each 64-bit output split into two words, low half first.

    For simulation only: fast and reproducible per seed, but NOT cryptographically secure (its
    state can be recovered from its output). Never use it to randomize real reports.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._bits = np.random.PCG64(seed)
        self._carry: np.uint32 | None = None  # the high half of a 64-bit output split across fills

    def fill(self, out: np.ndarray) -> None:
        start = 0
        if self._carry is not None and out.size:
            out[0] = self._carry
            self._carry = None
            start = 1
        need = out.size - start
        words = self._bits.random_raw((need + 1) // 2).astype("<u8", copy=False).view("<u4")
        out[start:] = words[:need]
        if need % 2:
            self._carry = words[-1]

    def __repr__(self) -> str:
        return f"FastKeystream(seed={self.seed!r}, simulation only, not secure)"
