"""Joint traces of one world (``flyarchive plot``), with matplotlib."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flyarchive.errors import SelectionError, missing_dependency
from flyarchive.query import open_archive

__all__ = ["plot_traces"]


def plot_traces(
    url: str,
    world: int,
    out: str | Path,
    *,
    dofs: Sequence[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Path:
    """Plot dof traces of one world against simulated time into a PNG.

    Args:
        url: Archive URL.
        world: World id.
        out: PNG path.
        dofs: dof labels (default: the first six hinge or slide joints).

    Raises:
        SelectionError: unknown world or dof label (the message lists what exists).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise missing_dependency("matplotlib", "plot", "flyarchive plot") from None
    ds = open_archive(url, storage_options)
    ids = [int(w) for w in ds.world.values]
    if world not in ids:
        raise SelectionError(f"World {world!r} is not in the archive; it has {ids[:20]}.")
    labels = [str(d) for d in ds.dof.values]
    layout = ds.attrs["layout"]
    hinges = [n for n, t in zip(layout["joint_names"], layout["joint_types"]) if t in ("hinge", "slide")]
    chosen = list(dofs) if dofs else hinges[:6] or labels[:6]
    unknown = [d for d in chosen if d not in labels]
    if unknown:
        raise SelectionError(
            f"dof label(s) {unknown} are not in the archive. Labels: {', '.join(labels[:30])}"
            f"{'...' if len(labels) > 30 else ''}."
        )
    one = ds.sel(world=world)
    n = int(one.n_frames)
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    for label in chosen:
        ax.plot(one.time.values[:n], one.qpos.sel(dof=label).values[:n], label=label)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("qpos (rad or m)")
    ax.set_title(f"world {world}")
    ax.legend(fontsize="small", loc="best")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
