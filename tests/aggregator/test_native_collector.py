"""The native collector (server.native_grpc) over real gRPC: the same answers as the main
listener (counts exactly once, statuses, tokens, rate limits with their hint, TLS), the calls it
refuses before reading, a stop that lets a call in progress finish, and several worker
processes sharing its port."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from veil_testing.pki import Pki
from veil_testing.processes import free_port
from veil_testing.running import (
    OTHER_UPLOAD_TOKEN,
    READ_TOKEN,
    UPLOAD_TOKEN,
    auth_section,
    bearer,
    config_dict,
    counted,
    estimates,
    make_upload,
)
from veil_testing.waiting import wait_until

from veil.aggregator._auth import BUDGET_REFUSAL, BUDGET_RETRY_MS, BUDGET_WAIT
from veil.aggregator.config import parse_config
from veil.aggregator.daemon import Aggregator, max_message_bytes
from veil.aggregator.errors import ConfigError
from veil.aggregator.store import MemoryStore
from veil.client import Reporter
from veil.mechanism import SeededRandomSource
from veil.wire.v1 import veil_pb2, veil_pb2_grpc

NATIVE = "127.0.0.1:0"


def stub(aggregator, credentials: grpc.ChannelCredentials | None = None) -> veil_pb2_grpc.CollectorStub:
    address = f"127.0.0.1:{aggregator.native_grpc_port}"
    channel = grpc.insecure_channel(address) if credentials is None else grpc.secure_channel(address, credentials)
    return veil_pb2_grpc.CollectorStub(channel)


def refusal(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call(*args, timeout=10, **kwargs)
    return err.value


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store_url(request, tmp_path):
    if request.param == "memory":
        return "memory"
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'veil.db'}"
    return request.getfixturevalue("redis_server").url


def test_uploads_from_many_callers_count_exactly_once_with_their_retries(start_aggregator, store_url):
    aggregator = start_aggregator(store_url, native_grpc=NATIVE)
    assert aggregator.native_grpc_port not in (None, 0, aggregator.grpc_port)
    collector = stub(aggregator)
    uploads = [make_upload("os", 10, seed=i) for i in range(40)]
    answers: list = []

    def send(part: list) -> None:
        for request in part:
            answers.append(collector.Upload(request, timeout=10))
            answers.append(collector.Upload(request, timeout=10))  # a retry of an answered batch

    threads = [threading.Thread(target=send, args=(uploads[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 80 and all(a.accepted == 10 for a in answers)
    assert sum(a.duplicate for a in answers) == 40
    assert counted(aggregator, "os") == 400
    # The estimates, served by the main listener, see them.
    (total,) = estimates(f"127.0.0.1:{aggregator.grpc_port}", "os", "total").estimates
    assert total.n == 400


def test_the_sdk_reports_through_the_native_listener(start_aggregator):
    aggregator = start_aggregator(native_grpc=NATIVE)
    n = 3000
    with Reporter(
        f"127.0.0.1:{aggregator.native_grpc_port}",
        tls=False,
        memoize=False,
        random_source=SeededRandomSource(3),
        max_queue_size=n + 1,
        max_batch_size=100,
    ) as reporter:
        assert reporter.wait_for_specs(10)
        for i in range(n):
            reporter.report("browser", i % 4)
        assert reporter.force_flush(60), reporter.counters()
        assert reporter.counters().sent == n
    assert counted(aggregator, "browser") == n


def test_refusals_carry_the_main_listeners_statuses(start_aggregator):
    aggregator = start_aggregator(native_grpc=NATIVE)
    collector = stub(aggregator)
    undeclared = refusal(collector.Upload, veil_pb2.UploadRequest(metric="nope", count=1))
    assert undeclared.code() == grpc.StatusCode.FAILED_PRECONDITION and "'nope' is not declared" in undeclared.details()
    stale = make_upload("os", 10)
    stale.spec_fingerprint = "0" * 16
    assert refusal(collector.Upload, stale).code() == grpc.StatusCode.FAILED_PRECONDITION
    bad = make_upload("os", 10)
    bad.count = 11  # claims more reports than it holds
    assert refusal(collector.Upload, bad).code() == grpc.StatusCode.INVALID_ARGUMENT
    unparsable = grpc.insecure_channel(f"127.0.0.1:{aggregator.native_grpc_port}").unary_unary(
        "/veil.wire.v1.Collector/Upload"
    )
    assert refusal(unparsable, b"\xff\xff\xff").code() == grpc.StatusCode.INVALID_ARGUMENT
    specs = grpc.insecure_channel(f"127.0.0.1:{aggregator.native_grpc_port}").unary_unary(
        "/veil.wire.v1.Collector/GetMetricSpecs"
    )
    assert refusal(specs, b"\xff\xff\xff").code() == grpc.StatusCode.INVALID_ARGUMENT
    good = collector.Upload(make_upload("os", 10), timeout=10)
    assert good.accepted == 10 and counted(aggregator, "os") == 10
    # Health, reflection and Estimates stay on the main listener.
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{aggregator.native_grpc_port}"))
    unimplemented = refusal(health.Check, health_pb2.HealthCheckRequest())
    assert unimplemented.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "main gRPC listener" in unimplemented.details()


def test_tokens_and_rate_limits_are_the_main_listeners(start_aggregator):
    aggregator = start_aggregator(
        native_grpc=NATIVE, max_batch=500, sections={"auth": auth_section(rate_limit=200, rate_burst=1000)}
    )
    collector = stub(aggregator)
    assert refusal(collector.Upload, make_upload("os", 10)).code() == grpc.StatusCode.UNAUTHENTICATED
    wrong = refusal(collector.Upload, make_upload("os", 10), metadata=bearer("not-a-token-0123456789"))
    assert wrong.code() == grpc.StatusCode.UNAUTHENTICATED
    reader = refusal(collector.Upload, make_upload("os", 10), metadata=bearer(READ_TOKEN))
    assert reader.code() == grpc.StatusCode.PERMISSION_DENIED
    scope = refusal(collector.Upload, make_upload("os", 10), metadata=bearer(OTHER_UPLOAD_TOKEN))
    assert scope.code() == grpc.StatusCode.PERMISSION_DENIED and "may not report metric 'os'" in scope.details()
    specs = collector.GetMetricSpecs(veil_pb2.GetMetricSpecsRequest(), metadata=bearer(UPLOAD_TOKEN), timeout=10)
    assert sorted(s.name for s in specs.specs) == ["browser", "os"]  # an upload token sees its metrics only
    assert refusal(collector.GetMetricSpecs, veil_pb2.GetMetricSpecsRequest()).code() == grpc.StatusCode.UNAUTHENTICATED

    first, second, third = (make_upload("browser", 500, seed=s) for s in (1, 2, 3))
    assert collector.Upload(first, metadata=bearer(UPLOAD_TOKEN), timeout=10).accepted == 500
    assert collector.Upload(second, metadata=bearer(UPLOAD_TOKEN), timeout=10).accepted == 500
    limited = refusal(collector.Upload, third, metadata=bearer(UPLOAD_TOKEN))
    assert limited.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    wait = int(dict(limited.trailing_metadata())["retry-after-ms"])
    assert 0 < wait <= 2500 and f"retry after {wait} ms with the same batch id" in limited.details()
    time.sleep(wait / 1000)
    assert not collector.Upload(third, metadata=bearer(UPLOAD_TOKEN), timeout=10).duplicate
    assert counted(aggregator, "browser") == 1500


def test_a_store_that_is_down_is_unavailable_and_the_retry_counts_once(start_aggregator, make_redis_server):
    redis = make_redis_server(appendonly=True, appendfsync="always")
    aggregator = start_aggregator(redis.url, native_grpc=NATIVE)
    collector = stub(aggregator)
    assert collector.Upload(make_upload("os", 10), timeout=10).accepted == 10
    redis.kill()
    retried = make_upload("os", 10, batch_id=b"r" * 16)
    down = refusal(collector.Upload, retried)
    assert down.code() == grpc.StatusCode.UNAVAILABLE and "same batch id" in down.details()
    redis.start()
    deadline = time.monotonic() + 30
    while True:
        try:
            reply = collector.Upload(retried, timeout=10)
            break
        except grpc.RpcError as err:  # until the health ping sees the store again
            assert err.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline
            time.sleep(0.2)
    assert not reply.duplicate and counted(aggregator, "os") == 20


def test_tls_and_mutual_tls_from_the_configured_files(start_aggregator, pki: Pki):
    plain = start_aggregator(native_grpc=NATIVE, sections={"tls": pki.tls_section()})
    assert stub(plain, pki.channel_credentials()).Upload(make_upload("os", 10), timeout=10).accepted == 10
    assert refusal(stub(plain).Upload, make_upload("os", 10)).code() == grpc.StatusCode.UNAVAILABLE
    distrusting = stub(plain, pki.channel_credentials(ca=pki.other_ca))
    assert refusal(distrusting.Upload, make_upload("os", 10)).code() == grpc.StatusCode.UNAVAILABLE

    mutual = start_aggregator(native_grpc=NATIVE, sections={"tls": pki.tls_section(mutual=True)})
    good = stub(mutual, pki.channel_credentials(client="good"))
    assert good.Upload(make_upload("os", 10), timeout=10).accepted == 10
    for credentials in (pki.channel_credentials(), pki.channel_credentials(client="other")):
        assert refusal(stub(mutual, credentials).Upload, make_upload("os", 10)).code() == grpc.StatusCode.UNAVAILABLE
    assert counted(plain, "os") == 10 and counted(mutual, "os") == 10


class _HeldStore(MemoryStore):
    """A memory store whose group writes wait until released: calls stay in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.add_many_calls = 0

    def add_many(self, writes):
        self.add_many_calls += 1
        self.entered.set()
        assert self.release.wait(30)
        return super().add_many(writes)


