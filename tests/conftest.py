"""Shared fixtures: storage locations (memory, local disk, S3 on loopback), one Dask cluster
and one S3 server for the whole run, models, the CLI; and the test tiers.

Tiers: every test that is expensive for one of the reasons of :data:`EXPENSIVE` carries
that marker (declared in pyproject.toml). Most are given here, from what a test uses
(:func:`pytest_collection_modifyitems`): the ``s3_server`` fixture (through ``s3_location``
too) or an ``"s3"`` parameter (``location[s3]``) gives ``s3``, the ``dask_cluster`` fixture
(through ``dask_client`` too) gives ``cluster``, the skip markers ``requires_warp``/
``requires_flygym``/``requires_chromium`` give ``warp``/``flygym``/``browser``
(``requires_flygym_files``, flygym's trajectory files alone, gives none: those tests are
cheap), a ``"warp-cpu"`` parameter gives ``warp``. Tests that start processes of their own or a
cluster of their own say ``subprocess`` or ``cluster`` themselves (or in their file's
``pytestmark``); a test over 5 s with no such marker is named at the end of the run. ``--fast`` leaves every expensive test out
(``bash scripts/dev.sh test --fast``). Cases marked ``sweep`` repeat a behaviour another
case already tests (more seeds, more signals...) and run only with ``--run-sweeps``.

Skip markers (``requires_warp``...) are in :mod:`flyarchive.testing.markers`; plain helpers
(``record``, ``snapshot``...) in :mod:`flyarchive.testing.fixtures`.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")
# Idle Dask clusters (the shared one lives through the session, in every xdist worker):
# without its statistical profiler (a stack sample every 10 ms in each worker) and with a
# slower event-loop tick and system monitor, an idle LocalCluster of 2 workers costs 3.3 %
# of a core instead of 11.7 % (measured on the 2-core VM). Set in the environment, so that
# the clusters of the processes the tests start get it too.
for _name, _value in (("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "False"),
                      ("DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL", "1s"),
                      ("DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL", "5s")):
    os.environ.setdefault(_name, _value)
if "dask" in sys.modules:  # imported before this file: read the environment again
    sys.modules["dask"].config.refresh()
# The suite started with Ctrl-C ignored (`cmd &` in a shell without job control, some CI
# runners) passes that on to every process it starts, and the tests of what Ctrl-C does
# (exit 130, one line) would see their child ignore it. Handled here, as in a terminal:
# the processes the tests start then get SIGINT's default disposition (a handler is not
# inherited across exec).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from flyarchive.testing import markers  # noqa: E402
from flyarchive.testing.fixtures import Location  # noqa: E402

# Warp kernels for Warp's CPU device compile in about half the time at -O0 (the tiny
# models run fast enough either way): CI starts from an empty kernel cache. This process,
# the processes the tests start and the cluster's workers all inherit it.
if markers.WARP_DEVICE == "cpu":
    os.environ.setdefault("FLYARCHIVE_WARP_OPTIMIZATION", "0")

#: Markers of what makes a test expensive; ``--fast`` deselects a test that has any of them.
EXPENSIVE = ("cluster", "subprocess", "warp", "flygym", "s3", "browser", "install", "slow")
#: Fixtures that make a test expensive, and the marker each gives.
_BY_FIXTURE = {"s3_server": "s3", "dask_cluster": "cluster"}
#: Skip markers of optional parts, and the marker each gives.
_BY_SKIP = ((markers.requires_warp.mark, "warp"), (markers.requires_flygym.mark, "flygym"),
            (markers.requires_chromium.mark, "browser"), (markers.requires_s3.mark, "s3"))
#: Parameter values that put a test on S3 or mujoco-warp, and the marker each gives.
_PARAM_MARKS = {"warp": "warp", "warp-cpu": "warp", markers.WARP_BACKEND: "warp", "s3": "s3"}
#: A test without an expensive marker that takes longer is named at the end of the run.
_UNMARKED_SLOW_S = 5.0
#: Files that take minutes (the README's examples, the demo): run first.
#: The files that take longest (wall seconds summed over their tests, a full run on the
#: 2-core VM), longest first: worker processes start them before the many short ones, so
#: that none is left running alone at the end.
_LONGEST_FILES = ("test_readme.py", "reliability/test_flaky_s3.py", "view/test_browser.py",
                  "render/test_render_outputs.py", "view/test_gait_panels.py",
                  "analyze/test_keep.py", "bad_input/test_derived.py",
                  "render/test_render_warp.py", "reliability/test_testing_s3.py",
                  "reliability/test_render_kill.py", "test_demo.py")
_unmarked_slow: list[tuple[str, float]] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flyarchive tiers")
    group.addoption("--fast", action="store_true",
                    help=f"leave out the expensive tests (markers {', '.join(EXPENSIVE)})")
    group.addoption("--cpu-report", metavar="FILE", default=None,
                    help="write each test's CPU seconds (this process, the processes it "
                         "started, the shared cluster's workers) to FILE as JSON lines")
    group.addoption("--run-sweeps", action="store_true",
                    help="also run the cases marked 'sweep' (more seeds, signals, archives "
                         "of behaviours another case tests)")


def expensive_markers(item: pytest.Item) -> set[str]:
    """The markers of :data:`EXPENSIVE` that ``item`` has or earns by what it uses."""
    found = {m.name for m in item.iter_markers() if m.name in EXPENSIVE}
    found |= {name for fixture, name in _BY_FIXTURE.items() if fixture in item.fixturenames}
    found |= {name for skip, name in _BY_SKIP for m in item.iter_markers("skipif") if m == skip}
    params = getattr(item, "callspec", None)
    for value in params.params.values() if params is not None else ():
        if isinstance(value, str) and value in _PARAM_MARKS:  # location[s3], backend[warp-cpu]
            found.add(_PARAM_MARKS[value])
    return found


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by what it uses, leave out sweeps (without ``--run-sweeps``) and
    expensive tests (with ``--fast``), and put the longest files first."""
    fast, sweeps = config.getoption("--fast"), config.getoption("--run-sweeps")
    kept, left = [], []
    for item in items:
        found = expensive_markers(item)
        for name in sorted(found):
            item.add_marker(name)
        out = (fast and found) or (not sweeps and item.get_closest_marker("sweep"))
        (left if out else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
    # The longest files first, so that worker processes (pytest-xdist) start them before
    # the many short ones.
    items[:] = sorted(kept, key=_start_order)


def _start_order(item: pytest.Item) -> int:
    """Where ``item``'s file is in :data:`_LONGEST_FILES` (the others after them)."""
    path = item.path.as_posix()
    for rank, name in enumerate(_LONGEST_FILES):
        if path.endswith("/tests/" + name):
            return rank
    return len(_LONGEST_FILES)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if (report.when == "call" and report.duration > _UNMARKED_SLOW_S
            and not any(name in report.keywords for name in EXPENSIVE)):
        _unmarked_slow.append((report.nodeid, report.duration))


def _cpu_seconds() -> float:
    """CPU seconds of this process, its reaped children and every live descendant."""
    import resource

    import psutil

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Any:
    target = item.config.getoption("--cpu-report")
    if not target:
        return (yield)
    import json
    import time

    cpu, wall = _cpu_seconds(), time.perf_counter()
    try:
        return (yield)
    finally:
        row = {"test": item.nodeid, "cpu_s": round(_cpu_seconds() - cpu, 2),
               "wall_s": round(time.perf_counter() - wall, 2)}
        with open(target, "a") as out:
            out.write(json.dumps(row) + "\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _unmarked_slow:
        terminalreporter.section(f"tests over {_UNMARKED_SLOW_S:g} s without a marker of "
                                 f"{', '.join(EXPENSIVE)} (mark them, or make them cheaper)")
        for nodeid, seconds in sorted(_unmarked_slow, key=lambda x: -x[1]):
            terminalreporter.line(f"{seconds:6.1f} s  {nodeid}")


@pytest.fixture(scope="session", autouse=True)
def model_check_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """flyarchive's cache folder (verdicts of kept models' checks) for the whole session: a
    temporary one, never the user's, shared by the xdist workers of one run (as processes
    share a user's cache: verdicts are written by an atomic rename); processes started by
    the tests inherit it."""
    before = os.environ.get("FLYARCHIVE_CACHE_DIR")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the run's folder, above each worker's own
        folder = tmp_path_factory.getbasetemp().parent / "flyarchive-cache"
        folder.mkdir(exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("flyarchive-cache")
    os.environ["FLYARCHIVE_CACHE_DIR"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("FLYARCHIVE_CACHE_DIR", None)
    else:
        os.environ["FLYARCHIVE_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def run_sweeps(request: pytest.FixtureRequest) -> bool:
    """Whether this run repeats races and sweeps in full (``--run-sweeps``)."""
    return bool(request.config.getoption("--run-sweeps"))


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """A real S3-compatible server (moto in server mode) on loopback, with a bucket."""
    from flyarchive.testing.s3 import S3Server

    with S3Server() as server:
        server.create_bucket("flyarchive-test")
        yield server


@pytest.fixture(scope="session")
def dask_cluster(model_check_cache: Any) -> Iterator[Any]:
    """One Dask LocalCluster of 2 single-threaded worker processes (EGL, one llvmpipe thread)
    for every test that just needs a cluster. A test that kills workers or needs another
    configuration starts its own."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address="127.0.0.1:0", silence_logs=40,
                                  env={"MUJOCO_GL": "egl", "LP_NUM_THREADS": "1"}) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def dask_client(dask_cluster: Any) -> Iterator[Any]:
    """A client of :func:`dask_cluster`, not the default one (``with dask_client.as_current()``
    makes it the default in a block)."""
    import distributed

    with distributed.Client(dask_cluster, set_as_default=False) as client:
        yield client


@pytest.fixture
def s3_location(s3_server: Any) -> Location:
    return Location(f"s3://flyarchive-test/{uuid.uuid4().hex}.zarr", s3_server.storage_options())


@pytest.fixture(params=["memory", "local", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Any) -> Location:
    """An empty archive location on each storage backend."""
    if request.param == "memory":
        return Location(f"memory://{uuid.uuid4().hex}.zarr")
    if request.param == "local":
        return Location(str(tmp_path / "run.zarr"))
    return request.getfixturevalue("s3_location")


@pytest.fixture
def tiny():
    from flyarchive.testing import tiny_model

    return tiny_model()


@pytest.fixture
def model_xml(tmp_path: Any) -> str:
    """The tiny model's MJCF in a file, for the CLI's ``--model``."""
    from flyarchive.testing import TINY_XML

    path = tmp_path / "tiny.xml"
    path.write_text(TINY_XML)
    return str(path)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Any:
    """Run ``flyarchive ARGS...`` in this process: ``cli(*argv) -> (exit code, stdout, stderr)``."""
    from flyarchive.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        code = main([str(arg) for arg in argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
