"""`veil serve --check-config`: good files pass, bad ones fail with one line naming the key."""

from __future__ import annotations

import subprocess
import sys

from veil_testing.config_toml import config_toml
from veil_testing.running import config_dict


def check(path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "veil.cli", "serve", "--config", str(path), "--check-config", *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_good_config_passes_and_reaches_its_store(tmp_path, redis_server):
    path = tmp_path / "veil.toml"
    path.write_text(config_toml(config_dict(redis_server.url)))
    out = check(path)
    assert out.returncode == 0 and "OK (5 metrics; store redis://127.0.0.1:" in out.stdout, out.stderr
    assert ": reachable)" in out.stdout


def test_bad_configs_fail_with_one_line(tmp_path):
    path = tmp_path / "veil.toml"
    path.write_text(config_toml(config_dict()).replace("epsilon = 1.0", "epsilon = -1.0", 1))
    out = check(path)
    assert out.returncode == 2 and out.stderr.strip().startswith("veil serve: metrics[0]: epsilon must be")
    assert len(out.stderr.strip().splitlines()) == 1
    # A RAPPOR metric at epsilon = 1e-9 used to pass here and then break every estimate.
    data = config_dict()
    data["metrics"] = [{**m, "epsilon": 1e-9} if m["mechanism"] == "rappor" else m for m in data["metrics"]]
    path.write_text(config_toml(data))
    out = check(path)
    assert out.returncode == 2 and out.stderr.strip() == (
        "veil serve: metrics[3]: epsilon must be a number from 0.0001 to 20, not 1e-09."
    )
    path.write_text(config_toml(config_dict()))
    out = check(path, "--store", "redis://127.0.0.1:1/0")  # a good config whose store is down here
    assert out.returncode == 0 and "not reachable from here" in out.stdout
    out = check(path, "--store", "redis://127.0.0.1:notaport/0")
    assert out.returncode == 2 and out.stderr.startswith("veil serve: store: Bad store URL")
    out = check(tmp_path / "missing.toml")
    assert out.returncode == 2 and "cannot read the config file" in out.stderr


def test_the_default_sqlite_store_is_checked_never_created(tmp_path):
    path = tmp_path / "veil.toml"
    data = config_dict()
    del data["store"]
    path.write_text(config_toml(data))
    out = check(path, "--data-dir", str(tmp_path / "data"))
    assert out.returncode == 0, out.stderr
    assert f"store sqlite://{tmp_path}/data/veil.db: usable)" in out.stdout
    assert not (tmp_path / "data").exists()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "veil.db").write_text("a text file, not a database" * 20)
    out = check(path, "--data-dir", str(tmp_path / "data"))
    assert out.returncode == 0 and "not usable (" in out.stdout and "is not a SQLite database" in out.stdout


def test_veil_store_check_finds_the_default_store_in_the_data_directory(tmp_path, capsys, monkeypatch):
    from veil.aggregator.counts import Counts
    from veil.aggregator.store import BatchWrite, CountsKey, SqliteStore
    from veil.cli import main

    monkeypatch.delenv("VEIL_STORE_URL", raising=False)
    monkeypatch.delenv("VEIL_CONFIG", raising=False)
    assert main(["store", "check", "--data-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out == f"{tmp_path}/veil.db: NOT OK: There is no SQLite store at {tmp_path}/veil.db.\n"
    store = SqliteStore(tmp_path / "veil.db")
    total = CountsKey("browser", "fp", "total", 0)
    store.add(BatchWrite("browser", b"\x01" * 16, Counts((2,), [7], [[3, 4, 0]]), ((total, None),), 3600))
    store.close()
    monkeypatch.setenv("VEIL_DATA_DIR", str(tmp_path))
    assert main(["store", "check"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{tmp_path}/veil.db: OK" and out[2:] == [
        "  batch ids: 1 remembered, 0 expired and not yet purged",
        "  browser [total]: 1 bucket, 7 reports",
    ]