def _held_aggregator(**server) -> tuple[Aggregator, _HeldStore]:
    store = _HeldStore()
    aggregator = Aggregator(parse_config(config_dict(native_grpc=NATIVE, **server)), store=store)
    aggregator.start()
    return aggregator, store


def test_calls_beyond_the_inflight_budget_wait_their_turn_unread_then_are_refused_with_a_hint():
    limit = max_message_bytes(parse_config(config_dict()))
    aggregator, store = _held_aggregator(max_inflight_bytes=limit)  # room to read one call at a time
    try:
        collector = stub(aggregator)
        first = collector.Upload.future(make_upload("os", 10, seed=1), timeout=30)
        assert store.entered.wait(10)  # read, and held in the store
        second = collector.Upload.future(make_upload("os", 10, seed=2), timeout=30)
        gone = collector.Upload.future(make_upload("os", 10, seed=3), timeout=1)  # its caller leaves while waiting
        time.sleep(0.5)
        assert not second.done()  # waiting for the budget, unread
        with pytest.raises(grpc.RpcError) as left:
            gone.result()
        assert left.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        store.release.set()
        assert first.result().accepted == 10 and second.result().accepted == 10  # its turn came
        assert counted(aggregator, "os") == 20  # the one that left counted nothing

        store.release.clear()
        held = collector.Upload.future(make_upload("os", 10, seed=4), timeout=30)
        assert wait_until(lambda: store.add_many_calls == 3)
        started = time.monotonic()
        busy = refusal(collector.Upload, make_upload("os", 10, seed=5))  # waits BUDGET_WAIT in vain
        assert time.monotonic() - started >= BUDGET_WAIT - 0.5
        assert busy.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and busy.details() == BUDGET_REFUSAL
        assert int(dict(busy.trailing_metadata())["retry-after-ms"]) == BUDGET_RETRY_MS
        store.release.set()
        assert held.result().accepted == 10 and counted(aggregator, "os") == 30
    finally:
        store.release.set()
        aggregator.stop(grace=0)


