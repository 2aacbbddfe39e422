"""Crafted models: a seeded fuzzer of a kept model's MJB bytes, and what each command does
with an archive that keeps one.

Used by ``tests/bad_input/test_model_fuzz.py`` and ``scripts/reliability_report.py``.
:func:`mutate` edits the bytes of the tiny model's MJB (bits flipped, an integer
overwritten with an extreme value, the end cut off; the 16-byte header kept, so that only
MuJoCo can tell); :func:`put_model` puts them in place of an archive's kept model under
their own hash, attribute included, so the archive is consistent and only loading the
model can tell; :data:`CRAFTED` are models edited through MuJoCo's own fields to a known
outcome (a SIGSEGV, a ``FatalError``, a clean refusal), which may differ between MuJoCo
releases (:func:`crafted_outcome`). :func:`run_command` runs one
command on such an archive in a child process (``python -m flyarchive.testing.model_fuzz``):
that child is the process a user runs (``flyarchive render`` without ``--model``,
``flyarchive verify``, ``flyarchive.load_kept_model``), and the outcome says whether it ended
on its own (exit 0, 1 or 2, with the error it reported) or was killed (a crash: a signal).

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import mujoco

__all__ = ["COMMANDS", "MUTATIONS", "Crafted", "CRAFTED", "Outcome", "mutate", "crafted",
           "crafted_model", "crafted_outcome", "put_model", "kept_path", "make_case", "run_command", "run_commands", "fuzz", "summarize",
           "crashed", "clean"]

#: What :func:`run_command` runs: the CLI's ``render`` (no ``--model``) and ``verify``,
#: and the API's ``load_kept_model``.
COMMANDS = ("render", "verify", "load_kept_model")
#: How :func:`mutate` edits the bytes.
MUTATIONS = ("flip", "int", "truncate")
_HEADER = 16
_EXTREMES = (0, -1, 1, 2**31 - 1, -(2**31), 1 << 20)


def mutate(blob: bytes, seed: int) -> tuple[bytes, str]:
    """The MJB bytes ``blob`` edited by the mutation of ``seed`` (the same edit for the same
    seed and bytes); and the mutation's name, from :data:`MUTATIONS`.

    - ``"flip"``: 1 to 8 bits flipped after the header;
    - ``"int"``: one aligned int32 overwritten with an extreme or random value, among the
      model's sizes (``nq``, ``nbody``...) 6 times in 10, else anywhere after the header;
    - ``"truncate"``: the bytes cut off after the header, anywhere.
    """
    rng = random.Random(seed)
    kind = rng.choice(MUTATIONS)
    data = bytearray(blob)
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(_HEADER, len(data))] ^= 1 << rng.randrange(8)
    elif kind == "int":
        n_sizes = struct.unpack("<i", blob[8:12])[0]
        end = _HEADER + 4 * n_sizes if rng.random() < 0.6 else len(data) - 4
        at = rng.randrange(_HEADER, end) & ~3
        value = rng.choice([*_EXTREMES, rng.randrange(-1000, 100_000)])
        data[at:at + 4] = struct.pack("<i", value)
    else:
        del data[rng.randrange(_HEADER, len(data)):]
    return bytes(data), kind


@dataclass(frozen=True)
class Crafted:
    """The tiny model with one of MuJoCo's own fields edited, and what MuJoCo does with it.

    Attributes:
        field: The ``MjModel`` field edited (an int32 array).
        index: The element edited.
        value: Its new value.
        outcomes: What loading the model's MJB and making its data does, by MuJoCo release
            line (major version): ``"SIGSEGV"`` (the process crashes), ``"FatalError"``
            (``mujoco.FatalError``) or ``"refused"`` (the loader says no, and why).
    """

    field: str
    index: int
    value: int
    outcomes: dict[int, str]


#: Models edited through MuJoCo's own fields to a known outcome. The sparse-matrix sizes
#: pass MuJoCo 3.16's loader (MuJoCo 4 checks them); a kinematic tree id out of range
#: passes both (measured with every int32 field of the tiny model set out of range).
CRAFTED = {
    "segfault": Crafted("body_treeid", 2, 10**8, {3: "SIGSEGV", 4: "SIGSEGV"}),  # MjData's set-up
    "fatal": Crafted("D_rownnz", 2, 10**6, {3: "FatalError", 4: "refused"}),  # checkDBSparse
    "refused": Crafted("body_parentid", 2, 10**8, {3: "refused", 4: "refused"}),  # the loader
}


def crafted_model(name: str) -> mujoco.MjModel:
    """The tiny model with the edit ``CRAFTED[name]``, in memory: MuJoCo's loader never sees
    it, so only making its data (or what follows) can tell."""
    from flyarchive.testing import tiny_model

    model = tiny_model()
    edit = CRAFTED[name]
    getattr(model, edit.field)[edit.index] = edit.value
    return model


def crafted(name: str) -> bytes:
    """The MJB bytes of :func:`crafted_model` ``(name)``."""
    from flyarchive.models import model_bytes

    return model_bytes(crafted_model(name))


def crafted_outcome(name: str) -> str:
    """What this process's MuJoCo does with the MJB of ``CRAFTED[name]`` (see
    :attr:`Crafted.outcomes`).

    Raises:
        KeyError: a MuJoCo release line the table does not know: add what it does.
    """
    import mujoco

    line = int(mujoco.__version__.split(".")[0])
    outcomes = CRAFTED[name].outcomes
    if line not in outcomes:
        raise KeyError(f"CRAFTED[{name!r}] does not say what MuJoCo {mujoco.__version__} does "
                       f"with it (known lines: {sorted(outcomes)}); measure it and add it.")
    return outcomes[line]


def kept_path(url: str) -> Path:
    """The file of the model kept beside the local archive ``url``."""
    root = json.loads((Path(url) / "zarr.json").read_text())
    return Path(url) / root["attributes"]["model"]["path"]


def put_model(url: str, blob: bytes) -> Path:
    """Put ``blob`` in place of the model kept beside the local archive ``url``, named (and
    recorded in the root attribute ``model``) by its own hash; the new file's path."""
    meta = Path(url) / "zarr.json"
    root = json.loads(meta.read_text())
    old = Path(url) / root["attributes"]["model"]["path"]
    digest = hashlib.sha256(blob).hexdigest()
    root["attributes"]["model"].update(sha256=digest, size=len(blob), path=f"models/{digest}.mjb")
    old.unlink()
    new = old.parent / f"{digest}.mjb"
    new.write_bytes(blob)
    meta.write_text(json.dumps(root))
    return new


