"""``flyarchive view URL``: open the archive and its model, then serve the page until
Ctrl-C. What the API answers is computed here (:class:`Viewer`); the web side is
:mod:`flyarchive.view.server`.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import ipaddress
import logging
import math
import socket
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flyarchive.errors import (
    ArchiveReplacedError,
    FlyarchiveError,
    OptionsError,
    OutputLocationError,
    SelectionError,
    did_you_mean,
)
from flyarchive.layout import dof_units, length_unit
from flyarchive.view import gait_panels
from flyarchive.view import geom_poses
from flyarchive.view import traces as traces_
from flyarchive.view.shown_archive import ViewedArchive, load_viewed_model, start_readers
from flyarchive.view.limits import Limits, check_cost
from flyarchive.view.logs import SafeLines, visible
from flyarchive.view.renders import MAX_WORLDS as RENDER_WORLDS
from flyarchive.view.renders import Renders, best_backend
from flyarchive.view.table import column_units, scatter_points

log = logging.getLogger("flyarchive.view")


class Viewer:
    """What one viewer shows: the archive, its model (None: no 3D view, no renders, and
    ``model_problem`` says why), and the renders asked for.

    The archive's header is read here (and states are read from the start, without xarray
    or dask: :class:`~flyarchive.view.shown_archive.ViewedArchive`); the model is loaded after
    the server listens (:meth:`warm_up`), so that the first page does not wait for it:
    requests that need it wait.

    Args:
        url, storage_options: The archive.
        model_path: A model file to pose and render with; None: the one kept beside the
            archive.
        out: The folder videos are rendered into (made if missing).
        backend: The renderer (:func:`~flyarchive.view.renders.best_backend` if None).
        limits: What one request may cost, how many renders may wait
            (:class:`~flyarchive.view.limits.Limits`).

    Raises:
        As :func:`flyarchive.store.dataset.open_header` (before anything is served),
        ModelLoadError: no file at ``model_path``, and
        OutputLocationError: ``out`` is not a folder that can be made.
    """

    def __init__(self, url: str, *, storage_options: Mapping[str, Any] | None = None,
                 model_path: str | None = None, out: str | Path = "view-videos",
                 backend: str | None = None, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.viewed = ViewedArchive(url, storage_options)
        self.out = _output_folder(out)
        if model_path and not Path(model_path).is_file():
            load_viewed_model(url, storage_options, model_path)  # raises: no file there
        self._model_source = (url, storage_options, model_path)
        self.model: Any = None
        self.model_problem = ""
        self.poser: Any = None
        self._model_loaded = threading.Event()
        self._model_lock = threading.Lock()
        self.first_page = threading.Event()
        self._closing = threading.Event()
        self._warming: threading.Thread | None = None
        self._scene: tuple[dict[str, Any], bytes] | None = None
        self.gaits = gait_panels.GaitCache()
        self.renders = Renders(self.viewed, None, self.out, backend or best_backend(),
                               self.limits)

    # ------------------------------------------------------------------ loading
    def warm_up(self, wait_for_page_s: float = 2.0, *, freeze: bool = False) -> None:
        """Load the model on a thread of its own: after the first page's table was answered
        (or ``wait_for_page_s`` passed), so that its loading does not hold the interpreter
        while the page loads. Problems are logged; the requests that need the model
        report them.

        The lazy dataset (xarray and dask) is not opened here: only keypoint traces need
        it (their first request opens it). Opened here, its imports and its first dask
        computation held the interpreter for seconds while the page was already in use
        (a filter took 1.6 s on the loaded 2-core machine).

        With ``freeze`` (a process that is only the viewer: ``flyarchive view``), what is
        loaded by then lives as long as the process and is kept out of the cyclic garbage
        collector's full passes (``gc.freeze``), which otherwise walk it all again while a
        request waits (one traces request in ~20 took 0.4-0.55 s instead of 0.2)."""

        def work() -> None:
            self.first_page.wait(wait_for_page_s)
            if self._closing.is_set():
                return
            self.load_model()
            start_readers(self.viewed.processes)  # their imports, before the first read
            if freeze:
                gc.collect()
                gc.freeze()

        self._warming = threading.Thread(target=work, name="flyarchive-view-warm-up", daemon=True)
        self._warming.start()

    def close(self, timeout_s: float = 60.0) -> None:
        """Let a warm-up under way end (a model being loaded is loaded; one not begun is
        not): nothing of this viewer runs on after it is stopped."""
        self._closing.set()
        self.first_page.set()
        if self._warming is not None:
            self._warming.join(timeout_s)

    def load_model(self) -> Any:
        """The model (loaded once, here or by :meth:`warm_up`); None when there is none
        (``model_problem`` says why)."""
        with self._model_lock:
            if self._model_loaded.is_set():
                return self.model
            url, storage_options, model_path = self._model_source
            try:
                model = load_viewed_model(url, storage_options, model_path)
                _check_fits(model, self.viewed.attrs)
                self.model = model
            except FlyarchiveError as err:
                self.model_problem = str(err)
                log.warning("no 3D view or renders: %s", err)
            except Exception as err:  # noqa: BLE001 - said on the page, not a crash
                self.model_problem = f"{type(err).__name__}: {err}"
                log.error("no 3D view or renders: %s", self.model_problem)
            if self.model is not None:
                self.poser = geom_poses.Poser(self.model)
                self.renders.model = self.model
            self._model_loaded.set()
            return self.model

    # ------------------------------------------------------------------ answers
    def info(self) -> dict[str, Any]:
        """What the page needs first: sizes, times, dofs, what is available (the model's
        part once it is loaded: :meth:`model_info`)."""
        viewed = self.viewed
        info = {
            "url": viewed.url, "worlds": len(viewed.world_ids), "frames": len(viewed.times),
            "times": viewed.times, "fps": viewed.fps,
            "playback_speed": float(viewed.attrs.get("playback_speed", 1.0)),
            "dofs": viewed.dofs, "columns": list(viewed.columns),
            "backend": self.renders.backend, "out": str(self.out),
            "generation": viewed.generation, "archive_id": viewed.archive_id,
            "dof_units": dof_units(viewed.attrs.get("layout")),
            "column_units": column_units(viewed.column_attrs),
            "length_unit": length_unit(viewed.attrs.get("layout")),
            "max_gait_frames": self.limits.max_gait_frames,
        }
        if self._model_loaded.is_set():
            info.update(self.model_info())
        return info

    def model_info(self) -> dict[str, Any]:
        """The model's part of :meth:`info` (waits for the model): whether there is one
        (and why not), its cameras and bodies."""
        from flyarchive.models import camera_names

        model = self.load_model()
        bodies = _bodies(model) if model is not None else []
        return {"model": model is not None, "model_problem": self.model_problem,
                "cameras": list(camera_names(model)) if model is not None else [],
                "keypoints": model is not None, "bodies": bodies,
                "gait_problem": _gait_problem(model, bodies, self.model_problem)}

    def changes(self) -> dict[str, Any]:
        """What changed in the archive since the viewer opened it: frames a writer
        appended (the frames committed then and now, summed over worlds, and the worlds
        that have more now) and world variables added, replaced or removed (their names).
        The page asks when it opens and now and then, and offers to open it again.

        Raises:
            ArchiveReplacedError: the archive was replaced.
            StorageError: the storage did not answer.
        """
        viewed = self.viewed
        shown, generation = viewed.columns, viewed.generation
        now = viewed.columns_now()
        before, after = shown["n_frames"], now["n_frames"]
        grown = int(np.count_nonzero(after > before)) if after.shape == before.shape else 0
        names = [n for n in dict.fromkeys([*shown, *now]) if n not in ("world", "n_frames")]
        changed = [n for n in names if n not in shown or n not in now
                   or not _same_values(shown[n], now[n])]
        return {"frames_shown": int(before.sum()), "frames_now": int(after.sum()),
                "worlds_grown": grown, "variables_changed": changed, "generation": generation}

    def reopen(self) -> None:
        """Open the archive again (after it was replaced): its header, world table and
        states, and its model (the kept one, or the ``--model`` file checked against the
        new archive); renders still waiting are dropped (they were asked of the old one).

        Raises:
            As :func:`flyarchive.store.dataset.open_header`.
        """
        with self._model_lock:
            self.viewed.open()
            self.model, self.poser, self._scene, self.model_problem = None, None, None, ""
            self.renders.model = None
            self.renders.drop_waiting("the archive was opened again; ask for it again")
            self.gaits.clear()
            self._model_loaded.clear()
        self.load_model()
        log.info("opened %s again (%d worlds x %d frames)", self.viewed.url,
                 len(self.viewed.world_ids), len(self.viewed.times))

    def check_archive(self, shown: str | None) -> None:
        """Before an answer from the archive: is it still the one the viewer opened, and
        the one the page shows?

        Args:
            shown: The ``archive_id`` the page shows (its ``X-Flyarchive-Archive``
                header); None: not said (a client other than the page).

        Raises:
            ArchiveReplacedError: replaced or deleted since it was opened
                (:meth:`ViewedArchive.check_same`), or opened again since the page was
                (another ``archive_id``).
            StorageError: the storage did not answer.
        """
        viewed = self.viewed
        if shown is not None and shown != viewed.archive_id:
            raise ArchiveReplacedError(
                f"This page shows the archive {visible(shown, 80)!r}; the viewer has opened "
                f"{viewed.url!r} again since (archive_id {viewed.archive_id!r}). Open it again "
                "here (or reload the page) to see it.")
        viewed.check_same()

    def traces(self, query: Mapping[str, str]) -> bytes:
        """Min/max-per-column traces of the selected worlds (see
        :mod:`flyarchive.view.traces`), packed for the page (:func:`traces_.pack`).

        Raises:
            SelectionError: a bad parameter (unknown world or dof, a time that is no
                number, start after end, no frame between them).
            RequestTooLargeError: worlds x dofs, the states read or the answer past
                :class:`~flyarchive.view.limits.Limits`.
        """
        viewed, limits = self.viewed, self.limits
        worlds = list(dict.fromkeys(_worlds(query.get("worlds", ""))))  # each world once
        width = _number(query, "width", 800, int)
        traces_.check_request(worlds, width)
        viewed.index_of(worlds)
        window = viewed.frame_window(_number(query, "start", None, float),
                                     _number(query, "end", None, float))
        times = viewed.times[window]
        keypoint = query.get("keypoint", "")
        if keypoint:
            bodies = _bodies(self._model_for("keypoint traces"))
            if keypoint not in bodies:
                raise SelectionError(
                    f"The model has no body {visible(keypoint, 60)!r}."
                    f"{did_you_mean(keypoint[:100], bodies)} It has {len(bodies)} bodies, e.g. "
                    f"{', '.join(map(repr, bodies[:6]))}.")
            labels = [f"{keypoint}/{axis}" for axis in "xyz"]
        else:
            labels = traces_.dof_choices(viewed.dofs, leg=query.get("leg", ""),
                                         joint=query.get("joint", ""),
                                         axis=query.get("axis", ""), dof=query.get("dof", ""))
        lines = len(worlds) * len(labels)
        narrow = "Select fewer worlds or dofs, or a shorter time window."
        check_cost("The traces", lines, limits.max_trace_lines, "lines", narrow)
        check_cost("The states read for the traces",
                   len(worlds) * len(viewed.times) * viewed.state_values * 8,
                   limits.max_read_bytes, "bytes", "Select fewer worlds.")
        points = min(len(times), 2 * width)  # what min_max_columns keeps at most
        check_cost("The traces' answer", lines * points * 8, limits.max_out_bytes, "bytes",
                   narrow + " Or a narrower plot.")
        if keypoint:
            labels, values = traces_.keypoint_values(viewed.ds, worlds, keypoint, window,
                                                     model=self._model_for("keypoint traces"))
            t, v = traces_.min_max_columns(times, values.reshape(-1, values.shape[-1]), width)
        else:
            columns = [viewed.dofs.index(label) for label in labels]
            parts = [traces_.min_max_columns(times, s["qpos"][window][:, columns].T, width)
                     for s in viewed.states(worlds)]  # world by world: memory of one
            t, v = parts[0][0], np.concatenate([p[1] for p in parts])
        lines_of = [(worlds[i // len(labels)], labels[i % len(labels)]) for i in range(len(v))]
        return traces_.pack({"labels": labels, "lines": lines_of, "frames": int(len(times))},
                            t, v)

    def scene(self) -> tuple[dict[str, Any], bytes]:
        """The model's visible geoms for the 3D view (built once)."""
        self._model_for("3D view")
        if self._scene is None:
            self._scene = geom_poses.scene(self.model, self.poser.geoms)
            self.renders.warm()  # the page is up: now the renderer may take the CPU
        return self._scene

    def poses(self, query: Mapping[str, str]) -> tuple[bytes, tuple[int, ...]]:
        """Geom poses of worlds over frames ``start .. start + count - 1``, float32
        ``(worlds, count, geoms + 1, 12)`` as bytes (:meth:`Poser.poses`)."""
        self._model_for("3D view")
        worlds = list(dict.fromkeys(_worlds(query.get("worlds", ""))))
        if not worlds or len(worlds) > geom_poses.MAX_WORLDS:
            raise SelectionError(f"Show 1 to {geom_poses.MAX_WORLDS} worlds side by side, not "
                                 f"{len(worlds)}.")
        n = len(self.viewed.times)
        start = _number(query, "start", 0, int)
        count = _number(query, "count", 1, int)
        if not 0 <= start < n or not 1 <= count <= geom_poses.MAX_FRAMES:
            raise SelectionError(f"Frames {start} + {count}: the archive has frames 0 to {n - 1}, "
                                 f"and one request covers 1 to {geom_poses.MAX_FRAMES}.")
        frames = list(range(start, min(start + count, n)))
        check_cost("The states read for the poses",
                   len(worlds) * n * self.viewed.state_values * 8, self.limits.max_read_bytes,
                   "bytes", "Show fewer worlds side by side.")
        check_cost("The poses' answer", len(worlds) * len(frames) * (len(self.poser.geoms) + 1) * 48,
                   self.limits.max_out_bytes, "bytes", "Ask for fewer frames at once.")
        states = self.viewed.states(worlds)
        out = np.stack([self.poser.poses(s, frames) for s in states])
        return out.tobytes(), out.shape

    def gait(self, query: Mapping[str, str]) -> dict[str, Any]:
        """The gait of the shown worlds over a time window (:mod:`flyarchive.view.gait_panels`):
        per world each leg's stance intervals, the thorax's path (thinned) and a few
        measures, with their units.

        Query: ``worlds`` (ids, comma-separated, 1 to
        :data:`~flyarchive.view.gait_panels.MAX_WORLDS`), ``start`` and ``end`` (seconds; none:
        the whole recording; a window reaching past the recording is cut to it).

        Raises:
            SelectionError: no model (why), a model without a fly's thorax and tarsus
                tips, unknown worlds, a time that is no number, a window without two
                frames.
            RequestTooLargeError: worlds x frames, the states read or the answer past
                :class:`~flyarchive.view.limits.Limits`.
        """
        viewed, limits = self.viewed, self.limits
        worlds = list(dict.fromkeys(_worlds(query.get("worlds", ""))))
        gait_panels.check_worlds(worlds)
        at = viewed.index_of(worlds)
        window = viewed.frame_window(_number(query, "start", None, float),
                                     _number(query, "end", None, float))
        frames = window.stop - window.start
        if frames < 2:
            raise SelectionError(f"Gait needs at least 2 frames; the window holds {frames} "
                                 f"(at {viewed.times[window.start]:g} s). Widen it.")
        narrow = "Show fewer worlds, or a shorter time window."
        check_cost("The gait", len(worlds) * frames, limits.max_gait_frames, "frames", narrow)
        check_cost("The states read for the gait",
                   len(worlds) * frames * viewed.state_values * 8, limits.max_read_bytes,
                   "bytes", narrow)
        check_cost("The gait's answer", gait_panels.answer_bytes(len(worlds), frames),
                   limits.max_out_bytes, "bytes", narrow)
        model = self._model_for("gait")
        thorax = gait_panels.thorax_of(_bodies(model))
        times = viewed.times[window]
        kept_model = not self._model_source[2]  # then positions kept for it are read
        keys = {w: (viewed.archive_id, viewed.generation, w, int(viewed.n_frames[i]),
                    window.start, window.stop) for w, i in zip(worlds, at)}
        found = self.gaits.get(keys, lambda missing: gait_panels.world_gaits(
            viewed.ds, missing, (float(times[0]), float(times[-1])), thorax=thorax,
            model=None if kept_model else model, storage_options=viewed.storage_options or None))
        return {"legs": list(found[0].legs), "thorax": thorax,
                "window": [float(times[0]), float(times[-1])], "frames": frames,
                "units": gait_panels.units(traces_.LENGTH_UNIT),
                "worlds": [g.as_json() for g in found]}

    def scatter(self, query: Mapping[str, str]) -> dict[str, Any]:
        """Two world variables (``x``, ``y``) of the worlds a filter (``where``) keeps, as
        scatter points (:func:`~flyarchive.view.table.scatter_points`), with their units.

        Raises:
            SelectionError: unknown or text columns, a bad filter.
            RequestTooLargeError: the answer past ``max_out_bytes``.
        """
        columns = self.viewed.columns
        check_cost("The scatter's answer", len(columns["world"]) * 3 * 26,
                   self.limits.max_out_bytes, "bytes", "The archive has too many worlds to "
                   "plot at once.")
        answer = scatter_points(columns, x=query.get("x", ""), y=query.get("y", ""),
                                where=query.get("where", ""))
        units = column_units(self.viewed.column_attrs)
        answer["units"] = {k: units[k] for k in (answer["x"], answer["y"]) if k in units}
        return answer

    def render(self, body: Any, *, client: str = "") -> dict[str, Any]:
        """Queue a render (:class:`~flyarchive.view.renders.Renders`) asked for by
        ``client`` (the page's id); its job as JSON.

        Args:
            body: ``{"worlds": [ids], "camera": name, "size": "HxW", "start": s, "end": s}``
                (size, start and end optional).

        Raises:
            SelectionError: a body that is not such an object (each key's problem said).
            RequestTooLargeError, ServerBusyError: as :meth:`Renders.submit`.
        """
        worlds, camera, start, end, size = self._render_request(body)
        self.load_model()
        return self.renders.submit(worlds, camera, start, end, size, client=client).as_json()

    def render_many(self, body: Any, *, client: str = "") -> dict[str, Any]:
        """Queue renders of many worlds (the scatter's brushed worlds): one video per
        group of at most :data:`~flyarchive.view.renders.MAX_WORLDS` worlds (the fewest
        groups, of even sizes, in the order given), as many as the queue takes from this
        page now (:meth:`Renders.submit_many`); the answer says which worlds were not
        queued, and why.

        Args:
            body: As for :meth:`render`, with any number of worlds.

        Returns:
            ``{"jobs": [job...], "queued": [ids], "not_queued": [ids], "message": text}``.

        Raises:
            SelectionError, RequestTooLargeError: as :meth:`render` (nothing queued).
            ServerBusyError: the queue takes none now.
        """
        worlds, camera, start, end, size = self._render_request(body)
        self.load_model()
        jobs, why = self.renders.submit_many(_groups(worlds, RENDER_WORLDS), camera, start, end,
                                             size, client=client)
        queued = [w for job in jobs for w in job.worlds]
        left = worlds[len(queued):]
        message = (f"Queued {len(jobs)} render{'s' * (len(jobs) > 1)} of {len(queued)} "
                   f"world{'s' * (len(queued) > 1)} (at most {RENDER_WORLDS} tiled in a video).")
        if left:
            message += f" {len(left)} worlds were not queued: {why}"
        return {"jobs": [job.as_json() for job in jobs], "queued": queued, "not_queued": left,
                "message": message}

    def _render_request(self, body: Any) -> tuple[list[int], str, float | None, float | None,
                                                  tuple[int, int]]:
        """A render request's worlds, camera, start, end and size.

        Raises:
            SelectionError: a body that is not such an object (each key's problem said).
        """
        if not isinstance(body, dict):
            raise SelectionError("A render request is a JSON object: {\"worlds\": [0, 3], "
                                 "\"camera\": \"...\", \"size\": \"240x320\"}.")
        unknown = sorted(set(body) - {"worlds", "camera", "size", "start", "end"})
        if unknown:
            raise SelectionError(f"A render request has no key {visible(unknown[0], 40)!r}; its "
                                 "keys are worlds, camera, size, start and end.")
        worlds = _world_ids(body.get("worlds"))
        camera = body.get("camera") or ""
        size = body.get("size") or "240x320"
        if not isinstance(camera, str) or not isinstance(size, str):
            raise SelectionError("camera and size are text: \"front\", \"240x320\".")
        start, end = (_seconds(body.get(k), k) for k in ("start", "end"))
        return worlds, camera, start, end, _size(size)

    def _model_for(self, what: str) -> Any:
        """The model (waits for it); SelectionError when there is none."""
        model = self.load_model()
        if model is None:
            raise SelectionError(f"No {what}: {self.model_problem}")
        return model


