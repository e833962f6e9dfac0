"""The keystreams: AES-256-CTR against known answers, PCG64 words reproducible per seed, and
both independent of how a stream is split into fills."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from veil.aggregator.simulate import AesCtrKeystream, FastKeystream

KEY = bytes(range(32))
NONCE = bytes(range(100, 116))


def words_of(keystream, n: int) -> np.ndarray:
    out = np.empty(n, np.uint32)
    keystream.fill(out)
    return out


def test_aes_matches_nist_sp800_38a_ctr_aes256():
    # F.5.5 CTR-AES256.Encrypt: the keystream is the output block of each counter block.
    key = bytes.fromhex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4")
    counter = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")
    expected = bytes.fromhex("0bdf7df1591716335e9a8b15c860c502" "5a6e699d536119065433863c8f657b94")
    assert words_of(AesCtrKeystream(key, counter), 8).tobytes() == expected


def test_aes_is_cryptographys_ctr_encryption_of_zeros():
    n = 10_001
    reference = Cipher(algorithms.AES(KEY), modes.CTR(NONCE)).encryptor().update(bytes(4 * n))
    assert words_of(AesCtrKeystream(KEY, NONCE), n).tobytes() == reference


@pytest.mark.parametrize("make", [lambda: AesCtrKeystream(KEY, NONCE), lambda: FastKeystream(7)], ids=["aes", "fast"])
def test_a_stream_does_not_depend_on_how_it_is_split(make):
    whole = words_of(make(), 1000)
    keystream = make()
    pieces = [words_of(keystream, size) for size in (1, 3, 0, 5, 2, 64, 1, 924)]
    assert np.array_equal(np.concatenate(pieces), whole)


def test_aes_keys_and_nonces_give_different_streams():
    base = words_of(AesCtrKeystream(KEY, NONCE), 64)
    assert np.array_equal(words_of(AesCtrKeystream(KEY, NONCE), 64), base)
    assert not np.array_equal(words_of(AesCtrKeystream(bytes(32), NONCE), 64), base)
    assert not np.array_equal(words_of(AesCtrKeystream(KEY, bytes(16)), 64), base)
    # The default key is fresh from the OS for every stream.
    assert not np.array_equal(words_of(AesCtrKeystream(), 64), words_of(AesCtrKeystream(), 64))


def test_aes_rejects_bad_key_or_nonce_sizes():
    with pytest.raises(ValueError):
        AesCtrKeystream(bytes(16))
    with pytest.raises(ValueError):
        AesCtrKeystream(KEY, bytes(12))


def test_fast_is_pcg64_raw_output_low_half_first():
    raw = np.random.PCG64(2024).random_raw(50)
    expected = np.stack([raw & 0xFFFFFFFF, raw >> 32], axis=1).ravel().astype(np.uint32)
    assert np.array_equal(words_of(FastKeystream(2024), 100), expected)


def test_fast_is_reproducible_per_seed():
    assert np.array_equal(words_of(FastKeystream(1), 999), words_of(FastKeystream(1), 999))
    assert not np.array_equal(words_of(FastKeystream(1), 999), words_of(FastKeystream(2), 999))


def test_reprs_say_what_is_secure():
    assert "not secure" in repr(FastKeystream(3))
    assert "simulation only" in repr(FastKeystream(3))
    assert KEY.hex() not in repr(AesCtrKeystream(KEY))
