"""Tests of flyarchive.testing.s3: moto on loopback and the fault-injecting proxy.

Everything goes over HTTP to a moto server process started by the tests.
"""

from __future__ import annotations

import http.client
import itertools
import os
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

import botocore.exceptions  # noqa: E402
import fsspec  # noqa: E402
import zarr  # noqa: E402

from flyarchive.testing.faultproxy import FaultPlan, FaultProxy  # noqa: E402
from flyarchive.testing.s3 import S3Server, S3ServerStartError  # noqa: E402

pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]

_bucket_ids = itertools.count()
# A SigV4-shaped header: moto refuses anonymous GET/HEAD but does not check signatures.
_AUTH = {
    "Authorization": "AWS4-HMAC-SHA256 Credential=k/20260101/us-east-1/s3/aws4_request, "
    "SignedHeaders=host, Signature=00"
}
# What s3fs/botocore raise once their retries are spent.
_S3_FAILURES = (OSError, botocore.exceptions.BotoCoreError)


@pytest.fixture(scope="module")
def server(s3_server: S3Server) -> S3Server:
    """The run's shared server (tests/conftest.py); the lifecycle tests start their own."""
    return s3_server


@pytest.fixture
def bucket(server: S3Server) -> str:
    name = f"test-bucket-{next(_bucket_ids)}"
    server.create_bucket(name)
    return name


@pytest.fixture
def proxy(server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(server.endpoint_url) as p:
        yield p


def _connect(proxy: FaultProxy) -> http.client.HTTPConnection:
    host, port = proxy.endpoint_url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=30)


def _zarr_store(storage_options: dict, url: str) -> zarr.storage.FsspecStore:
    return zarr.storage.FsspecStore.from_url(url, storage_options=storage_options)


# --------------------------------------------------------------------------- server


def test_server_round_trips_bytes_through_s3fs(server: S3Server, bucket: str) -> None:
    expected = b"kinematic state\x00\xff" * 100
    fs = server.filesystem()

    fs.pipe(f"{bucket}/blob.bin", expected)
    actual = server.filesystem().cat(f"{bucket}/blob.bin")

    assert actual == expected


def test_storage_options_work_with_fsspec_filesystem(server: S3Server, bucket: str) -> None:
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **server.storage_options())

    fs.pipe(f"{bucket}/x.txt", b"abc")

    assert fs.cat_file(f"{bucket}/x.txt", start=1, end=3) == b"bc"


def test_zarr_array_round_trips_through_fsspec_store(server: S3Server, bucket: str) -> None:
    url = f"s3://{bucket}/a.zarr"
    expected = np.arange(120, dtype="float64").reshape(3, 40)
    written = zarr.create_array(
        _zarr_store(server.storage_options(), url), shape=(3, 40), chunks=(1, 16), dtype="float64"
    )
    written[:] = expected

    actual = zarr.open_array(_zarr_store(server.storage_options(), url), mode="r")[:]

    np.testing.assert_array_equal(actual, expected)


def test_create_bucket_refuses_short_name(server: S3Server) -> None:
    with pytest.raises(ValueError, match="'ab'.*3 to 63 characters"):
        server.create_bucket("ab")


def test_stop_ends_the_server_process() -> None:
    server = S3Server().start()
    proc = server._proc
    assert proc is not None

    server.stop()

    assert proc.poll() is not None
    with pytest.raises(RuntimeError, match="not running"):
        server.endpoint_url


def test_context_exit_on_error_ends_the_server_process() -> None:
    with pytest.raises(KeyError), S3Server() as server:
        proc = server._proc
        raise KeyError("boom")

    assert proc is not None and proc.poll() is not None


def test_start_failure_reports_server_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho 'cannot bind, says the fake server' >&2\nexit 3\n")
    fake_python.chmod(fake_python.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sys, "executable", os.fspath(fake_python))

    with pytest.raises(S3ServerStartError, match="(?s)code 3.*cannot bind, says the fake server"):
        S3Server(startup_timeout_s=10).start()


# --------------------------------------------------------------------------- plan


def test_fault_plan_refuses_probabilities_summing_above_one() -> None:
    with pytest.raises(ValueError, match="sum to"):
        FaultPlan(error500=0.6, error503=0.6)


def test_fault_plan_refuses_negative_probability() -> None:
    with pytest.raises(ValueError, match="FaultPlan.drop"):
        FaultPlan(drop=-0.1)


