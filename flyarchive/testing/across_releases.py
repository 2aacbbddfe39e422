"""One archive across MuJoCo releases: recorded under one, replayed under another, the
pictures and positions compared.

flyarchive supports two MuJoCo lines, each in an environment of its own (``scripts/dev.sh``:
``.venv``, MuJoCo 3.16 with flygym; ``.venv-mujoco4``, MuJoCo 4.0.1). A test runs here
what this environment does and, through :func:`run_in`, what the other one does: this
module is also the child's program (``python -m flyarchive.testing.across_releases STEPS``: a JSON
list of :func:`record_step` and :func:`replay_step`, run in one process). :func:`record` records a short recording of an MJCF
model (the tiny model simulated, or given states such as a NeuroMechFly walk);
:func:`replay` renders its frames with :func:`flyarchive.render_frames` (OpenGL) and
computes every body's position with :func:`flyarchive.positions`; :func:`compare` says how
far two replays are apart.

The archive keeps the model twice: its MJB, which only the release that wrote it loads, and
its portable form (the MJCF with its files, :func:`flyarchive.models.portable_model`), which
another release compiles. Replay uses the archive's own model (:func:`replay_model_path`:
None), so the portable form is what crosses releases; given the XML, it replays with that.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Replay", "record", "replay", "replay_model_path", "compare", "differing_pixels",
           "export_neuromechfly", "walk_states", "record_step", "replay_step", "run_in",
           "load_replay", "PIXEL_LEVELS"]

#: A pixel differs when a channel differs by more than this many levels (of 255).
PIXEL_LEVELS = 8


@dataclass(frozen=True)
class Replay:
    """What :func:`replay` saw of an archive under one MuJoCo release.

    Attributes:
        mujoco: The release that replayed (``mujoco.__version__``).
        recorded: The release the archive says recorded it (its ``versions`` attribute).
        identity: The identity of the model the archive keeps
            (:func:`flyarchive.models.model_identity`: its portable form's SHA-256).
        headlight: ``vis.headlight.active`` of the model replay rendered with (after
            :mod:`flyarchive.replay.releases` pinned it).
        frames: ``(world, time, y, x, 3)`` uint8 RGB of one camera.
        positions: ``(world, time, body, 3)`` float64 positions of every body but the
            world, in the model's length unit.
    """

    mujoco: str
    recorded: str
    identity: str
    headlight: int
    frames: np.ndarray
    positions: np.ndarray


def record(xml: str | os.PathLike[str], url: str, *, states: str | None = None) -> str:
    """Record ``url`` with the MJCF model ``xml`` compiled by this MuJoCo, keeping the MJB
    and the portable form (from ``xml``).

    Args:
        xml: The model's MJCF file (its assets beside it).
        url: Where to record (created).
        states: A ``.npy`` file of ``(worlds, frames, nq)`` qpos to record as they are
            (frame ``k`` at ``k * 0.008`` s); None: two worlds of the model simulated
            (:func:`flyarchive.testing.fixtures.record`, 20 frames each).

    Returns:
        This MuJoCo's version.
    """
    import mujoco

    from flyarchive.models import load_model_file, portable_model
    from flyarchive.testing.fixtures import record as record_simulated
    from flyarchive.testing.fixtures import write_states

    model = load_model_file(xml)
    if states is None:
        record_simulated(model, url, model_source=str(xml))
    else:
        write_states(url, model, np.load(states, allow_pickle=False),
                     portable=portable_model(str(xml), model=model))
    return mujoco.__version__


def replay_model_path(xml: str | os.PathLike[str]) -> str | None:
    """The model the cross-release tests replay with: None, the archive's own (its portable
    form on the release that did not record it). Return ``str(xml)`` to replay with the
    MJCF file instead (``--model fly.xml``), as before archives kept the portable form."""
    return None


def replay(url: str, camera: str, size: tuple[int, int], *,
           model: str | os.PathLike[str] | None) -> Replay:
    """Render and locate every frame of the archive ``url`` with this MuJoCo.

    Args:
        url: The archive.
        camera: The camera to render.
        size: ``(height, width)`` of the frames.
        model: The model's MJCF file; None: the model kept in the archive.
    """
    import mujoco

    from flyarchive import positions, render_frames
    from flyarchive.distribute.api import replay_model
    from flyarchive.models import load_model_file, model_identity
    from flyarchive.store.dataset import open_header

    compiled = None if model is None else load_model_file(model)
    header = open_header(url)
    used, _ = replay_model(url, header, compiled)
    frames = render_frames(url, compiled, camera, size=size).values
    where = positions(url, "*", model=compiled, stored=False).values
    return Replay(mujoco.__version__, str(header.attrs["versions"]["mujoco"]),
                  str(model_identity(header.attrs)), int(used.vis.headlight.active),
                  np.asarray(frames), np.asarray(where))


def differing_pixels(a: np.ndarray, b: np.ndarray, levels: int = PIXEL_LEVELS) -> float:
    """The fraction of pixels of two ``(..., y, x, 3)`` uint8 frame arrays where a channel
    differs by more than ``levels``."""
    if a.shape != b.shape:
        raise ValueError(f"frames of shapes {a.shape} and {b.shape} cannot be compared")
    gap = np.abs(a.astype(np.int16) - b.astype(np.int16)).max(axis=-1)
    return float((gap > levels).mean())


def compare(a: Replay, b: Replay) -> dict[str, float]:
    """How far two replays of one archive are apart: ``pixels`` (:func:`differing_pixels`)
    and ``positions`` (the largest absolute difference, model length units)."""
    if a.positions.shape != b.positions.shape:
        raise ValueError(f"positions of shapes {a.positions.shape} and {b.positions.shape} "
                         "cannot be compared")
    return {"pixels": differing_pixels(a.frames, b.frames),
            "positions": float(np.abs(a.positions - b.positions).max())}


def export_neuromechfly(folder: str | os.PathLike[str]) -> tuple[Path, Any]:
    """NeuroMechFly on flat ground (:func:`flyarchive.interop.nmf.build_world`) exported as
    MJCF with its meshes beside it, by flygym's own exporter (needs flygym); the XML file
    and the world, its model compiled from that file by this MuJoCo."""
    import dataclasses

    from flygym.compose.base import BaseCompositionElement

    from flyarchive.interop import nmf
    from flyarchive.models import load_model_file

    class _Spec(BaseCompositionElement):  # flygym exports a composition element's spec
        def __init__(self, spec: Any) -> None:
            self._spec = spec

        @property
        def mjcf_root(self) -> Any:
            return self._spec

    world = nmf.build_world()
    _Spec(world.spec).save_xml_with_assets(Path(folder), "nmf.xml")
    xml = Path(folder) / "nmf.xml"
    return xml, dataclasses.replace(world, model=load_model_file(xml))


def walk_states(world: Any, seconds: float) -> np.ndarray:
    """``(1, frames, nq)`` qpos of one NeuroMechFly world walking for ``seconds``, at the
    recorder's default cadence (25 frames/s at 0.2x: every 8 ms of simulated time)."""
    from flyarchive.interop import nmf

    qpos = nmf.walk_qpos(max(1, round(seconds / 0.008)), world=world)
    return qpos[None]


