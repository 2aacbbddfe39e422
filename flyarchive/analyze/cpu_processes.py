"""CPU positions of a whole window into host memory on every core: this process and the
worker processes of :mod:`~flyarchive.store.window_reader` take pieces of the window's
worlds as they finish, each reading them itself and running
:class:`~flyarchive.analyze.cpu_positions.CpuKinematics` on them, into a shared-memory
block this process owns (:func:`cpu_positions_in_processes`).

Why processes: ``mj_kinematics`` releases the GIL, but the Python around each frame
(setting ``qpos``, copying the result, about a microsecond) holds it, so two threads hand
the GIL to each other twice a frame and run no faster than one (NeuroMechFly, gait's
keypoints, 2 threads on 2 quiet cores: 0.84x one thread). A job is the state reader's
JSON (the archive's URL, boxes of worlds and frames) plus the keypoints' definitions and
the names of two shared-memory blocks: the model's MJB bytes and the result; no array is
pickled. Each frame is computed by the same engine as in one process: the result is
bit-exact with the single-threaded one.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from flyarchive.analyze.keypoints import KeypointSet
from flyarchive.analyze.prepare import Prepared
from flyarchive.store.reader import row_boxes
from flyarchive.store.window_reader import ProcessWindowReader, attach_block, window_reader

#: Frames of a window from which :func:`worth_processes` says yes (starting a worker
#: costs about a CPU second of imports; NeuroMechFly computes ~100,000 frames a second).
AUTO_FRAMES = 200_000
#: The function a worker process of the window readers runs a positions job with.
_HANDLER = "flyarchive.analyze.cpu_processes:run_kinematics_job"


def worth_processes(prepared: Prepared) -> int:
    """Worker processes to compute the prepared window with, beside this process: one per
    other usable core when the window holds at least :data:`AUTO_FRAMES` frames; else 0."""
    cores = len(os.sched_getaffinity(0))
    frames = int(prepared.ds.sizes["world"]) * int(prepared.ds.sizes["time"])
    return cores - 1 if frames >= AUTO_FRAMES else 0


def cpu_positions_in_processes(prepared: Prepared, orientations: bool, processes: int, *,
                               here: bool = True) -> np.ndarray | None:
    """``(world, time, K, 3 | 7)`` float64 keypoints of the prepared window, computed by
    this process and ``processes`` worker processes taking pieces of it as they finish
    (as :func:`flyarchive.positions` computes them on the CPU, bit for bit); None when
    the window cannot be read by other processes (a ``memory://`` archive, a dataset not
    read from an archive): compute it in this one.

    This process computes pieces too (``here``; its engine is warm, it needs no start),
    so a first call gets going while the workers import and open the archive.

    Raises:
        As reading the archive and :func:`flyarchive.positions` raise (a worker's error
        is raised here as the same flyarchive error).
    """
    from flyarchive.analyze.blocks import thread_engine

    ds, kp = prepared.ds, prepared.keypoints
    names = ["qpos"]
    if "mocap_pos" in ds and ds.sizes.get("mocap", 0) > 0:
        names += ["mocap_pos", "mocap_quat"]
    reader = window_reader(prepared.ds, prepared.whole, names, processes=processes)
    if not isinstance(reader, ProcessWindowReader):
        return None
    worlds, frames = int(ds.sizes["world"]), int(ds.sizes["time"])
    channels = 7 if orientations else 3
    rows = worlds * frames
    if rows == 0:
        return np.empty((worlds, frames, len(kp), channels))
    blob = prepared.model.blob
    out = shared_memory.SharedMemory(create=True, size=rows * len(kp) * channels * 8)
    model = shared_memory.SharedMemory(create=True, size=len(blob))
    try:
        model.buf[:len(blob)] = blob
        spec = {"model": model.name, "size": len(blob), "sha256": prepared.model.sha256,
                "keypoints": keypoints_json(kp), "orientations": orientations,
                "shape": [rows, len(kp), channels]}
        layout = {name: (0, tuple(int(s) for s in reader.getters[name].shape[2:]),
                         np.dtype(reader.getters[name].dtype)) for name in names}
        view = np.ndarray((rows, len(kp), channels), np.float64, buffer=out.buf)
        pieces: queue.SimpleQueue[tuple[int, int, int, int, int]] = queue.SimpleQueue()
        for piece in _pieces_of(reader, rows, processes + 1):
            pieces.put(piece)
        errors: list[BaseException] = []

        def remote() -> None:  # one thread per worker: a piece at a time
            while not errors:
                try:
                    piece = pieces.get_nowait()
                except queue.Empty:
                    return
                try:
                    reader.pool.run([{**reader.job(out.name, layout, [piece]),
                                      "kinematics": spec, "handler": _HANDLER}])
                except BaseException as err:  # noqa: BLE001 - raised below
                    errors.append(err)

        threads = [threading.Thread(target=remote, daemon=True) for _ in range(processes)]
        for thread in threads:
            thread.start()
        engine = thread_engine(prepared.model.sha256, blob, kp, orientations, "cpu")
        inner = {name: layout[name][1] for name in names}
        while here and not errors:
            try:
                piece = pieces.get_nowait()
            except queue.Empty:
                break
            compute_boxes(engine, reader.getters, inner, [piece], reader.start, view)
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        result = np.array(view)
        del view
    finally:
        for block in (out, model):
            block.close()
            block.unlink()
    reader.mask({"qpos": result}, row_boxes(0, rows, reader.n_time))
    return result.reshape(worlds, frames, len(kp), channels)


def _pieces_of(reader: ProcessWindowReader, rows: int, hands: int
               ) -> list[tuple[int, int, int, int, int]]:
    """The window's boxes (cut at shards, as the reader cuts them) cut again into runs of
    worlds: about 8 pieces per hand, so that each is busy to the end."""
    boxes = sorted((box for part in reader.pieces(row_boxes(0, rows, reader.n_time))
                    for box in part),
                   key=lambda box: box[4])
    target = max(1, rows // (8 * hands))
    cut = []
    for w0, w1, t0, t1, row in boxes:
        per = max(1, target // max(1, t1 - t0))  # worlds per piece
        for a in range(w0, w1, per):
            cut.append((a, min(w1, a + per), t0, t1, row + (a - w0) * (t1 - t0)))
    return cut


def compute_boxes(engine: Any, getters: dict[str, Any], inner: dict[str, tuple[int, ...]],
                  boxes: Any, start: int, view: np.ndarray) -> None:
    """Read each box ``(w0, w1, t0, t1, row)`` of the state arrays ``inner`` (name ->
    trailing shape) through ``getters`` (frames from ``start``) and write its keypoints
    into ``view`` from ``row``."""
    for w0, w1, t0, t1, row in boxes:
        n = (w1 - w0) * (t1 - t0)
        state = [getters[name][w0:w1, start + t0:start + t1].reshape(n, *shape)
                 for name, shape in inner.items()]
        view[row:row + n] = engine.frames(*state)


def keypoints_json(kp: KeypointSet) -> dict[str, Any]:
    """``kp`` as JSON values (floats written by ``repr``: read back exactly)."""
    return {"labels": list(kp.labels), "kinds": list(kp.kinds), "bodies": list(kp.bodies),
            "body_ids": [int(v) for v in kp.body_ids], "site_ids": [int(v) for v in kp.site_ids],
            "offsets": kp.offsets.tolist(), "quats": kp.quats.tolist()}


def keypoints_from_json(value: dict[str, Any]) -> KeypointSet:
    return KeypointSet(tuple(value["labels"]), tuple(value["kinds"]), tuple(value["bodies"]),
                       np.asarray(value["body_ids"], dtype=np.int64),
                       np.asarray(value["site_ids"], dtype=np.int64),
                       np.asarray(value["offsets"], dtype=np.float64).reshape(-1, 3),
                       np.asarray(value["quats"], dtype=np.float64).reshape(-1, 4))


def run_kinematics_job(job: dict[str, Any], getters: dict[str, Any]) -> None:
    """A worker's part: read each box of the job's state through ``getters`` and write
    its keypoints into the result block, at the box's rows."""
    from flyarchive.analyze.blocks import thread_engine

    spec = job["kinematics"]
    model = attach_block(spec["model"])
    try:
        blob = bytes(model.buf[:spec["size"]])
    finally:
        model.close()
    if hashlib.sha256(blob).hexdigest() != spec["sha256"]:
        raise RuntimeError("The model's bytes in shared memory do not match their SHA-256.")
    engine = thread_engine(spec["sha256"], blob, keypoints_from_json(spec["keypoints"]),
                     bool(spec["orientations"]), "cpu")
    out = attach_block(job["block"])
    try:
        view = np.ndarray(tuple(spec["shape"]), np.float64, buffer=out.buf)
        compute_boxes(engine, getters, {name: tuple(inner) for name, (_, inner, _) in
                                        job["arrays"].items()}, job["boxes"], job["start"], view)
        del view
    finally:
        out.close()
