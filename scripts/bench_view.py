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
  drawn with the new poses (three.js on Chromium's software WebGL here);
- ``gait 4 worlds``: from clicking 4 rows of the table (other worlds each run) to their
  footfalls and paths drawn (the gait of each computed by forward kinematics of the thorax
  and six tarsus tips, while their traces and poses load too); the first run also opens
  the lazy dataset (imports of xarray and dask); ``gait again``: the same 4 clicked again
  after clearing the selection (kept by the server).

Each measure after the first page is given three ways: as the driver (Playwright) sees
it, from its action to the page's condition (round trips to the browser included); the
page's own time, from the event to the animation frame after the update
(``window.flyarchiveView.took``); and the server's part (its ``Server-Timing``).

Targets (issue 25): the command to the first page and the first page under 3 s; filter,
traces and pose updates p95 under 300 ms.

Load (``--part load``, issue 33), without a browser: ``--clients`` (50) clients browse at
once, each on a keep-alive connection of its own with the token, as the page asks (a
filter, a sort, traces of 50 random worlds, a block of 100 frames of poses of 4 worlds, one
frame of poses), ``--think-min`` to ``--think-max`` seconds apart (1 to 3: a person
clicking briskly), for ``--seconds`` each phase, while a render of
one world's whole recording runs (submitted again when it ends, ``--render-backend``).
First ``--warm-up-s`` (10) seconds of the same browsing as the viewer and the render
start (the viewer's reader processes import and open the archive, the render builds its
renderer): shown in its own row, held to no target, with the p95 of each 5 s of every
phase (where a stall happened). Phase 1: nothing else. Phase 2: also ``--slow`` (2,000) unauthenticated connections held
open that never finish their request head (each sends the start of one, a byte every 5 s,
and connects again ``--slow-reconnect-s`` after the server closes it). Measured: each
request from send to the whole answer read, p50/p95/p99/max per phase and kind, beside
the server's own time (its ``Server-Timing``: from the request's handler to its answer,
the wait for a thread included; the rest is the network, the event loop and the client); errors (any status but 200); the machine's load average (1 min)
at the end of each phase. The viewer runs as ``flyarchive view`` in its own process, its
descriptor limit set to ``--server-nofile`` (1,024 by default, a common desktop limit);
both limits are printed. Targets: phase 1 p95 under 300 ms, phase 2 p95 under 1 s.

Usage::

    MUJOCO_GL=egl python scripts/bench_view.py [--part all|page|load] [--worlds 4096]
        [--frames 1000] [--repeat 20] [--clients 50] [--seconds 60] [--slow 2000]
        [--cache /tmp/flyarchive-bench-view] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
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
    write_archive, positive_int, write_json

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
    """``flyarchive view`` in a process of its own; ``url`` once it listens. ``extra``:
    more arguments; ``nofile``: its descriptor limit (None: this process's)."""

    def __init__(self, archive: str, model: str, out: Path, extra: tuple[str, ...] = (),
                 nofile: int | None = None) -> None:
        start = time.perf_counter()

        def limit() -> None:
            if nofile is not None:
                import resource

                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flyarchive.cli", "view", archive, "--model", model,
             "--port", "0", "--out", str(out), *extra], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, preexec_fn=limit)
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
        worlds = rng.choice(n_worlds, min(50, n_worlds), replace=False).tolist()
        seq = page.evaluate(f"{V}.tracesSeq")
        out["traces"].append(timed(
            page, lambda: page.evaluate(f"ws => {{ {V}.selected = ws; document.querySelector('#draw').click(); }}", worlds),
            f"{V}.tracesSeq > {seq}", kind="traces"))
    seq = page.evaluate(f"{V}.tableSeq")  # every world again: a filter may have kept none
    page.fill("#filter", "")
    page.click("#filter-form button")
    page.wait_for_function(f"{V}.tableSeq > {seq}", timeout=120_000)
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
    out["gait 4 worlds"], out["gait again"] = [], []
    for _ in range(repeat):
        page.click("#clear")
        seq = page.evaluate(f"{V}.tableSeq")
        page.fill("#filter", f"world >= {int(rng.integers(0, max(1, n_worlds - 60)))}")
        page.click("#filter-form button")
        page.wait_for_function(f"{V}.tableSeq > {seq}")
        rows = page.eval_on_selector_all("#table tbody tr", "rs => rs.map(r => r.dataset.world)")[:4]
        shown = f"{V}.gait && {V}.gait.worlds.map(w => w.world).join() === '{','.join(rows)}'"

        def click_rows() -> None:
            for world in rows:
                page.click(f"#table tbody tr[data-world='{world}']")

        out["gait 4 worlds"].append(timed(page, click_rows, shown))
        page.click("#clear")
        page.wait_for_function(f"{V}.gait === null")
        out["gait again"].append(timed(page, click_rows, shown))
    return out


