"""Every way into an archive, and what each says of it: ``flyarchive info`` (the header),
``open_archive`` (opened, then opened and read), render planning, and ``verify``.

One validation for every way in: an archive that one of the first three refuses, all
three refuse with the same error (class and message), reading refuses it too, and
``verify`` reports it; an archive they accept, reading and ``verify`` judge alike (both
refuse damaged state, both accept sound state). :func:`disagreements` states these rules
for the verdicts of one archive; ``tests/reliability/test_ways_in.py`` applies them to
every hostile case of :mod:`flyarchive.testing.hostile`, those that could exhaust memory or
hang in a child process (:func:`verdicts_isolated`; :func:`verdicts_isolated_many` for
many archives, a forked process each) under the harness's memory cap.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["WAYS", "Verdict", "verdicts", "verdicts_isolated", "verdicts_isolated_many",
           "disagreements"]

#: The ways in: the header (``flyarchive info``), ``open_archive`` opened, render planning
#: (header, frame selection, model and outputs checked), ``open_archive`` read whole, verify.
WAYS = ("info", "open", "plan", "read", "verify")


@dataclass(frozen=True)
class Verdict:
    """What one way in said.

    Attributes:
        error_type: The exception's class name (``verify``: ``"problems"`` when it listed
            some); None when it accepted the archive.
        message: The error message (``verify``: its problems, one per line).
    """

    error_type: str | None
    message: str = ""

    @property
    def refused(self) -> bool:
        return self.error_type is not None


def _plan(url: str) -> None:
    from flyarchive.distribute.api import RenderOptions, replay_model
    from flyarchive.render.output_plan import plan_outputs
    from flyarchive.query.selection import select_frames
    from flyarchive.store.dataset import open_header
    from flyarchive.testing import tiny_model

    header = open_header(url)
    jobs = select_frames(header, None, None)
    model, _ = replay_model(url, header, tiny_model())
    plan_outputs(RenderOptions(size=(48, 64)), header, model, jobs)


def _verify(url: str) -> Verdict:
    from flyarchive.store.integrity import verify

    problems = verify(url).problems
    return Verdict("problems", "\n".join(problems)) if problems else Verdict(None)


def verdicts(url: str) -> dict[str, Verdict]:
    """Every way in (:data:`WAYS`) on the local archive ``url``, in this process."""
    from flyarchive import open_archive
    from flyarchive.summary import summarize

    ways: dict[str, Callable[[], Any]] = {
        "info": lambda: summarize(url),
        "open": lambda: open_archive(url),
        "plan": lambda: _plan(url),
        "read": lambda: open_archive(url).load(),
        "verify": lambda: _verify(url),
    }
    out = {}
    for way, run in ways.items():
        try:
            got = run()
        except Exception as err:  # noqa: BLE001 - the verdict, whatever it is
            out[way] = Verdict(type(err).__name__, str(err))
            continue
        out[way] = got if isinstance(got, Verdict) else Verdict(None)
    return out


def verdicts_isolated(url: str, *, timeout_s: float = 60.0) -> dict[str, Verdict]:
    """:func:`verdicts` in a child process under the hostile harness's address-space cap
    (:data:`flyarchive.testing.hostile.MEMORY_CAP`); a child that dies or hangs gives
    every way the verdict ``"died"``."""
    from flyarchive.testing.hostile import MEMORY_CAP

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
    try:
        done = subprocess.run([sys.executable, "-m", "flyarchive.testing.ways_in", url],
                              capture_output=True, text=True, timeout=timeout_s,
                              preexec_fn=limit, env=env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        found = json.loads(lines[-1]) if lines else None
        why = f"the child died (exit {done.returncode}): {done.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        found, why = None, f"did not finish within {timeout_s} s"
    if found is None:
        return {way: Verdict("died", why) for way in WAYS}
    return {way: Verdict(**found[way]) for way in WAYS}


def verdicts_isolated_many(urls: Sequence[str], *, timeout_s: float = 60.0,
                           warm: str | None = None) -> list[dict[str, Verdict]]:
    """:func:`verdicts_isolated` of each URL, through one child process that imports once
    and forks a process per archive under the same cap and timeout
    (:func:`flyarchive.testing.forks.run_forked`); ``warm``: a sound archive the child
    goes through every way in first, so that first-use work is done once."""
    from flyarchive.testing.forks import run_forked
    from flyarchive.testing.hostile import MEMORY_CAP

    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
    done = run_forked("flyarchive.testing.ways_in", list(urls), memory_bytes=MEMORY_CAP,
                      timeout_s=timeout_s, warm=[warm] if warm else [], env=env)
    return [{way: Verdict(**d["result"][way]) for way in WAYS} if "result" in d
            else {way: Verdict("died", d["died"]) for way in WAYS} for d in done]


def _as_json(url: str) -> dict[str, dict[str, Any]]:
    return {way: asdict(v) for way, v in verdicts(url).items()}


def _warm() -> None:
    """Import what every way in needs, before the forks."""
    import xarray

    import flyarchive.distribute.api  # noqa: F401
    import flyarchive.query.selection  # noqa: F401
    import flyarchive.render.output_plan  # noqa: F401
    import flyarchive.store.integrity  # noqa: F401
    import flyarchive.summary  # noqa: F401

    xarray.backends.list_engines()


def disagreements(found: Mapping[str, Verdict]) -> list[str]:
    """Where the ways in disagree about one archive (empty when they agree); see the
    module's text for the rules."""
    out = []
    header = found["info"]
    for way in ("open", "plan"):
        if found[way] != header:
            out.append(f"{way} says {found[way]}, info says {header}")
    if header.refused:
        if (found["read"].error_type, found["read"].message) != \
                (header.error_type, header.message):
            out.append(f"read says {found['read']}, info says {header}")
        if not found["verify"].refused:
            out.append(f"verify accepts what info refuses ({header})")
    elif found["read"].refused != found["verify"].refused:
        out.append(f"read says {found['read']}, verify says {found['verify']}")
    out += [f"{way} died: {v.message}" for way, v in found.items() if v.error_type == "died"]
    return out


def main(argv: list[str] | None = None) -> int:
    from flyarchive.testing.forks import FORKED, serve_forked

    argv = argv if argv is not None else sys.argv[1:]
    if argv[:1] == [FORKED]:  # verdicts_isolated_many's child
        _warm()
        return serve_forked(_as_json, argv[1:])
    print(json.dumps(_as_json(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
