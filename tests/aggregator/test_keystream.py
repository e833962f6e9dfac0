"""The keystreams: AES-256-CTR and SFC64 against known answers, SFC64 words reproducible per
seed and uniform, and both independent of how a stream is split into fills."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy import stats

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
    expected = bytes.fromhex("0bdf7df1591716335e9a8b15c860c5025a6e699d536119065433863c8f657b94")
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


def halves(outputs) -> np.ndarray:
    """64-bit outputs as words, low half first."""
    outputs = np.asarray(outputs, np.uint64)
    return np.stack([outputs & 0xFFFFFFFF, outputs >> 32], axis=1).ravel().astype(np.uint32)


def test_fast_matches_published_sfc64_outputs():
    # numpy's SFC64 known answers (numpy/random/tests/data/sfc64-testset-1.csv): seed
    # 0xdeadbeaf through SeedSequence, outputs 0 to 3 and 999.
    words = words_of(FastKeystream(0xDEADBEAF), 2000)
    first = [0xA475F55FBB6BC638, 0xB2D594B6C29D971C, 0x275BC4ECE4484FB1, 0x569BE72D9B3492FB]
    assert np.array_equal(words[:8], halves(first))
    assert np.array_equal(words[1998:], halves([0x0F5433336EADEF6E]))


def sfc64_reference(a: int, b: int, c: int, counter: int, n: int) -> list[int]:
    """SFC64 as PractRand defines it, in plain Python integers."""
    mask = (1 << 64) - 1
    outputs = []
    for _ in range(n):
        output = (a + b + counter) & mask
        counter = (counter + 1) & mask
        a = b ^ (b >> 11)
        b = (c + (c << 3)) & mask
        c = ((((c << 24) | (c >> 40)) & mask) + output) & mask
        outputs.append(output)
    return outputs


@pytest.mark.parametrize("seed", [0, 1, 2024, 2**100 + 7])
def test_fast_is_sfc64_seeded_as_numpy_low_half_first(seed):
    words = words_of(FastKeystream(seed), 1000)
    assert np.array_equal(words, halves(np.random.SFC64(seed).random_raw(500)))
    a, b, c, counter = (int(x) for x in np.random.SFC64(seed).state["state"]["state"])
    assert np.array_equal(words, halves(sfc64_reference(a, b, c, counter, 500)))


def test_fast_does_not_depend_on_odd_splits():
    whole = words_of(FastKeystream(11), 20_000)
    keystream = FastKeystream(11)
    sizes = np.random.default_rng(3).integers(0, 40, 400)
    sizes[::7] = 0  # empty fills, some of them while a half word is pending
    pieces = [words_of(keystream, int(size)) for size in sizes]
    pieces.append(words_of(keystream, 20_000 - int(sizes.sum())))
    assert np.array_equal(np.concatenate(pieces), whole)


def test_fast_words_are_uniform():
    # Chi-square over 256 cells, on the top byte and on the bottom byte of 2**20 words: a
    # fixed seed, so this either always passes or always fails; p below 1e-6 means a bug.
    words = words_of(FastKeystream(99), 1 << 20)
    for cells in (words >> 24, words & 0xFF):
        observed = np.bincount(cells, minlength=256)
        assert stats.chisquare(observed).pvalue > 1e-6
    # The two halves of an output are not the same word.
    assert np.mean(words[0::2] == words[1::2]) < 1e-3


def test_fast_refuses_other_arrays():
    with pytest.raises(TypeError):
        FastKeystream(1).fill(np.empty(4, np.uint64))
    with pytest.raises(TypeError):
        FastKeystream(1).fill(np.empty((2, 2), np.uint32))


def test_fast_is_reproducible_per_seed():
    assert np.array_equal(words_of(FastKeystream(1), 999), words_of(FastKeystream(1), 999))
    assert not np.array_equal(words_of(FastKeystream(1), 999), words_of(FastKeystream(2), 999))


def test_reprs_say_what_is_secure():
    assert "SFC64" in repr(FastKeystream(3))
    assert "not secure" in repr(FastKeystream(3))
    assert "simulation only" in repr(FastKeystream(3))
    assert KEY.hex() not in repr(AesCtrKeystream(KEY))