def test_fault_plan_chooses_kinds_in_order() -> None:
    plan = FaultPlan(drop=0.1, error500=0.2, error503=0.3, delay=0.1)

    actual = [plan.choose(u) for u in (0.05, 0.15, 0.45, 0.65, 0.75)]

    assert actual == ["drop", "error500", "error503", "delay", None]


# --------------------------------------------------------------------------- proxy, no faults


def test_proxy_without_faults_round_trips_zarr(proxy: FaultProxy, bucket: str) -> None:
    url = f"s3://{bucket}/p.zarr"
    expected = np.random.default_rng(0).normal(size=(4, 50))
    written = zarr.create_array(
        _zarr_store(proxy.storage_options(), url), shape=(4, 50), chunks=(2, 20), dtype="float64"
    )
    written[:] = expected

    actual = zarr.open_array(_zarr_store(proxy.storage_options(), url), mode="r")[:]

    np.testing.assert_array_equal(actual, expected)
    stats = proxy.stats()
    assert stats["faults"] == 0
    assert stats["forwarded"] == stats["requests"] > 0


def test_proxy_forwards_large_put_with_expect_continue(proxy: FaultProxy, bucket: str) -> None:
    expected = bytes(range(256)) * 8192  # 2 MiB: botocore sends Expect: 100-continue
    fs = proxy.filesystem()

    fs.pipe(f"{bucket}/big.bin", expected)

    assert fs.cat(f"{bucket}/big.bin") == expected


def test_proxy_decodes_chunked_request_body(
    proxy: FaultProxy, server: S3Server, bucket: str
) -> None:
    conn = _connect(proxy)
    conn.putrequest("PUT", f"/{bucket}/chunked.bin")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for part in (b"abc", b"defgh", b""):
        conn.send(b"%x\r\n%s\r\n" % (len(part), part))

    status = conn.getresponse().status

    assert status == 200
    assert server.filesystem().cat(f"{bucket}/chunked.bin") == b"abcdefgh"


def test_proxy_keeps_connection_alive_for_head_and_range_get(
    proxy: FaultProxy, bucket: str
) -> None:
    proxy.filesystem().pipe(f"{bucket}/r.bin", b"0123456789")
    proxy.reset_stats()
    conn = _connect(proxy)

    conn.request("HEAD", f"/{bucket}/r.bin", headers=_AUTH)
    head = conn.getresponse()
    head_body = head.read()
    conn.request("GET", f"/{bucket}/r.bin", headers={"Range": "bytes=2-4", **_AUTH})
    ranged = conn.getresponse()

    assert (head.status, head.getheader("Content-Length"), head_body) == (200, "10", b"")
    assert (ranged.status, ranged.read()) == (206, b"234")
    assert proxy.stats()["requests"] == 2


def test_proxy_counts_body_bytes_each_way(proxy: FaultProxy, bucket: str) -> None:
    fs = proxy.filesystem()
    fs.pipe(f"{bucket}/b.bin", b"x" * 1000)
    proxy.reset_stats()

    fs.pipe(f"{bucket}/c.bin", b"y" * 300)
    ranged = fs.cat_file(f"{bucket}/b.bin", start=100, end=350)

    assert len(ranged) == 250
    stats = proxy.stats()
    assert stats["bytes_in"] == 300
    assert stats["bytes_out"] == 250  # the range (a PUT is answered without a body)


# --------------------------------------------------------------------------- proxy, faults


def test_proxy_503_on_every_request_fails_read_and_is_counted(
    proxy: FaultProxy, bucket: str
) -> None:
    fs = proxy.filesystem(retries=2, botocore_attempts=2)
    fs.pipe(f"{bucket}/f.bin", b"data")
    proxy.plan = FaultPlan(error503=1.0)
    proxy.reset_stats()

    with pytest.raises(_S3_FAILURES):
        proxy.filesystem(retries=2, botocore_attempts=2).cat(f"{bucket}/f.bin")

    stats = proxy.stats()
    assert stats["error503"] == stats["faults"] == stats["requests"] >= 2
    assert stats["forwarded"] == 0