def _gait_problem(model: Any, bodies: list[str], model_problem: str | None) -> str | None:
    """Why the gait panels cannot be drawn (no model, or no fly in it), as /api/gait would
    answer; None when they can: the page then does not ask."""
    if model is None:
        return f"No gait: {model_problem}"
    try:
        gait_panels.thorax_of(bodies)
    except SelectionError as err:
        return str(err)
    return None


def _bodies(model: Any) -> list[str]:
    import mujoco

    return [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, b) or f"body{b}"
            for b in range(1, model.nbody)]


def _check_fits(model: Any, attrs: Mapping[str, Any]) -> None:
    """Refuse a model whose joints are not the archive's (its ``layout`` attribute).

    Raises:
        LayoutMismatchError: naming both sides.
    """
    from flyarchive.layout import ModelLayout, check_compatible

    if "layout" in attrs:
        check_compatible(ModelLayout.from_attrs(attrs["layout"]), ModelLayout.from_model(model))


def _worlds(text: str) -> list[int]:
    """``"0,3,7"`` -> ``[0, 3, 7]`` (the page sends world ids, comma-separated)."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SelectionError(f"Cannot read worlds {visible(text, 60)!r}; the page sends ids "
                             "like '0,3,7'.") from None


def _groups(worlds: list[int], most: int) -> list[list[int]]:
    """``worlds`` in order, cut into the fewest groups of at most ``most``, of even sizes
    (18 by 16: 9 and 9); one empty group for no world."""
    count = max(1, -(-len(worlds) // most))
    size, extra = divmod(len(worlds), count)
    out, at = [], 0
    for i in range(count):
        n = size + (i < extra)
        out.append(worlds[at:at + n])
        at += n
    return out


def _world_ids(value: Any) -> list[int]:
    """The world ids of a render request: a list of whole numbers (each once).

    Raises:
        SelectionError: anything else (text, NaN, infinity, fractions, nesting).
    """
    if not isinstance(value, list):
        raise SelectionError(f"worlds must be a list of world ids such as [0, 3], not "
                             f"{visible(repr(value), 60)}.")
    if len(value) > 10_000:
        raise SelectionError(f"worlds lists {len(value):,} ids; a render tiles at most "
                             f"{RENDER_WORLDS}.")
    ids = []
    for w in value:
        whole = isinstance(w, int) and not isinstance(w, bool) or \
            isinstance(w, float) and math.isfinite(w) and w.is_integer()
        if not whole or not -2**63 <= w < 2**63:
            raise SelectionError(f"worlds must hold whole numbers (world ids), not "
                                 f"{visible(repr(w), 60)}.")
        ids.append(int(w))
    return list(dict.fromkeys(ids))


def _seconds(value: Any, name: str) -> float | None:
    """A render's ``start`` or ``end``: a finite number of seconds, or None."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(float(value)):
        raise SelectionError(f"{name} must be a number of seconds, not "
                             f"{visible(repr(value), 60)}.")
    return float(value)


