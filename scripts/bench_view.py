"""How fast ``flyarchive view`` answers, measured through a headless Chromium, as a user
sees it.

The archive: ``--worlds`` x ``--frames`` (default 4096 x 1000) of NeuroMechFly state
(73 dofs, float32 as a GPU recording), jittered copies of one simulated walk
(``benchlib.nmf_states``), with world variables computed from the states (``distance``:
the fly's x/y displacement, mm; ``speed``: distance per simulated second; ``success``:
distance above the median), built once under ``--cache`` beside the model (``nmf.mjb``,
passed as ``--model``). The viewer runs as the command a user types
(``python -m flyarchive.cli view ... --port 0``), in its own process.

Measured (p50 and p95 of ``--repeat`` runs each, milliseconds):

- ``command to listening``: from starting the command to its printed address (once,
  with Chromium already running, as a user's browser is);
- ``command to first page``: from starting the command to the first page of the world
  table drawn, the page loaded as soon as the address is printed (once);
- ``first page``: from navigating to the address again to the world table drawn (the 3D
  scene's meshes arrive after);
- ``first page + 3D``: to the scene built (meshes of NeuroMechFly, about 2 MB);
- ``filter``: typing a filter and pressing the button, to the table drawn again;
- ``sort``: a click on a column header, to the table drawn again;
- ``traces 50 x F``: 50 worlds x F frames of one dof, min/max per pixel column, to the
  plot drawn (each run other worlds: nothing cached);
- ``poses kept``: from selecting 4 worlds to the poses of every frame kept in the page
  (fetched in blocks while the user looks; once);
- ``pose update``: then a move of the time cursor to a random frame, to the 3D view
  drawn with the new poses (three.js on Chromium's software WebGL here).

Each measure after the first page is given three ways: as the driver (Playwright) sees
it, from its action to the page's condition (round trips to the browser included); the
page's own time, from the event to the animation frame after the update
(``window.flyarchiveView.took``); and the server's part (its ``Server-Timing``).

Targets (issue 25): the command to the first page and the first page under 3 s; filter,
traces and pose updates p95 under 300 ms.

Usage::

    MUJOCO_GL=egl python scripts/bench_view.py [--worlds 4096] [--frames 1000] [--repeat 20]
        [--cache /tmp/flyarchive-bench-view] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import Column, Jitter, Table, add_json_option, cached, host_info, nmf_states, \
    write_archive, write_json

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def build(cache: Path, worlds: int, frames: int) -> tuple[str, str]:
    """The archive and model file (built once)."""
    from flyarchive.interop.nmf import build_world
    from flyarchive.models import save_mjb

    world_holder: dict[str, Any] = {}

    def world() -> Any:
        if "w" not in world_holder:
            world_holder["w"] = build_world()
        return world_holder["w"]

    model = cache / "nmf.mjb"
    if not model.exists():
        cache.mkdir(parents=True, exist_ok=True)
        save_mjb(world().model, model)

    def make(path: Path) -> None:
        import flyarchive

        states = nmf_states(worlds, frames, world=world(), jitter=Jitter(), dtype=np.float32,
                            cache=cache)
        write_archive(str(path), world().model, states)
        xy = states[:, :, :2].astype(np.float64)
        distance = np.linalg.norm(xy[:, -1] - xy[:, 0], axis=1)
        seconds = frames * 0.2 / 25.0
        flyarchive.add_world_vars(str(path), {
            "distance": distance, "speed": distance / seconds,
            "success": distance > np.median(distance),
            "seed": np.arange(worlds, dtype=np.int64)})

    archive = cached(cache / f"view-{worlds}x{frames}.zarr", make)
    return str(archive), str(model)


class Viewer:
    """``flyarchive view`` in a process of its own; ``url`` once it listens."""

    def __init__(self, archive: str, model: str, out: Path) -> None:
        start = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flyarchive.cli", "view", archive, "--model", model,
             "--port", "0", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        self.log: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            found = re.search(r"open (http\S+)", line)
            if found:
                self.url = found.group(1)
                break
        else:
            raise RuntimeError(f"flyarchive view stopped: {''.join(self.log)[-2000:]}")
        self.listening_s = time.perf_counter() - start

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


SERVER: dict[str, list[float]] = {}
PAGE: dict[str, list[float]] = {}
V = "window.flyarchiveView"


def timed(page: Any, act: Any, done: str, arg: Any = None, kind: str = "") -> float:
    """Milliseconds from ``act()`` to the page's ``done`` condition (a JS expression), as
    the driver sees it; with ``kind``, the page's own time for it (from the event to the
    animation frame after the update, ``state.took[kind]``) kept in :data:`PAGE`, and the
    server's (its ``Server-Timing``; 0 when the page answered from what it kept) in
    :data:`SERVER`."""
    seen = page.evaluate(f"({V}.tookSeq['{kind}'] || 0)") if kind else 0
    page.evaluate(f"{V}.serverMs = 0")
    start = time.perf_counter()
    act()
    page.wait_for_function(done, arg=arg, timeout=120_000)
    took = (time.perf_counter() - start) * 1000.0
    if kind:
        page.wait_for_function(f"({V}.tookSeq['{kind}'] || 0) > {seen}", timeout=120_000)
        PAGE.setdefault(kind, []).append(page.evaluate(f"{V}.took['{kind}']"))
        SERVER.setdefault(kind, []).append(page.evaluate(f"{V}.serverMs"))
    return took


def first_pages(browser: Any, archive: str, model: str, out: Path, repeat: int
                ) -> tuple[Viewer, Any, dict[str, list[float]]]:
    """Start the viewer as a user does, with the browser already open, and load the page
    as soon as the address is printed: command to listening, to the first page (the
    table), to the 3D scene; then ``repeat`` loads of the page more (a warm server)."""
    out_ms: dict[str, list[float]] = {k: [] for k in ("command to first page",
                                                      "first page", "first page + 3D")}
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    start = time.perf_counter()
    viewer = Viewer(archive, model, out)
    page.goto(viewer.url)
    page.wait_for_function(f"{V} && {V}.tableSeq >= 1", timeout=120_000)
    out_ms["command to first page"].append((time.perf_counter() - start) * 1000.0)
    page.wait_for_function(f"{V}.ready", timeout=120_000)
    for _ in range(min(repeat, 5)):
        start = time.perf_counter()
        page.goto(viewer.url)
        page.wait_for_function(f"{V} && {V}.tableSeq >= 1", timeout=120_000)
        out_ms["first page"].append((time.perf_counter() - start) * 1000.0)
        page.wait_for_function(f"{V}.ready", timeout=120_000)
        out_ms["first page + 3D"].append((time.perf_counter() - start) * 1000.0)
    return viewer, page, out_ms


def measure(page: Any, repeat: int, n_worlds: int) -> dict[str, list[float]]:
    rng = np.random.default_rng(0)
    out: dict[str, list[float]] = {k: [] for k in ("filter", "sort", "traces")}
    for i in range(repeat):
        seq = page.evaluate(f"{V}.tableSeq")
        page.fill("#filter", f"success == 1 and distance > {rng.uniform(0, 5):.3f}")
        out["filter"].append(timed(page, lambda: page.click("#filter-form button"),
                                   f"{V}.tableSeq > {seq}", kind="filter"))
        seq = page.evaluate(f"{V}.tableSeq")
        column = ["distance", "speed", "seed"][i % 3]
        out["sort"].append(timed(page, lambda: page.click(f"th:text-is('{column}')"),
                                 f"{V}.tableSeq > {seq}", kind="sort"))
    for i in range(repeat):
        worlds = rng.choice(n_worlds, 50, replace=False).tolist()
        seq = page.evaluate(f"{V}.tracesSeq")
        out["traces"].append(timed(
            page, lambda: page.evaluate(f"ws => {{ {V}.selected = ws; document.querySelector('#draw').click(); }}", worlds),
            f"{V}.tracesSeq > {seq}", kind="traces"))
    page.click("#clear")
    frames = page.evaluate(f"{V}.info.frames")
    start = time.perf_counter()
    for row in range(1, 5):  # 4 worlds side by side
        page.click(f"#table tbody tr:nth-child({row})")
    page.wait_for_function(f"{V}.posesKept() >= {frames}", timeout=120_000)
    out["poses kept"] = [(time.perf_counter() - start) * 1000.0]
    out["pose update"] = []
    for _ in range(repeat):
        frame = int(rng.integers(0, frames))
        out["pose update"].append(timed(
            page, lambda: page.evaluate("f => { const t = document.querySelector('#time'); "
                                        "t.value = f; t.dispatchEvent(new Event('input')); }",
                                        frame),
            f"{V}.poseFrame === {frame}", kind="pose"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, default=4096)
    parser.add_argument("--frames", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/flyarchive-bench-view"))
    add_json_option(parser)
    args = parser.parse_args()

    archive, model = build(args.cache, args.worlds, args.frames)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        viewer, page, times = first_pages(browser, archive, model, args.cache / "videos",
                                          args.repeat)
        try:
            times.update(measure(page, args.repeat, args.worlds))
        finally:
            viewer.stop()
            browser.close()
    rows = [{"what": "command to listening", "p50": viewer.listening_s * 1000.0,
             "p95": viewer.listening_s * 1000.0, "n": 1}]
    for name, values in times.items():
        label = f"traces 50 x {args.frames}" if name == "traces" else name
        kind = "pose" if name == "pose update" else name
        rows.append({"what": label, **_percentiles("", values), "n": len(values),
                     "target": TARGETS.get(name), **_percentiles("page_", PAGE.get(kind)),
                     **_percentiles("server_", SERVER.get(kind))})
    Table([Column("what", 24, "what", align="<"), Column("p50 ms", 8, "p50", ".0f"),
           Column("p95 ms", 8, "p95", ".0f"), Column("page p50", 9, "page_p50", ".0f"),
           Column("page p95", 9, "page_p95", ".0f"), Column("server p50", 11, "server_p50", ".0f"),
           Column("server p95", 11, "server_p95", ".0f"), Column("runs", 5, "n"),
           Column("target p95", 11, "target", ".0f")]).print(rows)
    print("p50/p95: from the driver's action to the page updated, as Playwright sees it; page: "
          "the page's own time, from the event to the animation frame after the update; "
          "server: the server's own time (Server-Timing; 0 when the page answered from what it "
          "kept). The rest of p50/p95 is the driver's round trips.")
    write_json(args.json, {"host_info": host_info(), "load_average": os.getloadavg(),
                           "worlds": args.worlds, "frames": args.frames, "rows": rows,
                           "raw_ms": {k: [round(x, 2) for x in v] for k, v in times.items()},
                           "page_ms": PAGE, "server_ms": SERVER})


TARGETS = {"command to first page": 3000.0, "first page": 3000.0, "filter": 300.0,
           "traces": 300.0, "pose update": 300.0}


def _percentiles(prefix: str, values: list[float] | None) -> dict[str, float | None]:
    if not values:
        return {f"{prefix}p50": None, f"{prefix}p95": None}
    return {f"{prefix}p50": float(np.percentile(values, 50)),
            f"{prefix}p95": float(np.percentile(values, 95))}


if __name__ == "__main__":
    main()
