"""``flyarchive demo``: the main job on embedded defaults, end to end on this machine.

Simulate walking NeuroMechFly worlds on the CPU, record them, verify the archive,
render a few worlds to mp4 on a local Dask cluster, then every world tiled into one
mosaic video with world ids and simulated time burnt in, and plot joint traces.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from flyarchive.errors import ArchiveExistsError, OptionsError, OutputExistsError, missing_dependency


#: What the demo writes in its folder (checked before anything is written).
OUTPUTS = ("demo.zarr", "nmf.mjb", "world0.png", "videos")


def _say(message: str) -> None:
    print(f"[flyarchive demo] {message}", flush=True)


def run_demo(
    out: str | Path = "demo-out",
    *,
    n_worlds: int = 4,
    seconds: float = 1.0,
    render: bool = True,
    render_worlds: int = 2,
    overwrite: bool = False,
    n_workers: int | None = None,
) -> dict[str, object]:
    """Run the demo and return what it produced (paths and counts).

    Args:
        out: Output folder: ``demo.zarr``, ``nmf.mjb`` (the model, for replay),
            ``videos/`` (``world*/`` per world, ``mosaic000/`` every world tiled),
            ``world0.png``.
        n_worlds: Walking flies simulated in lockstep.
        seconds: Simulated seconds.
        render: Render videos (False: record, verify and plot only).
        render_worlds: How many worlds to render.
        overwrite: Replace an earlier demo's output.
        n_workers: Render worker processes (default: one per core).

    Raises:
        ArchiveExistsError: if ``out`` holds an earlier demo and ``overwrite`` is False.
        OutputExistsError: if ``out`` holds another of the demo's outputs (``nmf.mjb``,
            ``world0.png``, ``videos``) and ``overwrite`` is False, is a file, or is a zarr
            archive or group.
        OptionsError, RenderOptionsError: a count or duration that cannot be used.
        Each before anything is written.
    """
    import importlib.util

    from flyarchive.interop import nmf

    if importlib.util.find_spec("flygym") is None:  # before anything is written
        raise missing_dependency("flygym", "flygym", "flyarchive demo")
    from flyarchive.distribute.api import check_n_workers
    from flyarchive.distribute.cluster import local_cluster

    nmf.check_walk(n_worlds, seconds)  # everything checked before anything is written
    if render and not (isinstance(render_worlds, int) and render_worlds >= 1):
        raise OptionsError(f"render_worlds must be a whole number >= 1, got {render_worlds!r}.")
    if render:
        check_n_workers(n_workers)
    out = Path(out)
    url = str(out / "demo.zarr")
    _check_out(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    # One local cluster for both renders, its workers starting while the flies walk.
    with local_cluster(n_workers) if render and _workers(n_workers) else \
            contextlib.nullcontext() as client:
        return _run(nmf, out, url, n_worlds, seconds, render, render_worlds, overwrite,
                    n_workers, client)


def _check_out(out: Path, overwrite: bool) -> None:
    """Refuse an ``out`` the demo cannot use, or whose files it would replace unasked."""
    if out.exists() and not out.is_dir():
        raise OutputExistsError(
            f"{str(out)!r} is a file, not a folder. Pass --out a folder (made when missing).")
    if (out / "zarr.json").exists():
        raise OutputExistsError(
            f"{str(out)!r} is a zarr archive or group: the demo writes a folder of its own "
            "(demo.zarr, nmf.mjb, world0.png, videos/). Pass --out another folder.")
    earlier = [name for name in OUTPUTS if os.path.lexists(out / name)]
    if not earlier or overwrite:
        return
    if "demo.zarr" in earlier:
        raise ArchiveExistsError(
            f"{str(out / 'demo.zarr')!r} holds an earlier demo. Pass --overwrite to replace it, "
            "or --out another folder.")
    raise OutputExistsError(
        f"{str(out)!r} holds {', '.join(earlier)}, which the demo writes: pass --overwrite "
        "to replace them, or --out another folder.")


def _workers(n_workers: int | None) -> bool:
    """Whether the renders run on worker processes (by default one per core on a machine
    of several; else in this process; a wrong ``n_workers`` goes to render_videos, which
    says what is wrong)."""
    if n_workers is None:
        return (os.cpu_count() or 1) > 1
    return isinstance(n_workers, int) and n_workers >= 1


def _run(nmf: Any, out: Path, url: str, n_worlds: int, seconds: float, render: bool,
         render_worlds: int, overwrite: bool, n_workers: int | None,
         client: Any = None) -> dict[str, object]:
    from flyarchive.models import save_mjb
    from flyarchive.plot import plot_traces
    from flyarchive.recorders import TrajectoryRecorder
    from flyarchive.store.integrity import verify
    from flyarchive.summary import summarize, summary_lines

    world = nmf.build_world()
    model_path = save_mjb(world.model, out / "nmf.mjb")
    _say(f"simulating {n_worlds} NeuroMechFly worlds for {seconds} s on the CPU "
         f"(nq={world.model.nq}, timestep {world.model.opt.timestep} s)")
    start = time.perf_counter()
    recorder = TrajectoryRecorder(url, world.model, mode="w" if overwrite else "w-",
                                  attrs={"demo": "flyarchive demo", "controller": "spotlight clip"},
                                  model_source=world.spec)
    with recorder:
        nmf.simulate_walk(world, n_worlds, seconds, recorder.record_as_needed)
    _say(f"recorded {recorder.n_frames} frames x {n_worlds} worlds to {url} "
         f"in {time.perf_counter() - start:.1f} s")
    for key, value in summary_lines(summarize(url)).items():
        _say(f"  {key}: {value}")
    report = verify(url)
    _say(f"verify: {'OK' if report.ok else 'FAILED'} ({report.frames_checked} frames read)")
    for problem in report.problems:
        _say(f"  problem: {problem}")
    png = plot_traces(url, 0, out / "world0.png", overwrite=overwrite)
    _say(f"joint traces of world 0: {png}")
    result: dict[str, object] = {"archive": url, "model": str(model_path), "plot": str(png),
                                 "frames": recorder.n_frames, "verify_ok": report.ok}
    if render:
        from flyarchive.distribute.api import render_videos
        from flyarchive.render.options import RenderOptions

        start = time.perf_counter()
        # the cluster started while the flies walked, for both renders
        where = {"client": client} if client is not None else {"n_workers": n_workers}
        rendered = render_videos(
            url, world.model, world.cameras, str(out / "videos"),
            worlds=list(range(min(render_worlds, n_worlds))),
            options=RenderOptions(size=(240, 320), overwrite=overwrite, progress=True),
            **where,
        )
        frames = sum(int(v["frames"]) for v in rendered.videos)
        elapsed = time.perf_counter() - start
        _say(f"rendered {len(rendered.videos)} video(s), {frames} frames in {elapsed:.1f} s "
             f"({frames / elapsed:.1f} frames/s, start included): {rendered.manifest}")
        result["videos"] = [v["path"] for v in rendered.videos]
        result["mosaics"] = _render_mosaic(url, world, out / "videos", n_worlds, overwrite,
                                           where)
    _say(f"replay again with: flyarchive render {url} --model {model_path} "
         f"--camera {world.cameras[0]} --out {out / 'videos'} --overwrite")
    _say(f"browse and watch the worlds in the browser: flyarchive view {url} "
         f"--out {out / 'view-videos'}")
    return result


def _render_mosaic(url: str, world: object, videos: Path, n_worlds: int, overwrite: bool,
                   where: dict[str, Any]) -> list[str]:
    """Every world tiled into one mosaic video of the first camera (about square, tiles of
    120x160), labelled with world ids and simulated time; its path(s)."""
    import math

    from flyarchive.distribute.api import render_videos
    from flyarchive.render.options import RenderOptions

    cols = math.ceil(math.sqrt(n_worlds))
    rows = math.ceil(n_worlds / cols)
    start = time.perf_counter()
    rendered = render_videos(
        url, world.model, world.cameras[0], str(videos),  # type: ignore[attr-defined]
        options=RenderOptions(size=(120, 160), overwrite=overwrite, progress=True,
                              mosaic=(rows, cols), overlays=("world", "time")),
        **where,
    )
    paths = [str(v["path"]) for v in rendered.videos]
    _say(f"rendered a {rows}x{cols} mosaic of {n_worlds} worlds with world ids and time "
         f"in {time.perf_counter() - start:.1f} s: {', '.join(paths)}")
    return paths
