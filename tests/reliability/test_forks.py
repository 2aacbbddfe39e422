"""The harness that runs many capped jobs through one child (flyarchive.testing.forks): each
job in a process of its own, forked from the child; one that hangs is killed at its
timeout, one that outgrows the address-space cap or dies is said to have died, and the
jobs after it still run."""

import os
import sys

import pytest

from flyarchive.testing.forks import run_forked

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(120)]

# A module whose main serves jobs: ["answer", x], ["hang", fifo], ["allocate", bytes], ["kill"].
PROBE = """
import os, signal, sys
from flyarchive.testing.forks import serve_forked

def run(job):
    if job[0] == "hang":
        open(job[1]).read()  # a FIFO nobody writes: blocks without end
    elif job[0] == "allocate":
        bytearray(job[1])
    elif job[0] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"job": job, "pid": os.getpid(), "parent": os.getppid()}

if __name__ == "__main__":
    sys.exit(serve_forked(run, sys.argv[2:]))
"""


@pytest.fixture
def probe_env(tmp_path):
    (tmp_path / "forks_probe.py").write_text(PROBE)
    path = os.pathsep.join([str(tmp_path), *sys.path])
    return {**os.environ, "PYTHONPATH": path}


def test_each_job_answers_from_a_process_of_its_own(probe_env):
    done = run_forked("forks_probe", [["answer", 1], ["answer", 2]], memory_bytes=4 << 30,
                      timeout_s=60, env=probe_env)

    answers = [d["result"] for d in done]
    assert [a["job"] for a in answers] == [["answer", 1], ["answer", 2]]
    assert answers[0]["parent"] == answers[1]["parent"] != os.getpid()  # one child forked both
    assert len({a["pid"] for a in answers} | {answers[0]["parent"]}) == 3


def test_a_job_that_hangs_outgrows_the_cap_or_dies_fails_alone(probe_env, tmp_path):
    fifo = tmp_path / "nobody-writes"
    os.mkfifo(fifo)
    jobs = [["hang", str(fifo)], ["allocate", 8 << 30], ["kill"], ["answer", 3]]

    done = run_forked("forks_probe", jobs, memory_bytes=4 << 30, timeout_s=1, env=probe_env)

    assert done[0]["died"] == "did not finish within 1.0 s (killed)"
    assert done[1]["died"] == "the job's process died (exit 1)"  # MemoryError under the cap
    assert done[2]["died"] == "the job's process died (killed by SIGKILL)"
    assert done[3]["result"]["job"] == ["answer", 3]
