"""The TypeScript SDK's strings reports against a real aggregator (docs/protocol.md 10): a Node
device reports a string each period while the rounds open, answered by the aggregator's own
rounds (the other rounds fed by hashed uploads made here, so every round has parents), until its
round is served; its report is counted in its round, exactly once, over HTTP and gRPC."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from veil_testing.node import NodeReporter

from veil.aggregator.rounds import Rounds
from veil.mechanism import ROUNDS, SeededRandomSource, string_code
from veil.wire.v1 import veil_pb2

PERIOD = 3


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["http", "grpc"])
def test_a_typescript_device_is_counted_in_its_round_of_a_strings_metric(start_aggregator, wire):
    strings = {"name": "crash", "type": "strings", "epsilon": 4.0, "period": f"{PERIOD}s"}
    aggregator = start_aggregator(sections={"metrics": [strings]}, min_n=1)
    s = aggregator.config.strings[0]
    address = (
        {"http": f"http://127.0.0.1:{aggregator.http_port}"}
        if wire == "http"
        else {"grpc": f"127.0.0.1:{aggregator.grpc_port}"}
    )
    node = NodeReporter(**address, specTtlMs=100, scheduleDelayMs=20)
    source = SeededRandomSource(9)
    code = string_code("SIGSEGV")
    sent = 0
    try:
        turn = None
        deadline = time.monotonic() + (ROUNDS + 4) * PERIOD
        while sent == 0 and time.monotonic() < deadline:
            period = int(time.time() // PERIOD)
            if period == turn or time.time() - period * PERIOD < 0.5:  # half a second in: rounds fixed
                time.sleep(0.05)
                continue
            turn = period
            for metric in aggregator.rounds.current(time.time()):  # 50 answers of SIGSEGV in each round
                words = b"".join(
                    np.array(
                        metric.spec.mechanism.randomize_prefix(metric.spec.strings.prefix_of(code), source), "<u4"
                    ).tobytes()
                    for _ in range(50)
                )
                request = veil_pb2.UploadRequest(
                    batch_id=os.urandom(16),
                    metric=metric.name,
                    spec_fingerprint=metric.spec.fingerprint,
                    count=50,
                    hashed=veil_pb2.HashedReports(words=words),
                    made_unix=period * PERIOD,
                )
                assert aggregator.collector.ingest.upload(request).counted
            node.report("crash", "SIGSEGV")
            answer = node.ask(do="flush", timeoutMs=10_000)
            sent = answer["counters"]["sent"]
        assert sent == 1 and answer["counters"]["failed"] == 0, answer
        # Counted once, in one round: 50 reports of ours in every served round, and its one more.
        now = int(time.time() // PERIOD)
        extra = []
        for period in range(now - ROUNDS - 4, now + 1):
            for r in range(ROUNDS):
                metric = aggregator.rounds.round(s, period, r)
                if metric is None:
                    continue
                counts = aggregator.store.read(Rounds.key(metric, period), (0,), metric.spec.k)
                if counts.total % 50:
                    extra.append((period, r, counts.total))
        assert len(extra) == 1 and extra[0][2] % 50 == 1, extra
    finally:
        node.close()