def make_case(sound: str, seed: int, target: Path) -> tuple[str, str]:
    """Copy the archive ``sound`` (which keeps the tiny model) to ``target`` and put the
    model mutated by ``seed`` in place of its kept model; its URL and the mutation."""
    shutil.copytree(sound, target, symlinks=True)
    blob, kind = mutate(kept_path(str(target)).read_bytes(), seed)
    put_model(str(target), blob)
    return str(target), kind


# ----------------------------------------------------------------------------- running
@dataclass
class Outcome:
    """What one command did with one archive, in the child process that ran it.

    Attributes:
        exit: The command's exit status (0 ok, 1 ``verify`` found problems or an
            uncaught exception, 2 a flyarchive error); None when the process did not end
            on its own.
        signal: The signal that killed the process (e.g. ``"SIGSEGV"``); None if none.
        error_type: The exception's class (API), ``"FlyarchiveError"`` (CLI exit 2), or
            None when it worked.
        message: What it said (the CLI's stderr, the API's error) or what went wrong.
        seconds: Wall time of the child, s.
    """

    exit: int | None
    signal: str | None
    error_type: str | None
    message: str
    seconds: float

    def to_json(self) -> dict:
        return asdict(self)


def crashed(outcome: Outcome) -> bool:
    """True when the process running the command did not end on its own (a signal, a
    timeout, or no report)."""
    return outcome.exit is None