# ----------------------------------------------------------------------------- load
LOAD_TARGETS = {"browsing, a render running": 300.0,
                "browsing, a render running, slow connections held": 1000.0}
#: The first seconds of browsing, while the viewer starts its reader processes and the
#: render its renderer (``--warm-up-s``): shown, held to no target.
WARM_UP = "warm-up: browsing as the viewer and the render start"
#: What a browsing client asks, and how often (of 100).
MIX = (("filter", 30), ("sort", 10), ("traces 50 worlds", 30), ("poses 4 x 100", 20),
       ("pose 4 x 1", 10))


class Load:
    """Clients browsing the viewer at ``origin`` with ``token`` (asyncio, aiohttp's
    client), and slow connections that never finish a request; ``samples``: (kind, ms,
    status) of every request."""

    def __init__(self, origin: str, token: str, info: dict[str, Any], think: tuple[float, float],
                 seed: int = 0) -> None:
        self.origin, self.token, self.info, self.think = origin, token, info, think
        self.rng = np.random.default_rng(seed)
        self.samples: list[tuple[str, float, int, float]] = []  # kind, ms, status, sent at
        self.server_ms: dict[str, list[float]] = {}  # Server-Timing of each answer
        self.slow_opened = 0
        self.slow_closed = 0
        dofs = [d for d in info["dofs"] if not d.endswith(("/x", "/y", "/z")) and "/q" not in d]
        self.dofs = dofs or info["dofs"]

    def ask_url(self, kind: str) -> str:
        rng, n, frames = self.rng, int(self.info["worlds"]), int(self.info["frames"])
        ids = lambda k: ",".join(map(str, rng.choice(n, min(k, n), replace=False).tolist()))  # noqa: E731
        if kind == "filter":
            return f"/api/table?where=success%20%3D%3D%201%20and%20distance%20%3E%20{rng.uniform(0, 5):.3f}"
        if kind == "sort":
            column = ["distance", "speed", "seed"][int(rng.integers(3))]
            return f"/api/table?sort={column}&desc={int(rng.integers(2))}"
        if kind == "traces 50 worlds":
            dof = self.dofs[int(rng.integers(len(self.dofs)))]
            return f"/api/traces?worlds={ids(50)}&dof={dof}&width=800"
        count = 100 if kind == "poses 4 x 100" else 1
        start = int(rng.integers(0, max(1, frames - count)))
        return f"/api/poses?worlds={ids(4)}&start={start}&count={count}"

    async def browse(self, client: int, stop: Any) -> None:
        import aiohttp

        kinds = [k for k, _ in MIX]
        weights = np.array([w for _, w in MIX], dtype=float) / sum(w for _, w in MIX)
        headers = {"X-Flyarchive-Token": self.token, "X-Flyarchive-Client": f"bench{client}",
                   "X-Flyarchive-Archive": self.info["archive_id"]}
        connector = aiohttp.TCPConnector(limit=1)  # one keep-alive connection, as a tab
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=120)) as session:
            while not stop.is_set():
                kind = str(self.rng.choice(kinds, p=weights))
                url = self.origin + self.ask_url(kind)
                start = time.perf_counter()
                try:
                    async with session.get(url, headers=headers) as response:
                        await response.read()
                        status = response.status
                        timing = re.search(r"dur=([0-9.]+)",
                                           response.headers.get("Server-Timing", ""))
                        if timing:
                            self.server_ms.setdefault(kind, []).append(float(timing.group(1)))
                except (aiohttp.ClientError, TimeoutError):
                    status = 0
                self.samples.append((kind, (time.perf_counter() - start) * 1000.0, status, start))
                await asyncio.sleep(float(self.rng.uniform(*self.think)))

    async def slow(self, host: str, port: int, stop: Any, reconnect_s: float) -> None:
        """One unauthenticated client that never finishes its request head."""
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                await asyncio.sleep(reconnect_s)
                continue
            self.slow_opened += 1
            try:
                writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                while not stop.is_set():
                    try:
                        if not await asyncio.wait_for(reader.read(1024), 5.0):
                            break  # closed by the server
                    except TimeoutError:
                        writer.write(b"X")  # a byte every 5 s
                        await writer.drain()
            except OSError:
                pass
            finally:
                writer.close()
            self.slow_closed += 1
            await asyncio.sleep(reconnect_s)