def _size(text: str) -> tuple[int, int]:
    """``"240x320"`` -> ``(240, 320)`` (height x width; checked by RenderOptions)."""
    height, sep, width = text.lower().partition("x")
    if not (sep and height.isdigit() and width.isdigit() and len(height) < 7 and len(width) < 7):
        raise SelectionError(f"Cannot read size {visible(text, 40)!r}; write HEIGHTxWIDTH, "
                             "e.g. 240x320.")
    return int(height), int(width)


def _number(query: Mapping[str, str], name: str, default: Any, kind: Any) -> Any:
    text = query.get(name, "")
    if text == "":
        return default
    try:
        value = kind(text) if len(text) <= 40 else None
    except ValueError:
        value = None
    if value is None or kind is float and not math.isfinite(value):
        raise SelectionError(f"{name} must be a {'whole ' if kind is int else ''}number, not "
                             f"{visible(text, 40)!r}.")
    return value


def _output_folder(out: str | Path) -> Path:
    path = Path(out).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise OutputLocationError(
            f"The output folder {str(path)!r} is a file (or inside one); pass --out FOLDER."
        ) from None
    return path


# ---------------------------------------------------------------------- serving
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Hosts that bind every interface: the viewer then answers at any of the machine's
#: addresses and at its names, and prints its name.
WILDCARDS = ("0.0.0.0", "::")


