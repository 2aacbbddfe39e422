"""A short summary of an archive (``flyarchive info``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flyarchive.query.archive import open_header
from flyarchive.schema import import_status
from flyarchive.store.models import stored_entry

__all__ = ["summarize", "describe_model"]


def summarize(url: str, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Summarize an archive: worlds, frames, timing, layout, codec, sources, the model kept
    beside it (``model``: its ``sha256``, ``size`` in bytes, the ``mujoco`` release that
    wrote it and its ``path``; None when none is kept) and the per-world variables
    (JSON-friendly)."""
    ds = open_header(url, storage_options)  # what it shows is in the header: no xarray needed
    n_frames = ds.n_frames.values
    times = ds.time.values
    layout = ds.attrs["layout"]
    worlds = ds.world.values
    info = {
        "url": str(url),
        "schema_version": ds.attrs["flyarchive_schema_version"],
        "source": ds.attrs.get("source"),
        "worlds": int(len(worlds)),
        "world_ids": f"{int(worlds.min())}..{int(worlds.max())}" if len(worlds) else "",
        "frames_min": int(n_frames.min()) if len(n_frames) else 0,
        "frames_max": int(n_frames.max(initial=0)),
        "time_start_s": float(times[0]) if len(times) else None,
        "time_end_s": float(times[-1]) if len(times) else None,
        "timestep_s": ds.attrs["timestep"],
        "output_fps": ds.attrs["output_fps"],
        "playback_speed": ds.attrs["playback_speed"],
        "video_seconds": float(n_frames.max(initial=0) / ds.attrs["output_fps"]),
        "nq": layout["nq"],
        "nmocap": layout["nmocap"],
        "dtype": str(ds.qpos.dtype),
        "codec": ds.attrs.get("codec", {}).get("spec"),
        "layout_hash": layout["hash"][:16],
        "versions": ", ".join(f"{k} {v}" for k, v in ds.attrs.get("versions", {}).items()),
        "model": stored_entry(ds.attrs, str(url)),
        "world_vars": sorted(str(n) for n, v in ds.data_vars.items()
                             if v.dims == ("world",) and n != "n_frames"),
    }

    status = import_status(ds.attrs)
    if status is not None:
        info["import"] = status
    return info


def describe_model(entry: Mapping[str, Any] | None) -> str:
    """One line for ``flyarchive info``: the kept model, or that there is none."""
    if entry is None:
        return "not stored (render needs --model)"
    return (f"stored: {entry['path']} (sha256 {entry['sha256'][:16]}..., "
            f"{_size(entry['size'])}, MuJoCo {entry.get('mujoco') or 'unknown'})")


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"