async def _phase(load: Load, clients: int, seconds: float, slow: int, reconnect_s: float
                 ) -> dict[str, Any]:
    from urllib.parse import urlsplit

    stop = asyncio.Event()
    parts = urlsplit(load.origin)
    slow_tasks = [asyncio.create_task(load.slow(parts.hostname, parts.port, stop, reconnect_s))
                  for _ in range(slow)]
    if slow:
        await asyncio.sleep(3.0)  # held before the clients come
    first = len(load.samples)
    load.server_ms = {}
    opened = load.slow_opened
    started = time.perf_counter()
    tasks = [asyncio.create_task(load.browse(i, stop)) for i in range(clients)]
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks, *slow_tasks, return_exceptions=True)
    took = time.perf_counter() - started
    samples = load.samples[first:]
    return {"samples": samples, "seconds": took, "server_ms": load.server_ms,
            "load_average": os.getloadavg()[0],
            "slow_connects_per_s": (load.slow_opened - opened) / took if slow else 0.0}


def run_load(archive: str, model: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Both load phases against one viewer, a render running throughout."""
    import json as json_
    import urllib.request

    viewer = Viewer(archive, model, out, ("--backend", args.render_backend),
                    nofile=args.server_nofile)
    origin, token = viewer.url.split("/?token=")
    headers = {"X-Flyarchive-Token": token}

    def get(path: str, data: bytes | None = None) -> Any:
        request = urllib.request.Request(origin + path, data=data, headers={
            **headers, "Content-Type": "application/json", "X-Flyarchive-Client": "bench-render"})
        with urllib.request.urlopen(request, timeout=300) as response:
            return json_.loads(response.read())

    try:
        info = get("/api/info")
        info.update(get("/api/model"))
        camera = info["cameras"][0]
        render = {"worlds": [0], "camera": camera}
        job = get("/api/render", json_.dumps(render).encode())
        renders = [job["id"]]
        stop_render = threading.Event()

        def keep_rendering() -> None:  # a render runs all along: another when one ends
            while not stop_render.wait(1.0):
                if get(f"/api/render/{renders[-1]}")["state"] in ("done", "failed"):
                    renders.append(get("/api/render", json_.dumps(render).encode())["id"])

        while get(f"/api/render/{job['id']}")["state"] == "queued":
            time.sleep(0.2)
        watcher = threading.Thread(target=keep_rendering, daemon=True)
        watcher.start()
        load = Load(origin, token, info, (args.think_min, args.think_max))
        phases = {}
        if args.warm_up_s > 0:  # measured and shown, held to no target
            print(f"load: {WARM_UP}: {args.clients} clients, {args.warm_up_s:g} s...",
                  flush=True)
            phases[WARM_UP] = asyncio.run(_phase(load, args.clients, args.warm_up_s, 0,
                                                 args.slow_reconnect_s))
        for name, slow in zip(LOAD_TARGETS, (0, args.slow)):
            print(f"load: {name}: {args.clients} clients, {slow} slow connections, "
                  f"{args.seconds:g} s...", flush=True)
            phases[name] = asyncio.run(_phase(load, args.clients, args.seconds, slow,
                                              args.slow_reconnect_s))
        stop_render.set()
        states = [get(f"/api/render/{n}") for n in renders]
    finally:
        viewer.stop()
    log = "".join(viewer.log)
    return {"phases": phases, "renders": [{k: s[k] for k in ("id", "state", "frames", "elapsed",
                                                             "message")} for s in states],
            "server_nofile": args.server_nofile or _nofile(),
            "server_log_drops": log.count("closing the oldest"),
            "server_log_internal_errors": log.count("internal error")}


def _nofile() -> int:
    import resource

    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def load_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, phase in result["phases"].items():
        samples = phase["samples"]
        ms = [m for _, m, _, _ in samples]
        errors = sum(1 for _, _, status, _ in samples if status != 200)
        statuses: dict[str, int] = {}
        for _, _, status, _ in samples:
            if status != 200:  # 0: no answer (the connection closed or failed)
                statuses[str(status)] = statuses.get(str(status), 0) + 1
        rows.append({"what": name, **_percentiles("", ms), "p99": _pct(ms, 99), "max": max(ms),
                     "n": len(ms), "errors": errors, "error_statuses": statuses,
                     "rate": len(ms) / phase["seconds"],
                     "target": LOAD_TARGETS.get(name, float("nan")), "slow_rate": phase["slow_connects_per_s"],
                     "load_average": phase["load_average"],
                     "p95_by_5s": _over_time(samples, 5.0)})
        for kind, _ in MIX:
            ms = [m for k, m, _, _ in samples if k == kind]
            if ms:
                rows.append({"what": f"  {kind}", **_percentiles("", ms), "p99": _pct(ms, 99),
                             "max": max(ms), "n": len(ms),
                             "errors": sum(1 for k, _, s, _ in samples if k == kind and s != 200),
                             **_percentiles("server_", phase["server_ms"].get(kind))})
    return rows


def _over_time(samples: list[tuple[str, float, int, float]], step: float) -> list[float]:
    """p95 (ms) of the requests sent in each ``step`` seconds of a phase, in order: a
    stall (a render starting, a collection of garbage) shows where it happened."""
    if not samples:
        return []
    first = min(at for *_, at in samples)
    bins: dict[int, list[float]] = {}
    for _, ms, _, at in samples:
        bins.setdefault(int((at - first) // step), []).append(ms)
    return [round(_pct(bins[i], 95), 1) if i in bins else float("nan") for i in range(max(bins) + 1)]


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("all", "page", "load"), default="all")
    parser.add_argument("--worlds", type=positive_int, default=4096)
    parser.add_argument("--frames", type=positive_int, default=1000)
    parser.add_argument("--repeat", type=positive_int, default=20)
    parser.add_argument("--clients", type=positive_int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0, help="per load phase")
    parser.add_argument("--think-min", type=float, default=1.0,
                        help="seconds a client waits between two requests, at least")
    parser.add_argument("--think-max", type=float, default=3.0)
    parser.add_argument("--slow", type=int, default=2000)
    parser.add_argument("--slow-reconnect-s", type=float, default=1.0)
    parser.add_argument("--warm-up-s", type=float, default=10.0,
                        help="seconds of browsing before the measured phases (shown apart)")
    parser.add_argument("--server-nofile", type=int, default=1024,
                        help="the viewer's descriptor limit in the load part (0: this one's)")
    parser.add_argument("--render-backend", default="opengl")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/flyarchive-bench-view"))
    add_json_option(parser)
    args = parser.parse_args()
    args.server_nofile = args.server_nofile or None

    archive, model = build(args.cache, args.worlds, args.frames)
    result: dict[str, Any] = {"host_info": host_info(), "load_average": os.getloadavg(),
                              "worlds": args.worlds, "frames": args.frames,
                              "bench_nofile": _raise_nofile(args.slow + 1024)}
    print(f"descriptor limits (ulimit -n): this process {result['bench_nofile']}, the viewer "
          f"{args.server_nofile or result['bench_nofile']} (load part); load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    if args.part in ("all", "page"):
        result.update(run_page(archive, model, args))
    if args.part in ("all", "load"):
        load = run_load(archive, model, args.cache / "videos", args)
        rows = load_rows(load)
        Table([Column("what", 52, "what", align="<"), Column("p50 ms", 8, "p50", ".0f"),
               Column("p95 ms", 8, "p95", ".0f"), Column("p99 ms", 8, "p99", ".0f"),
               Column("max ms", 8, "max", ".0f"), Column("requests", 9, "n"),
               Column("errors", 7, "errors"), Column("req/s", 6, "rate", ".0f"),
               Column("server p50", 11, "server_p50", ".0f"),
               Column("server p95", 11, "server_p95", ".0f"),
               Column("slow conn/s", 12, "slow_rate", ".0f"),
               Column("load avg", 9, "load_average", ".1f"),
               Column("target p95", 11, "target", ".0f")]).print(rows)
        for row in rows:
            if "p95_by_5s" in row:
                print(f"{row['what']}: p95 (ms) of each 5 s: "
                      f"{' '.join(f'{v:.0f}' for v in row['p95_by_5s'])}")
        print(f"the viewer's descriptor limit: {load['server_nofile']}; its log said "
              f"{load['server_log_drops']} times that it closed connections that showed no "
              f"token, {load['server_log_internal_errors']} internal errors; renders during "
              f"the load: {', '.join(r['state'] for r in load['renders'])}")
        result["load"] = {"rows": rows, "renders": load["renders"],
                          "server_nofile": load["server_nofile"],
                          "server_log_drops": load["server_log_drops"],
                          "clients": args.clients, "seconds": args.seconds, "slow": args.slow,
                          "slow_reconnect_s": args.slow_reconnect_s,
                          "think_s": [args.think_min, args.think_max],
                          "render_backend": args.render_backend,
                          "load_average_after": os.getloadavg()}
    write_json(args.json, result)


def _raise_nofile(wanted: int) -> int:
    """This process's descriptor limit, raised toward ``wanted`` (the slow connections)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return _nofile()


def run_page(archive: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """The page measured through Chromium (issue 25's targets)."""
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
    return {"rows": rows, "raw_ms": {k: [round(x, 2) for x in v] for k, v in times.items()},
            "page_ms": PAGE, "server_ms": SERVER}


TARGETS = {"command to first page": 3000.0, "first page": 3000.0, "filter": 300.0,
           "traces": 300.0, "pose update": 300.0}


def _percentiles(prefix: str, values: list[float] | None) -> dict[str, float | None]:
    if not values:
        return {f"{prefix}p50": None, f"{prefix}p95": None}
    return {f"{prefix}p50": float(np.percentile(values, 50)),
            f"{prefix}p95": float(np.percentile(values, 95))}


if __name__ == "__main__":
    main()
