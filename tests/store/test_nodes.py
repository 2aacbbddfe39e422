"""A new archive's nodes: the array metadata zarr built for one archive is kept and
reused by the next archive created with the same options, never by one whose options
(or zarr's configuration) differ."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
import zarr
import zarr.api.asynchronous

from flyarchive.clock import Timing
from flyarchive.layout import ModelLayout
from flyarchive.store import ArchiveSpec, ArchiveWriter
from flyarchive.store.nodes import forget_built
from flyarchive.testing.fixtures import memory_snapshot

#: Specs that differ from the first in one option each.
VARIANTS = {
    "plain": {},
    "float32": {"dtype": "float32"},
    "bounded": {"codec": "abs:1e-6"},
    "bounded coarser": {"codec": "abs:1e-5"},
    "portable": {"codec": "portable"},
    "chunks": {"chunk_frames": 7},
    "capacity": {"capacity_frames": 12, "shard_worlds": 1},
    "world variables": {"world_vars": {"seed": np.array([3, 4], dtype=np.int32),
                                       "label": np.array(["a", "bb"]),
                                       "ok": np.array([True, False])}},
    "world variables int64": {"world_vars": {"seed": np.array([3, 4], dtype=np.int64)}},
}


def spec_of(tiny, options) -> ArchiveSpec:
    return ArchiveSpec(ModelLayout.from_model(tiny), Timing(tiny.opt.timestep, 25, 0.2), (0, 1),
                       **options)


def created(spec: ArchiveSpec) -> dict[str, object]:
    """Every metadata document and chunk of a new archive of ``spec`` (in memory), by key;
    the root's creation time and id left out."""
    url = f"memory://{uuid.uuid4().hex}.zarr"
    ArchiveWriter.create(url, spec).close()
    found: dict[str, object] = {}
    for path, data in memory_snapshot(url).items():
        key = path.split(".zarr/", 1)[1]
        if key.startswith("claims/") and key != "claims/zarr.json":
            continue
        if key.endswith("zarr.json"):
            document = json.loads(data)
            for name in ("created", "archive_id"):
                document.get("attributes", {}).pop(name, None)
            found[key] = document
        else:
            found[key] = data
    return found


@pytest.fixture
def builds(monkeypatch):
    """The arrays zarr builds metadata for while the test runs (names, in order)."""
    built: list[str] = []
    real = zarr.api.asynchronous.create_array

    async def spy(*args, **kwargs):
        built.append(kwargs.get("name"))
        return await real(*args, **kwargs)

    monkeypatch.setattr(zarr.api.asynchronous, "create_array", spy)
    forget_built()
    yield built
    forget_built()


def test_an_archive_made_from_kept_metadata_is_the_one_made_from_new_metadata(tiny, builds):
    fresh = {}
    for name, options in VARIANTS.items():
        forget_built()
        fresh[name] = created(spec_of(tiny, options))

    kept = {name: created(spec_of(tiny, options)) for name, options in VARIANTS.items()}

    assert set(kept) == set(fresh)
    for name in VARIANTS:
        assert kept[name] == fresh[name], name


def test_a_second_archive_with_the_same_options_builds_no_metadata(tiny, builds):
    spec = spec_of(tiny, VARIANTS["world variables"])
    created(spec)
    first = list(builds)

    created(spec)

    assert sorted(first) == sorted(["qpos", "mocap_pos", "mocap_quat", "mocap", "xyz", "wxyz",
                                    "dof", "time", "sim_time", "frame", "world", "seed", "label",
                                    "ok", "n_frames"])
    assert builds == first


def test_a_changed_zarr_configuration_builds_the_metadata_again(tiny, builds):
    spec = spec_of(tiny, {})
    created(spec)
    first = len(builds)

    with zarr.config.set({"array.write_empty_chunks": True}):
        created(spec)

    assert len(builds) == 2 * first