def test_proxy_500_answer_is_an_s3_xml_error(proxy: FaultProxy, bucket: str) -> None:
    proxy.plan = FaultPlan(error500=1.0)
    conn = _connect(proxy)

    conn.request("GET", f"/{bucket}/missing.bin", headers=_AUTH)
    response = conn.getresponse()

    assert response.status == 500
    assert b"<Code>InternalError</Code>" in response.read()


def test_proxy_drop_closes_connection_without_response(proxy: FaultProxy, bucket: str) -> None:
    proxy.plan = FaultPlan(drop=1.0)
    conn = _connect(proxy)

    conn.request("GET", f"/{bucket}/any.bin", headers=_AUTH)

    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        conn.getresponse()
    assert proxy.stats()["drop"] == 1


def test_proxy_delay_still_forwards(proxy: FaultProxy, bucket: str) -> None:
    fs = proxy.filesystem()
    fs.pipe(f"{bucket}/d.bin", b"late")
    proxy.plan = FaultPlan(delay=1.0, delay_s=0.01)

    actual = fs.cat(f"{bucket}/d.bin")

    assert actual == b"late"
    assert proxy.stats()["delay"] >= 1


def test_proxy_faults_only_listed_methods(proxy: FaultProxy, bucket: str) -> None:
    fs = proxy.filesystem(retries=1, botocore_attempts=1)
    fs.pipe(f"{bucket}/m.bin", b"ok")
    proxy.plan = FaultPlan(error500=1.0, methods=frozenset({"PUT"}))

    assert fs.cat(f"{bucket}/m.bin") == b"ok"
    with pytest.raises(_S3_FAILURES):
        fs.pipe(f"{bucket}/m2.bin", b"no")


def test_retries_under_moderate_faults_never_return_wrong_bytes(
    proxy: FaultProxy, server: S3Server, bucket: str
) -> None:
    payloads = {f"{bucket}/obj-{i}.bin": bytes([i]) * (1000 + 37 * i) for i in range(12)}
    proxy.plan = FaultPlan(error500=0.1, error503=0.1, drop=0.05, seed=3)
    fs = proxy.filesystem(retries=3, botocore_attempts=3)
    written = []
    for path, data in payloads.items():
        try:
            fs.pipe(path, data)
            written.append(path)
        except _S3_FAILURES:
            pass

    read: dict[str, bytes] = {}
    for path in written:
        try:
            read[path] = fs.cat(path)
        except _S3_FAILURES:
            pass

    assert proxy.stats()["faults"] > 0
    assert read, "retries recovered nothing: the fault rate is too high for this test"
    assert all(read[path] == payloads[path] for path in read)
    direct = server.filesystem()
    assert all(direct.cat(path) == payloads[path] for path in written)


def test_filesystem_ignores_proxy_environment(
    server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    fs = server.filesystem(retries=1, botocore_attempts=1)

    fs.pipe(f"{bucket}/p.bin", b"direct")

    assert fs.cat(f"{bucket}/p.bin") == b"direct"


def test_proxy_never_forwards_a_truncated_body(
    proxy: FaultProxy, server: S3Server, bucket: str
) -> None:
    conn = _connect(proxy)
    conn.putrequest("PUT", f"/{bucket}/cut.bin")
    conn.putheader("Content-Length", "10")
    conn.endheaders(b"abcd")
    conn.sock.shutdown(socket.SHUT_WR)  # the client gives up after 4 of 10 bytes

    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        conn.getresponse()
    assert not server.filesystem().exists(f"{bucket}/cut.bin")


def test_zarr_reads_under_moderate_faults_are_right_or_raise(
    proxy: FaultProxy, server: S3Server, bucket: str
) -> None:
    url = f"s3://{bucket}/f.zarr"
    expected = np.arange(400, dtype="float64").reshape(20, 20)
    written = zarr.create_array(
        _zarr_store(server.storage_options(), url), shape=(20, 20), chunks=(5, 5), dtype="float64"
    )
    written[:] = expected
    options = proxy.storage_options(botocore_attempts=3)
    outcomes = []
    for seed in range(3):
        proxy.plan = FaultPlan(error500=0.1, error503=0.1, seed=seed)
        try:
            actual = zarr.open_array(_zarr_store(options, url), mode="r")[:]
            outcomes.append(np.array_equal(actual, expected))
        except _S3_FAILURES:
            outcomes.append(None)  # raising is allowed; wrong values are not

    assert proxy.stats()["faults"] > 0
    assert False not in outcomes
