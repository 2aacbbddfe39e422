"""A short summary of an archive (``flyarchive info``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flyarchive.codecs import describe as describe_codec
from flyarchive.schema import import_status
from flyarchive.models.entries import readable_on, stored_entry, stored_portable
from flyarchive.store.dataset import open_header


def summarize(url: str, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Summarize an archive (JSON-friendly).

    Returns:
        ``worlds`` (how many) and ``world_ids`` (every id, in the archive's order), frames,
        timing, layout, ``codec`` (its spec) and ``reader_needs`` (what a reader must have
        installed to decode it), sources, the models kept beside it (``model``: its MJB's
        ``sha256``, ``size`` in bytes, the ``mujoco`` release that wrote it and its
        ``path``; ``portable_model``: its portable form's ``sha256``, ``size``, ``path``,
        ``format``, the ``mujoco`` release that wrote it and whether it is ``exact``; None
        when not kept), which MuJoCo releases can read them (``model_readable_on``, in
        words), the per-world variables (``world_vars``, their names, and
        ``world_var_types``: ``"text"`` or the numpy dtype of each).
    """
    ds = open_header(url, storage_options)  # what it shows is in the header: no xarray needed
    n_frames = ds.n_frames.values
    times = ds.time.values
    layout = ds.attrs["layout"]
    worlds = ds.world.values
    # Archives from before the codec option have no codec attribute: they are lossless.
    codec = ds.attrs.get("codec", {}).get("spec") or "lossless"
    variables = {str(n): "text" if v.dtype.kind in "UTO" else str(v.dtype)
                 for n, v in ds.data_vars.items() if v.dims == ("world",) and n != "n_frames"}
    info = {
        "url": str(url),
        "schema_version": ds.attrs["flyarchive_schema_version"],
        "source": ds.attrs.get("source"),
        "worlds": int(len(worlds)),
        "world_ids": [int(w) for w in worlds],
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
        "codec": codec,
        "reader_needs": describe_codec(codec)["reader_needs"],
        "layout_hash": layout["hash"][:16],
        "versions": ", ".join(f"{k} {v}" for k, v in ds.attrs.get("versions", {}).items()),
        **({"appended_with": _appended(ds.attrs["appended_with"])}
           if isinstance(ds.attrs.get("appended_with"), list) else {}),
        "model": stored_entry(ds.attrs, str(url)),
        "portable_model": _without_details(stored_portable(ds.attrs, str(url))),
        "model_readable_on": readable_on(ds.attrs, str(url)),
        "world_vars": sorted(variables),
        "world_var_types": {n: variables[n] for n in sorted(variables)},
    }

    status = import_status(ds.attrs)
    if status is not None:
        info["import"] = status
    return info


def summary_lines(info: Mapping[str, Any]) -> dict[str, str]:
    """The lines of ``flyarchive info`` for a :func:`summarize` result, by key: world ids as
    ranges, the codec with what readers need, the kept model and the world variables
    with their types in words."""
    shown = {"world_ids": format_ids(info["world_ids"]),
             "codec": describe_codec_line(info["codec"]),
             "model": describe_model(info["model"]),
             "portable_model": describe_portable(info["portable_model"]),
             "world_vars": describe_world_vars(info["world_var_types"])}
    return {key: str(shown.get(key, value)) for key, value in info.items()
            if key not in ("reader_needs", "world_var_types")}


def _appended(entries: Sequence[Any]) -> str:
    """The releases that appended to an archive, when they are not those that created it:
    ``"from frame 26: mujoco 4.0.1, ...; from frame 80: ..."`` (entries that are not
    objects, edited by hand, are left out)."""
    return "; ".join(
        f"from frame {e.get('from_frame')}: "
        + ", ".join(f"{k} {v}" for k, v in dict(e.get("versions") or {}).items())
        for e in entries if isinstance(e, Mapping) and isinstance(e.get("versions"), Mapping))


def _without_details(entry: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A ``portable_model`` entry without the recorded bodies and ``qpos0`` (long lists)."""
    return None if entry is None else {k: v for k, v in entry.items()
                                       if k not in ("bodies", "qpos0")}


def describe_model(entry: Mapping[str, Any] | None) -> str:
    """One line for ``flyarchive info``: the kept MJB, or that there is none."""
    if entry is None:
        return "no MJB kept"
    return (f"MJB {entry['path']} (sha256 {entry['sha256'][:16]}..., "
            f"{_size(entry['size'])}, bound to MuJoCo {entry.get('mujoco') or 'unknown'})")


def describe_portable(entry: Mapping[str, Any] | None) -> str:
    """One line for ``flyarchive info``: the kept portable model, or how to keep one."""
    if entry is None:
        return ("none kept (keep one with: flyarchive model attach URL --model fly.xml)")
    source = "the MJCF's own text" if entry.get("exact") else "MuJoCo's XML of an MjSpec"
    return (f"{entry['path']} (sha256 {entry['sha256'][:16]}..., {_size(entry['size'])}, "
            f"{source}, written by MuJoCo {entry.get('mujoco') or 'unknown'})")


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def format_ids(ids: Sequence[int]) -> str:
    """World ids in words, runs of consecutive ids as ranges: ``[0, 3]`` -> ``"0, 3"``,
    ``[0, 1, ..., 511, 1024]`` -> ``"0..511, 1024"``; ``""`` for none. Ids keep their order."""
    parts: list[str] = []
    start = prev = None
    for w in (int(i) for i in ids):
        if prev is not None and w == prev + 1:
            prev = w
            continue
        if start is not None:
            parts.append(_run(start, prev))
        start = prev = w
    if start is not None:
        parts.append(_run(start, prev))
    return ", ".join(parts)


def _run(start: int, stop: Any) -> str:
    return str(start) if stop == start else f"{start}, {stop}" if stop == start + 1 \
        else f"{start}..{stop}"


def describe_codec_line(spec: str) -> str:
    """One line for ``flyarchive info``: the codec and what a reader needs, e.g.
    ``"lossless: pcodec, crc32c (readers need numcodecs[pcodec])"`` or ``"portable:
    blosc-zstd, crc32c (portable: zarr v3 core codecs only)"``."""
    described = describe_codec(spec)
    codecs = f"{described['codec']}, crc32c"
    if spec == "portable":
        return f"{spec}: {codecs} (portable: zarr v3 core codecs only, any zarr v3 reader)"
    bound = "" if described["lossless"] else f", max error {described['abs_error_bound']:g}"
    return f"{spec}: {codecs}{bound} (readers need numcodecs[pcodec])"


def describe_world_vars(types: Mapping[str, str]) -> str:
    """One line for ``flyarchive info``: ``"genotype (text), success (int64)"`` or ``"none"``."""
    return ", ".join(f"{name} ({kind})" for name, kind in types.items()) or "none"