def exposure_warning(host: str) -> str:
    """What serving on ``host`` exposes (``""`` for loopback addresses)."""
    if host in LOOPBACK:
        return ""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return ""
    except ValueError:
        pass
    return (f"warning: serving on {host!r}: anyone who can reach this machine on that address "
            "and has the token can read every world of the archive, its model and the "
            "rendered videos, and render more (CPU time and disk in the output folder). The "
            "connection is plain HTTP: the token travels unencrypted. Use an SSH tunnel to "
            "127.0.0.1 instead where you can.")


class Served:
    """A running viewer: :func:`start` returns it; ``url`` is the address with the token.

    Attributes:
        viewer: The :class:`Viewer`.
        connections: Its accept loop (:class:`~flyarchive.view.connections.Connections`).
        url, token: The address to open, and its token.
    """

    def __init__(self, viewer: Viewer, app: Any, runner: Any, connections: Any,
                 lines: SafeLines, loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                 url: str, token: str) -> None:
        self.viewer, self.app, self.runner, self.connections = viewer, app, runner, connections
        self.lines, self.loop, self.thread = lines, loop, thread
        self.url, self.token = url, token
        self._stopped = False

    def stop(self) -> None:
        """Stop serving: close every connection, drop waiting renders (idempotent)."""
        if self._stopped:
            return
        self._stopped = True

        async def down() -> None:
            await self.connections.close()
            await self.runner.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(down(), self.loop).result(timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.app.close()
            self.viewer.renders.close()
            self.viewer.close()
            self.lines.detach()


#: errno of binding to a host that is not an address of this machine (socket.create_server
#: raises a name lookup's failure as a plain OSError with its EAI_* code).
_NOT_AN_ADDRESS = frozenset({errno.EADDRNOTAVAIL, *(getattr(socket, name) for name in (
    "EAI_NONAME", "EAI_ADDRFAMILY", "EAI_NODATA") if hasattr(socket, name))})


def start(viewer: Viewer, *, host: str = "127.0.0.1", port: int = 0,
          token: str | None = None, freeze_gc: bool = False) -> Served:
    """Serve ``viewer`` on a thread of its own, within its limits (``viewer.limits``:
    connections, timeouts, costs); returns once it listens. ``freeze_gc``: the process is
    only the viewer (see :meth:`Viewer.warm_up`).

    Raises:
        OptionsError: the port cannot be listened on (in use, not allowed).
    """
    from aiohttp import web

    from flyarchive.view.connections import Connections
    from flyarchive.view.logs import HTTP_LOGGER
    from flyarchive.view.server import ViewApp

    limits = viewer.limits
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise OptionsError(f"port must be a whole number from 0 to 65535 (0: any free one), "
                           f"got {port!r}. Pass another --port.")
    try:
        sock = socket.create_server((host, port), backlog=1024)
    except OSError as err:
        if isinstance(err, socket.gaierror) or err.errno in _NOT_AN_ADDRESS:
            raise OptionsError(
                f"Cannot serve on {host}:{port}: {host!r} is not an address of this machine "
                f"({err.strerror or err}). Pass another --host: 127.0.0.1 (this machine only), "
                "0.0.0.0 (every interface) or one of its addresses.") from None
        raise OptionsError(f"Cannot serve on {host}:{port} ({err.strerror or err}). Pass another "
                           "--port, or 0 for any free one.") from None
    bound = int(sock.getsockname()[1])
    app = ViewApp(viewer, token, limits)
    wildcard = host in WILDCARDS
    names = {socket.gethostname(), socket.getfqdn()} if wildcard else set()
    app.serve_on({host, *LOOPBACK, "[::1]"} | names if host in LOOPBACK or wildcard else {host},
                 bound, any_address=wildcard)
    lines = SafeLines([app.token])  # log lines: control characters escaped, no token
    lines.attach()
    loop = asyncio.new_event_loop()
    # aiohttp's own bounds: request line and headers, idle keep-alive connections, and
    # the unread rest of a refused body (read and dropped at most that long, then closed);
    # the accept loop (Connections) adds what aiohttp has not
    runner = web.AppRunner(app.app, access_log=None, handle_signals=False,
                           keepalive_timeout=limits.idle_timeout_s,
                           lingering_time=min(limits.body_timeout_s, 2.0),
                           max_line_size=limits.max_line_bytes,
                           max_field_size=limits.max_field_bytes, max_headers=limits.max_headers,
                           logger=logging.getLogger(HTTP_LOGGER))

    async def listen() -> Connections:
        await runner.setup()
        connections = Connections(sock, runner.server, limits)
        app.connections = connections
        connections.start()
        return connections

    thread = threading.Thread(target=loop.run_forever, name="flyarchive-view-server", daemon=True)
    thread.start()  # the loop runs on its own thread: the caller may run another loop
    connections = asyncio.run_coroutine_threadsafe(listen(), loop).result(timeout=60)
    log.info("serving at most %d connections at once (file descriptor limit %s)",
             connections.budget, _descriptor_limit())
    viewer.warm_up(freeze=freeze_gc)
    shown = socket.gethostname() if wildcard else f"[{host}]" if ":" in host else host
    return Served(viewer, app, runner, connections, lines, loop, thread,
                  f"http://{shown}:{bound}/?token={app.token}", app.token)


def _descriptor_limit() -> str:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError):
        return "unknown"
    return "unlimited" if soft < 0 else str(soft)