# ----------------------------------------------------------------------------- the other side
def record_step(xml: str | os.PathLike[str], url: str, *,
                states: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """A step of :func:`run_in`: :func:`record` ``(xml, url, states=states)``."""
    return {"record": {"xml": str(xml), "url": url,
                       "states": None if states is None else str(states)}}


def replay_step(url: str, camera: str, size: tuple[int, int], out: str | os.PathLike[str], *,
                model: str | os.PathLike[str] | None) -> dict[str, Any]:
    """A step of :func:`run_in`: :func:`replay` ``(url, camera, size, model=model)``, saved
    to the ``.npz`` file ``out`` (read it back with :func:`load_replay`)."""
    return {"replay": {"url": url, "camera": camera, "size": list(size), "out": str(out),
                       "model": None if model is None else str(model)}}


def run_in(python: str, steps: Sequence[dict[str, Any]], *,
           timeout_s: float = 300.0) -> dict[str, Any]:
    """Run ``steps`` (:func:`record_step`, :func:`replay_step`), one after the other, in one
    process of the interpreter ``python`` (another environment); what it printed: the
    ``mujoco`` release it ran.

    Raises:
        RuntimeError: the child failed, or printed on stderr (a traceback at exit too):
            its status and output.
    """
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    done = subprocess.run([python, "-m", "flyarchive.testing.across_releases", json.dumps(list(steps))],
                          capture_output=True, text=True, timeout=timeout_s, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines or done.stderr.strip():
        raise RuntimeError(f"{python} -m flyarchive.testing.across_releases ended with status "
                           f"{done.returncode}; stdout: {done.stdout[-2000:]!r}; "
                           f"stderr: {done.stderr[-4000:]!r}")
    return json.loads(lines[-1])


def load_replay(path: str | os.PathLike[str]) -> Replay:
    """The :class:`Replay` a :func:`replay_step` saved."""
    with np.load(path, allow_pickle=False) as saved:
        return Replay(str(saved["mujoco"]), str(saved["recorded"]), str(saved["identity"]),
                      int(saved["headlight"]), saved["frames"], saved["positions"])


def main(argv: Sequence[str] | None = None) -> int:
    """The child: one argument, the JSON list of steps; then one JSON line,
    ``{"mujoco": version}``."""
    import mujoco

    (text,) = list(sys.argv[1:] if argv is None else argv)
    for step in json.loads(text):
        if "record" in step:
            record(**step["record"])
        else:
            args = dict(step["replay"])
            out = args.pop("out")
            seen = replay(args.pop("url"), args.pop("camera"), tuple(args.pop("size")), **args)
            np.savez(out, mujoco=seen.mujoco, recorded=seen.recorded, identity=seen.identity,
                     headlight=seen.headlight, frames=seen.frames, positions=seen.positions)
    print(json.dumps({"mujoco": mujoco.__version__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