def test_stop_lets_a_call_in_progress_finish_within_the_grace_period():
    aggregator, store = _held_aggregator()
    collector = stub(aggregator)
    call = collector.Upload.future(make_upload("os", 10), timeout=30)
    assert store.entered.wait(10)
    stopping = threading.Thread(target=aggregator.stop, kwargs={"grace": 10})
    stopping.start()
    time.sleep(0.3)
    assert stopping.is_alive()  # waits for the call
    store.release.set()
    assert call.result().accepted == 10
    stopping.join(15)
    assert not stopping.is_alive()
    assert counted(aggregator, "os") == 10
    with pytest.raises(grpc.RpcError):
        collector.Upload(make_upload("os", 10), timeout=2)  # the listener is closed


def test_the_config_checks_the_address_and_the_port_of_several_processes(monkeypatch):
    with pytest.raises(ConfigError, match="server.native_grpc: expected host:port"):
        parse_config(config_dict(native_grpc="nowhere"))
    with pytest.raises(ConfigError, match="server.native_grpc: port 0 gives each"):
        parse_config(config_dict("redis://127.0.0.1:1", grpc_port=free_port(), processes=2, native_grpc=NATIVE))
    assert parse_config(config_dict()).native_grpc_address == ""
    busy = Aggregator(parse_config(config_dict(native_grpc=NATIVE)))
    try:
        taken = f"127.0.0.1:{busy.native_grpc_port}"
        with pytest.raises(ConfigError, match=f"server.native_grpc: cannot listen on {taken}"):
            Aggregator(parse_config(config_dict(native_grpc=taken)))
    finally:
        busy.stop(grace=0)
    monkeypatch.setitem(__import__("sys").modules, "veil.aggregator._native_collector", None)
    with pytest.raises(ConfigError, match="run `make native`"):
        Aggregator(parse_config(config_dict(native_grpc=NATIVE)))


