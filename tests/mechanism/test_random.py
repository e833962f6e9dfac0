"""Random sources: the CSPRNG by default, exact integer decisions, Floyd sampling."""

from __future__ import annotations

import inspect
import json
import os
import random
from array import array
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from itertools import combinations

import pytest
from scipy import stats

from veil.mechanism import MechanismError, SubsetSpec, SystemRandomSource, WordRandomSource, _random, spec_for
from veil.mechanism._random import choose


def test_the_default_source_is_the_os_csprng():
    for name in ("subset", "rappor", "rappor-admissible", "krr"):
        default = inspect.signature(type(spec_for(name, 4, 1.0)).randomize).parameters["source"].default
        assert isinstance(default, SystemRandomSource)
    assert "os.urandom(" in inspect.getsource(SystemRandomSource)


def test_the_os_source_draws_from_os_words_as_the_word_source_does(monkeypatch):
    block = random.Random(7).randbytes(4 * _random._BLOCK_WORDS)
    monkeypatch.setattr(os, "urandom", lambda n: block[:n])
    _random._forget_blocks()
    try:
        system, replay = SystemRandomSource(), WordRandomSource(array("I", block) * 8)
        draws = [(system.below(n), system.bits64()) for n in range(1, 1500)]  # past the end of a block
        assert draws == [(replay.below(n), replay.bits64()) for n in range(1, 1500)]
    finally:
        _random._forget_blocks()


def test_the_os_source_is_uniform():
    source = SystemRandomSource()
    seen = Counter(source.below(6) for _ in range(60_000))
    assert sorted(seen) == list(range(6))
    assert stats.chisquare([seen[i] for i in range(6)]).pvalue > 1e-6


def test_threads_and_forked_children_never_share_os_words():
    source = SystemRandomSource()
    source.bits64()  # this thread now holds a block

    def draws() -> list[int]:
        return [source.bits64() for _ in range(8)]

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.submit(draws).result(), pool.submit(draws).result()
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # the child reports its next draws, which the parent is about to make too
        os.write(writer, json.dumps(draws()).encode())
        os._exit(0)
    os.close(writer)
    os.waitpid(child, 0)
    with os.fdopen(reader) as pipe:
        in_child = json.loads(pipe.read())
    ours = draws()
    assert len({tuple(first), tuple(second), tuple(in_child), tuple(ours)}) == 4


def test_word_source_below_is_lemire_and_exactly_uniform():
    n = 6
    words = [(i * 2654435761) % (1 << 32) for i in range(60_000)]
    source = WordRandomSource(words)
    seen = Counter(source.below(n) for _ in range(50_000))
    assert sorted(seen) == list(range(n))
    assert stats.chisquare([seen[i] for i in range(n)]).pvalue > 1e-4
    # The rejection branch: for n = 3, words whose product's low half is below
    # (2**32 - 3) mod 3 = 1 are redrawn; the word 0 is one of them.
    assert WordRandomSource([0, 5 << 30]).below(3) == ((5 << 30) * 3) >> 32
    assert WordRandomSource([5 << 30]).below(3) == ((5 << 30) * 3) >> 32


def test_word_source_bits64_and_running_out():
    source = WordRandomSource([1, 2])
    assert source.bits64() == (1 << 32) | 2
    with pytest.raises(MechanismError, match="ran out"):
        source.bits64()
    with pytest.raises(MechanismError):
        WordRandomSource([0]).below(0)


def test_floyd_choose_is_uniform_over_subsets():
    import random

    rng = random.Random(11)

    class Source:
        def below(self, n):
            return rng.randrange(n)

    n, m, draws = 6, 3, 60_000
    seen = Counter(tuple(sorted(choose(Source(), n, m))) for _ in range(draws))
    subsets = list(combinations(range(n), m))
    assert set(seen) == set(subsets)
    assert stats.chisquare([seen[s] for s in subsets]).pvalue > 1e-4


def test_a_subset_report_is_sorted_and_never_leads_with_the_truth_by_construction():
    spec = SubsetSpec(10, 0.5)
    source = WordRandomSource([(i * 40503 + 12345) % (1 << 32) for i in range(400_000)])
    firsts = Counter()
    for _ in range(5_000):
        report = spec.randomize(7, source)
        assert list(report) == sorted(set(report)) and len(report) == spec.q
        firsts[report[0]] += 1
    assert firsts[7] < 0.2 * sum(firsts.values())