def run_view(url: str, *, storage_options: Mapping[str, Any] | None = None,
             model_path: str | None = None, host: str = "127.0.0.1", port: int = 8750,
             out: str = "view-videos", backend: str | None = None) -> int:
    """``flyarchive view``: open, serve, print the address, wait for Ctrl-C.

    Raises:
        As :class:`Viewer` and :func:`start` (before anything is served).
    """
    handler = _log_to_stderr()
    try:
        return _serve(url, storage_options, model_path, host, port, out, backend)
    finally:
        log.removeHandler(handler)


def _serve(url: str, storage_options: Mapping[str, Any] | None, model_path: str | None,
           host: str, port: int, out: str, backend: str | None) -> int:
    viewer = Viewer(url, storage_options=storage_options, model_path=model_path, out=out,
                    backend=backend)
    try:
        served = start(viewer, host=host, port=port, freeze_gc=True)
    except OptionsError:
        if port != 8750:
            raise
        # the default port is taken: any free one
        served = start(viewer, host=host, port=0, freeze_gc=True)
    warning = exposure_warning(host)
    if warning:
        print(f"flyarchive view: {warning}", file=sys.stderr, flush=True)
    viewed = viewer.viewed
    print(f"flyarchive view: {url} ({len(viewed.world_ids)} worlds x {len(viewed.times)} frames); "
          f"videos go to {viewer.out}", flush=True)
    print(f"flyarchive view: open {served.url}", flush=True)
    print("flyarchive view: Ctrl-C stops it", flush=True)
    try:
        threading.Event().wait()
    finally:
        served.stop()
    return 0


def _log_to_stderr() -> logging.Handler:
    """The viewer's log lines on stderr, with the time; the handler (removed at the end)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[flyarchive view %(asctime)s] %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return handler


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two columns of the world table hold the same values (NaN equal to NaN)."""
    if a.shape != b.shape or a.dtype.kind != b.dtype.kind:
        return False
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))
