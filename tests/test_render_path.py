"""How many of flyarchive's modules one ``flyarchive render`` goes through on its main line,
from the command line to the mp4: at most 9 (issue 23), counted by one rule, so that the
number cannot grow back unseen.

The rule. A render does its work in steps (:func:`steps`): the archive opened, the plan
made, a cluster started or connected and tasks sent to it, states read, the renderer
built, frames rendered, frames piped into ffmpeg, the mp4 finished, the mp4 published
under its final name. At each step the Python call stack of the thread doing it is looked
at, and the flyarchive modules with a function on it (the step's own function included)
are noted. The main line is every module noted, but the base modules (errors, config,
schema, layout, clock, codecs, models, warp_log, lru, archive_spec) and the store (a step that enters the
store goes on in how zarr is read), the models package's module of the store's floor
included; its module of the analysis's floor (:mod:`flyarchive.models.shipping`) is
counted. A module whose functions are called and return between steps (an argument
parsed, frames selected, the output folder checked, a file named, a progress bar shown)
is on no step's stack: a side call, not the main line.

The steps are watched with :mod:`sys.monitoring` (the start of the steps' functions
only, in every thread: nothing else is slowed down) in this process, ``--workers 0``. A
render on a Dask cluster (the default of ``--backend opengl``: a local one) adds
:mod:`flyarchive.distribute.cluster` on this side (the cluster started, its client
connected); its tasks run on the workers through the functions a render in this process
calls, which a trace of this process cannot see there: the last test counts this side on
the shared cluster and adds the other from a render in this process.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flyarchive.cli import main
from flyarchive.models import save_mjb
from flyarchive.testing.fixtures import record
from flyarchive.testing.markers import WARP_BACKEND, requires_warp

#: The most modules a render's main line may cross (issue 23).
MOST = 9
#: Not counted: the base modules, and the store (the code below a step that reads zarr).
NOT_COUNTED = ("errors", "config", "schema", "layout", "clock", "codecs", "models", "warp_log",
               "lru", "archive_spec", "store")
OPENGL = ["flyarchive.cli.commands", "flyarchive.distribute.api", "flyarchive.render.plan",
          "flyarchive.render.opengl_pipeline", "flyarchive.render.renderer_cache",
          "flyarchive.replay.opengl_frames",
          "flyarchive.video.output_files", "flyarchive.video.mp4"]
WARP = ["flyarchive.cli.commands", "flyarchive.distribute.api", "flyarchive.render.plan",
        "flyarchive.render.warp_pipeline", "flyarchive.render.renderer_cache",
        "flyarchive.replay.warp_frames",
        "flyarchive.render.encoders", "flyarchive.video.output_files", "flyarchive.video.mp4"]


def steps(backend: str) -> dict[str, list[Callable[..., Any]]]:
    """The functions that start each step of a render on ``backend``."""
    from flyarchive.render.plan import RenderPlan
    from flyarchive.store.opener import open_for_reading
    from flyarchive.store.reader import StateReader
    from flyarchive.video.mp4 import VideoWriter, concat_segments
    from flyarchive.video.output_files import write_output

    found: dict[str, list[Callable[..., Any]]] = {
        "archive opened": [open_for_reading],
        "plan made": [RenderPlan.__init__],
        "states read": [StateReader.read_boxes],
        "frames piped into ffmpeg": [VideoWriter.write],
        "mp4 finished": [VideoWriter.close, concat_segments],
        "mp4 published": [write_output],  # with a URL ending in .mp4
    }
    if backend == "opengl":
        from flyarchive.replay.opengl_frames import OpenGLRenderer

        found["renderer built"] = [OpenGLRenderer.__init__]
        found["frames rendered"] = [OpenGLRenderer.render_frame, OpenGLRenderer.render_outputs]
    else:
        from flyarchive.replay.warp_frames import WarpBatchRenderer

        found["renderer built"] = [WarpBatchRenderer.__init__]
        found["frames rendered"] = [WarpBatchRenderer.submit]
    with contextlib.suppress(ImportError):  # not reached with --workers 0
        from distributed import Client, LocalCluster

        found["cluster started or connected"] = [LocalCluster.__init__, Client.__init__]
        found["tasks sent to the cluster"] = [Client.submit]
    return found


#: Counted although in a package of :data:`NOT_COUNTED`: of a floor above the store's.
COUNTED = ("flyarchive.models.shipping",)


def counted(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "flyarchive" and len(parts) > 1 and (
        parts[1] not in NOT_COUNTED or module in COUNTED)


@contextlib.contextmanager
def main_line(backend: str) -> Iterator[tuple[list[str], set[str]]]:
    """``(modules, steps)``, filled while inside: the counted modules on the stacks of the
    steps, outermost first in order of appearance, and the steps seen."""
    by_code = {f.__code__: name for name, functions in steps(backend).items() for f in functions}
    modules: list[str] = []
    seen: set[str] = set()

    def started(code: Any, offset: int) -> None:
        frame, stack = sys._getframe(1), []
        if by_code[code] == "mp4 published" and not str(frame.f_locals["url"]).endswith(".mp4"):
            return  # the manifest, published beside the videos
        seen.add(by_code[code])
        while frame is not None:
            stack.append(frame.f_globals.get("__name__", ""))
            frame = frame.f_back
        modules.extend(m for m in dict.fromkeys(reversed(stack)) if counted(m) and m not in modules)

    monitoring = sys.monitoring
    tool = next(i for i in (3, 4, 5, 2, 1, 0) if monitoring.get_tool(i) is None)
    monitoring.use_tool_id(tool, "flyarchive-render-path")
    monitoring.register_callback(tool, monitoring.events.PY_START, started)
    for code in by_code:
        monitoring.set_local_events(tool, code, monitoring.events.PY_START)
    try:
        yield modules, seen
    finally:
        for code in by_code:
            monitoring.set_local_events(tool, code, 0)
        monitoring.register_callback(tool, monitoring.events.PY_START, None)
        monitoring.free_tool_id(tool)


@pytest.fixture
def archive(tiny, tmp_path):
    """2 tiny worlds, 7 frames each, and the model as an MJB file."""
    url = record(tiny, str(tmp_path / "run.zarr"), n_steps=24)
    return url, str(save_mjb(tiny, tmp_path / "tiny.mjb"))


def render(archive: tuple[str, str], out: str, backend: str, *where: str
           ) -> tuple[int, list[str], set[str]]:
    """``flyarchive render`` of world 1 (``where``: ``--workers 0`` unless given); the exit
    status, and the :func:`main_line` of this process."""
    from flyarchive.render.renderer_cache import clear_renderers, close_thread_renderers

    clear_renderers()  # renderers kept from earlier tests would skip the step that builds one
    close_thread_renderers()
    url, model = archive
    with main_line(backend) as (modules, seen):
        code = main(["render", url, "--model", model, "--camera", "front", "--worlds", "1",
                     "--size", "48x64", "--out", out, "--quiet", "--backend", backend,
                     *(where or ("--workers", "0"))])
    return code, modules, seen


def test_an_opengl_render_crosses_at_most_9_modules_from_the_command_line_to_the_mp4(
        archive, tmp_path):
    code, modules, seen = render(archive, str(tmp_path / "v"), "opengl")

    assert code == 0
    assert seen == set(steps("opengl")) - {"cluster started or connected",
                                           "tasks sent to the cluster"}
    assert len(modules) + 1 <= MOST, " -> ".join(modules)  # + distribute.cluster on a cluster
    assert sorted(modules) == sorted(OPENGL), modules


@requires_warp
def test_a_warp_render_crosses_at_most_9_modules_from_the_command_line_to_the_mp4(
        archive, tmp_path):
    code, modules, seen = render(archive, str(tmp_path / "v"), WARP_BACKEND)

    assert code == 0
    assert seen == set(steps(WARP_BACKEND)) - {"cluster started or connected",
                                               "tasks sent to the cluster"}
    assert len(modules) <= MOST, " -> ".join(modules)
    assert sorted(modules) == sorted(WARP), modules


def test_a_render_on_a_cluster_adds_only_the_cluster_on_this_side(archive, tmp_path,
                                                                  dask_cluster):
    _, here, _ = render(archive, str(tmp_path / "here"), "opengl")

    code, modules, seen = render(archive, str(tmp_path / "v"), "opengl",
                                 "--scheduler", dask_cluster.scheduler_address)

    assert code == 0 and (tmp_path / "v" / "world00001" / "front.mp4").is_file()
    assert seen == {"cluster started or connected", "archive opened", "plan made",
                    "tasks sent to the cluster"}
    assert sorted(modules) == ["flyarchive.cli.commands", "flyarchive.distribute.api",
                               "flyarchive.distribute.cluster", "flyarchive.render.plan"], modules
    assert len({*modules, *here}) <= MOST  # the workers' side: the render's in this process