def clean(outcome: Outcome) -> bool:
    """True when the command worked or refused with a clear error: exit 0; ``verify``'s
    report of problems (exit 1); a flyarchive error (exit 2), on one line from the CLI.
    False for an uncaught exception (such as ``mujoco.FatalError``) or a crash."""
    if outcome.exit in (0, 1):
        return outcome.error_type is None
    return outcome.exit == 2 and "\n" not in outcome.message


def _argv(command: str, url: str, workdir: Path) -> list[str]:
    if command == "render":
        return ["render", url, "--camera", "front", "--size", "48x64", "--workers", "0",
                "--quiet", "--out", str(workdir / "videos")]
    return [command, url]


def run_command(command: str, url: str, workdir: Path, *, cache: Path | None = None,
                timeout_s: float = 300.0) -> Outcome:
    """Run ``command`` (one of :data:`COMMANDS`) on the archive ``url`` in a child process.

    Args:
        workdir: Folder for the command's outputs (created).
        cache: flyarchive's cache folder in the child (``FLYARCHIVE_CACHE_DIR``; default:
            ``workdir / "cache"``): share one between commands to check each model once.
        timeout_s: Seconds before the child is killed (then ``exit`` is None).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    env = _child_env(cache or workdir / "cache")
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "flyarchive.testing.model_fuzz", *_argv(command, url, workdir)],
            capture_output=True, text=True, timeout=timeout_s, env=env, cwd=workdir,
        )
    except subprocess.TimeoutExpired:
        return Outcome(None, None, None, f"did not finish within {timeout_s:g} s (killed)",
                       time.perf_counter() - start)
    seconds = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode < 0 or not lines:
        name = signal.Signals(-done.returncode).name if done.returncode < 0 else None
        return Outcome(None, name, None, f"the process died (exit {done.returncode}): "
                       f"{done.stderr.strip()[-500:]}", seconds)
    return Outcome(seconds=seconds, signal=None, **json.loads(lines[-1]))


def run_commands(commands: Sequence[str], url: str, workdir: Path, *, cache: Path | None = None,
                 timeout_s: float = 300.0) -> dict[str, Outcome]:
    """Run ``commands`` (of :data:`COMMANDS`) one after the other on the archive ``url`` in
    one child process, as :func:`run_command` runs one; each command's outcome. When the
    process crashes, the command it was running and those after it have crashed.

    Args:
        workdir: Folder for the commands' outputs (``workdir / command``, created).
        cache: flyarchive's cache folder in the child (default: ``workdir / "cache"``).
        timeout_s: Seconds before the child is killed.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    argv = [sys.executable, "-m", "flyarchive.testing.model_fuzz", "--each", ",".join(commands),
            url, str(workdir)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              env=_child_env(cache or workdir / "cache"), cwd=workdir)
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as err:
        code, stdout, stderr = None, _text(err.stdout), f"did not finish within {timeout_s:g} s"
    seconds = time.perf_counter() - start
    found = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            command = row.pop("command")
            found[command] = Outcome(signal=None, **row)
    name = signal.Signals(-code).name if code is not None and code < 0 else None
    lost = Outcome(None, name, None, f"the process died (exit {code}) before this command "
                   f"ended: {stderr.strip()[-500:]}", seconds)
    return {c: found.get(c, lost) for c in commands}


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def _child_env(cache: Path) -> dict[str, str]:
    return {**os.environ, "FLYARCHIVE_CACHE_DIR": str(cache),
            "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "LP_NUM_THREADS": "1"}


def fuzz(workdir: Path, sound: str, seeds: Sequence[int], *,
         commands: Sequence[str] = COMMANDS, together: bool = False,
         progress: Callable[[str], None] | None = None) -> list[dict]:
    """Run every command on the archive of every seed (:func:`make_case`), each in a child
    process (``together``: the commands of a seed in one, :func:`run_commands`); one row
    per seed: ``seed``, ``mutation``, ``outcomes`` (command -> :meth:`Outcome.to_json`),
    ``crashes`` (commands whose process crashed) and ``unclear`` (commands that ended
    without a clear error).

    The commands of one seed share a cache folder (the model is checked once per seed).
    """
    rows = []
    for seed in seeds:
        url, kind = make_case(sound, seed, workdir / f"fuzz-{seed}.zarr")
        if together:
            outcomes = run_commands(commands, url, workdir / f"out-{seed}",
                                    cache=workdir / f"cache-{seed}")
        else:
            outcomes = {c: run_command(c, url, workdir / f"out-{seed}-{c}",
                                       cache=workdir / f"cache-{seed}") for c in commands}
        if progress:
            for c, o in outcomes.items():
                progress(f"  model seed {seed} ({kind}) / {c}: exit {o.exit} {o.signal or ''} "
                         f"{o.error_type or ''} {o.seconds:.1f} s {o.message[:140]!r}")
        rows.append({"seed": seed, "mutation": kind, "check": _verdict(workdir / f"cache-{seed}"),
                     "outcomes": {c: o.to_json() for c, o in outcomes.items()},
                     "crashes": [c for c, o in outcomes.items() if crashed(o)],
                     "unclear": [c for c, o in outcomes.items() if not clean(o)]})
    return rows


def _verdict(cache: Path) -> str:
    """What the model check found, from the verdict it kept in ``cache``: ``"ok"``,
    ``"refused"``, ``"FatalError"``, a signal's name, or ``"none kept"``."""
    found = sorted((cache / "model-checks").glob("*.json"))
    if not found:
        return "none kept"
    verdict = json.loads(found[0].read_text())
    if verdict["verdict"] != "unsafe":
        return verdict["verdict"]
    what = verdict["what"]
    return "FatalError" if "FatalError" in what else what.rsplit(" ", 1)[-1]


def summarize(rows: Sequence[dict]) -> dict:
    """Counts over :func:`fuzz`'s rows: ``fuzzed``, ``crashes`` (processes of a command that
    crashed), ``unclear`` (commands that ended without a clear error), ``checks`` (the
    model check's findings -> number of models) and ``failed_seeds``."""
    checks: dict[str, int] = {}
    for row in rows:
        checks[row["check"]] = checks.get(row["check"], 0) + 1
    return {"fuzzed": len(rows), "crashes": sum(len(r["crashes"]) for r in rows),
            "unclear": sum(len(r["unclear"]) for r in rows), "checks": checks,
            "failed_seeds": [r["seed"] for r in rows if r["crashes"] or r["unclear"]]}


# ----------------------------------------------------------------------------- child side
def _child(argv: list[str]) -> dict:
    """Run one command here (the child); what it did, as JSON-friendly values."""
    from flyarchive.testing.hostile import run_caught

    if argv[0] == "load_kept_model":
        from flyarchive import load_kept_model

        return run_caught(lambda: load_kept_model(argv[1]))
    return run_caught(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The child: ``COMMAND ARGS...`` (one command), or ``--each render,verify URL WORKDIR``
    (each of them on ``URL``, its outputs in ``WORKDIR/<command>``, one JSON line each)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--each"]:
        commands, url, workdir = argv[1].split(","), argv[2], Path(argv[3])
        for command in commands:
            start = time.perf_counter()
            row = _child(_argv(command, url, workdir / command))
            print(json.dumps({"command": command, **row,
                              "seconds": time.perf_counter() - start}), flush=True)
        return 0
    parser = argparse.ArgumentParser(description="Run one command on an archive (child side).")
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    print(json.dumps(_child([args.command, *args.args])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
