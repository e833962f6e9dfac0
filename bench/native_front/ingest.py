"""The experiment's server process: Veil's own ingest (decode, targets, the store's group write)
behind front.cc, called once per gathered set of UploadRequests. Not part of Veil: it checks no
token and no rate, and takes the stores' group writes by their private names (README.md here).

    python ingest.py MODULE_DIR PORT_FILE STORE_URL
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench_ingest: the metric configs

from bench_ingest import config_dict  # noqa: E402

from veil.aggregator.config import parse_config  # noqa: E402
from veil.aggregator.decode import decode_upload  # noqa: E402
from veil.aggregator.instruments import Instruments  # noqa: E402
from veil.aggregator.service import CollectorService  # noqa: E402
from veil.aggregator.store import BatchWrite, Store, open_store  # noqa: E402
from veil.aggregator.store._redis import shard_of  # noqa: E402
from veil.wire.v1 import veil_pb2  # noqa: E402

GATHER = 256  # the most calls handed over at once: the stores' own group limit


def cell_config(url: str) -> dict[str, Any]:
    """The config of the experiment's one metric (k = 16, epsilon 1, bench_ingest's windows) on
    the store at url: what the load processes send, both Veil servers declare, compare.py checks."""
    return config_dict([16], [1.0], url)


def group_writer(store: Any, url: str) -> Callable[[Sequence[BatchWrite]], list[Any]]:
    """One group write per store group: SQLite writes every batch in one transaction; Redis
    writes each shard's batches in one script call (a batch's shard follows from its id)."""
    if url.startswith("sqlite"):
        return store._flush  # type: ignore[no-any-return]

    def write(writes: Sequence[BatchWrite]) -> list[Any]:
        groups: dict[int, list[int]] = {}
        for i, w in enumerate(writes):
            groups.setdefault(shard_of(w.batch_id, len(store._shard_tags(w.metric))), []).append(i)
        results: list[Any] = [None] * len(writes)
        for indices in groups.values():
            for i, result in zip(indices, store._observed_group([writes[i] for i in indices])):
                results[i] = result
        return results

    return write


def main(module_dir: str, port_file: str, url: str) -> None:
    sys.path.insert(0, module_dir)
    import native_front  # built by compare.py from front.cc

    config = parse_config(cell_config(url))
    store: Store = open_store(url)
    service = CollectorService(config, store, Instruments())
    metrics = {m.name: m for m in config.metrics}
    for metric in config.metrics:
        store.since(metric.name, metric.spec.fingerprint, int(time.time()))
    write = group_writer(store, url)

    def handle(bodies: list[bytes]) -> list[bytes]:
        now = time.time()
        requests = [veil_pb2.UploadRequest.FromString(body) for body in bodies]
        writes = []
        for request in requests:
            metric = metrics[request.metric]
            if request.spec_fingerprint != metric.spec.fingerprint:
                raise ValueError(f"stale fingerprint for {metric.name}")
            counts = decode_upload(request, metric.spec, max_reports=config.max_batch)
            targets = service._targets_at(metric, now)
            writes.append(BatchWrite(metric.name, request.batch_id, counts, targets, config.dedupe_ttl))
        answers = []
        for request, applied in zip(requests, write(writes)):
            if isinstance(applied, BaseException):
                raise applied
            answers.append(veil_pb2.UploadResponse(accepted=request.count, duplicate=not applied).SerializeToString())
        return answers

    native_front.serve(port_file, handle, GATHER)


if __name__ == "__main__":
    main(*sys.argv[1:4])