def test_two_worker_processes_share_the_native_port_and_count_exactly(redis_server, serve_process):
    port = free_port()
    serve = serve_process(redis_server.url, server={"processes": 2, "native_grpc": f"127.0.0.1:{port}"}).start()
    assert sorted(line["native_grpc_port"] for line in serve.log_lines() if line["msg"] == "aggregator started") == [
        port,
        port,
    ]
    channels = [
        grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(8)
    ]
    try:
        for seed, channel in enumerate(channels):
            collector = veil_pb2_grpc.CollectorStub(channel)
            for i in range(5):
                request = make_upload("os", 10, seed=seed * 100 + i)
                assert not collector.Upload(request, timeout=30).duplicate
                assert collector.Upload(request, timeout=30).duplicate
    finally:
        for channel in channels:
            channel.close()
    (total,) = estimates(serve.endpoint, "os", "total").estimates
    assert total.n == 8 * 5 * 10
    log = serve.log_text()
    assert f"share gRPC {serve.endpoint} and the native collector 127.0.0.1:{port}" in log
    assert log.count(f"serving gRPC on port {serve.grpc_port}, the native collector on port {port}") == 2


def test_check_config_passes_where_the_native_collector_is_built(tmp_path):
    from test_cli_serve import check  # a process of its own
    from veil_testing.config_toml import config_toml

    path = tmp_path / "veil.toml"
    path.write_text(config_toml(config_dict(native_grpc="127.0.0.1:50052")))
    out = check(path)
    assert out.returncode == 0, out.stderr


def test_a_set_answers_each_call_on_its_own(start_aggregator, store_url):
    """What the C++ side hands over at once: calls not yet read (checked by their metadata: the
    admitted named by their token), and calls read: good uploads, a batch twice, a caller that
    left, bytes that do not parse, a token withdrawn meanwhile, a specs call; each answered on its
    own (the set as the listener's serve thread passes it)."""
    aggregator = start_aggregator(store_url, native_grpc=NATIVE, sections={"auth": auth_section()})
    token = bearer(UPLOAD_TOKEN)[0][1]
    twice = make_upload("os", 10, seed=1).SerializeToString()
    calls = [
        (False, 0, (token,), "", True, b""),
        (False, 0, (), "", True, b""),  # no token: refused unread
        (False, 1, (bearer(READ_TOKEN)[0][1],), "", True, b""),  # a read token may fetch specs
        (False, 0, (bearer(READ_TOKEN)[0][1],), "", True, b""),  # but not upload
        (True, 0, (), "app-a", True, twice),
        (True, 0, (), "app-a", True, make_upload("browser", 10, seed=2).SerializeToString()),
        (True, 0, (), "app-a", True, twice),
        (True, 0, (), "app-a", False, make_upload("os", 10, seed=4).SerializeToString()),  # its caller left
        (True, 0, (), "app-a", True, b"\xff"),
        (True, 0, (), "withdrawn", True, make_upload("os", 10, seed=5).SerializeToString()),
        (True, 1, (), "app-a", True, b""),
    ]
    replies = aggregator._native._answer(calls)
    codes = [code for code, _, _, _ in replies]
    assert codes == [
        0,
        grpc.StatusCode.UNAUTHENTICATED.value[0],
        0,
        grpc.StatusCode.PERMISSION_DENIED.value[0],
        0,
        0,
        0,
        grpc.StatusCode.CANCELLED.value[0],
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
        grpc.StatusCode.UNAUTHENTICATED.value[0],
        0,
    ]
    assert (replies[0][2], replies[2][2]) == (b"app-a", b"dashboard")  # admitted, as these tokens
    first, other, again = (veil_pb2.UploadResponse.FromString(body) for _, _, body, _ in replies[4:7])
    assert (first.duplicate, other.duplicate, again.duplicate) == (False, False, True)
    specs = veil_pb2.GetMetricSpecsResponse.FromString(replies[-1][2])
    assert sorted(s.name for s in specs.specs) == ["browser", "os"]
    assert counted(aggregator, "os") == 10 and counted(aggregator, "browser") == 10
