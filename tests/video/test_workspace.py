"""Parts and scratch folders of render runs: removed once their owner is dead, never while
it lives (real processes, a real S3 server on loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from flyarchive.video.workspace import STALE_S, RunFolder

SCRATCH = """
import sys, time
from flyarchive.video.workspace import scratch_dir
print(scratch_dir(), flush=True)
if sys.argv[1] == "wait":
    time.sleep(600)
"""


def start_scratch(tmp: Path, wait: bool) -> tuple[subprocess.Popen[str], Path]:
    """A process that makes its scratch folder under ``tmp``, then waits (or exits)."""
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-c", SCRATCH, "wait" if wait else "exit"],
                            stdout=subprocess.PIPE, text=True, env=env)
    return proc, Path(proc.stdout.readline().strip())


def test_scratch_folder_of_a_killed_process_is_removed_by_the_next_one(tmp_path):
    killed, theirs = start_scratch(tmp_path, wait=True)
    killed.kill()
    killed.wait()
    assert theirs.is_dir()

    nxt, mine = start_scratch(tmp_path, wait=False)
    nxt.wait()

    assert not theirs.exists()
    assert not mine.exists()  # removed at its normal exit
    assert list(tmp_path.iterdir()) == []


def test_scratch_folder_of_a_live_process_is_kept(tmp_path):
    live, theirs = start_scratch(tmp_path, wait=True)
    try:
        nxt, _ = start_scratch(tmp_path, wait=False)
        nxt.wait()

        assert theirs.is_dir()
    finally:
        live.kill()
        live.wait()


def test_parts_folder_without_a_lock_is_removed_only_once_old(tmp_path):
    out = tmp_path / "v"
    legacy = out / ".parts-0123456789ab"
    (legacy / "world00000").mkdir(parents=True)
    (legacy / "world00000" / "front.000000000.mp4").write_bytes(b"segment")
    with RunFolder.create(str(out)):
        pass
    kept = legacy.is_dir()
    old = time.time() - 3600
    os.utime(legacy, (old, old))

    with RunFolder.create(str(out)):
        pass

    assert kept
    assert not legacy.exists()


def test_failed_run_removes_its_parts_and_the_output_folder_it_made(tmp_path):
    out = tmp_path / "new" / "v"

    with pytest.raises(KeyError):
        with RunFolder.create(str(out)) as run:
            (Path(run.url) / "world00000").mkdir()
            raise KeyError("a render error")

    assert not out.exists()


def test_failed_run_keeps_an_output_folder_that_was_there(tmp_path):
    out = tmp_path / "v"
    out.mkdir()

    with pytest.raises(KeyError):
        with RunFolder.create(str(out)):
            raise KeyError("a render error")

    assert out.is_dir() and list(out.iterdir()) == []


# ----------------------------------------------------------------------------- object stores
def put_run(fs, out: str, *, host: str, pid: int, age_s: float) -> str:
    """A parts folder on S3 whose run.json says who owns it and when it last beat."""
    folder = f"{out}/.parts-{uuid.uuid4().hex[:12]}"
    beat = time.time() - age_s
    fs.pipe_file(f"{folder}/run.json", json.dumps(
        {"host": host, "pid": pid, "started": beat, "heartbeat": beat}).encode())
    fs.pipe_file(f"{folder}/world00000/front.000000000.mp4", b"segment")
    return folder


@pytest.fixture
def s3_out(s3_server):
    return f"s3://flyarchive-test/{uuid.uuid4().hex}/videos", s3_server.filesystem(), \
        s3_server.storage_options()


def test_s3_parts_folder_of_a_run_whose_heartbeat_stopped_is_removed(s3_out):
    out, fs, options = s3_out
    stale = put_run(fs, out, host="elsewhere/boot", pid=1, age_s=STALE_S + 60)

    with RunFolder.create(out, options):
        pass

    assert not fs.exists(stale)


def test_s3_parts_folder_of_a_run_that_beats_elsewhere_is_kept(s3_out):
    out, fs, options = s3_out
    live = put_run(fs, out, host="elsewhere/boot", pid=1, age_s=5)

    with RunFolder.create(out, options):
        pass

    assert fs.exists(f"{live}/world00000/front.000000000.mp4")


@pytest.mark.subprocess
def test_s3_parts_folder_of_a_dead_process_on_this_host_is_removed(s3_out):
    from flyarchive.video.workspace import _host

    out, fs, options = s3_out
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    folder = put_run(fs, out, host=_host(), pid=int(dead), age_s=5)

    with RunFolder.create(out, options):
        pass

    assert not fs.exists(folder)


def test_s3_run_folder_is_held_while_open_and_removed_on_close(s3_out):
    out, fs, options = s3_out

    with RunFolder.create(out, options) as run:
        held = fs.exists(f"{run.url}/run.json")
        assert RunFolder.is_open(run.url, options)

    assert held and not RunFolder.is_open(run.url, options)
    assert not fs.exists(run.url)
