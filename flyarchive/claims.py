"""Ownership of world blocks, so that several processes can write one archive.

Each writer of a block claims every shard of worlds it covers by creating
``claims/shard-NNNNNN.json`` exclusively. An overlapping claim is refused, so two
writers never write into one shard (zarr cannot merge partial shard writes).
Exclusive creation is atomic on local disk; on object stores it is a check, a put
and a read-back, which catches all but near-simultaneous claims (documented).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from zarr.core.buffer import default_buffer_prototype

from flyarchive.errors import WorldBlockConflictError

__all__ = ["claim_block", "shards_of_block"]

PREFIX = "claims"


def shards_of_block(start: int, stop: int, shard_worlds: int, n_worlds: int) -> range:
    """The shard indices a block of world indices ``[start, stop)`` covers.

    Raises:
        ValueError: if the block is empty, outside the archive, or not shard-aligned.
    """
    if not 0 <= start < stop <= n_worlds:
        raise ValueError(
            f"World block [{start}, {stop}) is not inside the archive's {n_worlds} worlds."
        )
    if start % shard_worlds or (stop % shard_worlds and stop != n_worlds):
        raise ValueError(
            f"World block [{start}, {stop}) does not follow shard boundaries (every "
            f"{shard_worlds} worlds): two writers would share a shard and lose data. "
            f"Start and end blocks at multiples of {shard_worlds}."
        )
    return range(start // shard_worlds, -(-stop // shard_worlds))


def _key(shard: int) -> str:
    return f"{PREFIX}/shard-{shard:06d}.json"


def claim_block(store: Any, start: int, stop: int, shard_worlds: int, n_worlds: int,
                *, takeover: bool = False) -> str:
    """Claim world indices ``[start, stop)`` for one writer; returns the writer id.

    Args:
        store: The archive's zarr store.
        takeover: Take over claims of exactly this block left by an earlier writer
            (to resume after a crash). Claims of other blocks are never taken.

    Raises:
        WorldBlockConflictError: naming the block that already owns a shard.
    """
    from zarr.core.sync import sync

    writer = uuid.uuid4().hex
    record = json.dumps({"writer": writer, "start": start, "stop": stop, "time": time.time()})
    proto = default_buffer_prototype()
    taken: list[int] = []
    for shard in shards_of_block(start, stop, shard_worlds, n_worlds):
        key = _key(shard)
        existing = sync(store.get(key, prototype=proto))
        if existing is not None:
            other = json.loads(existing.to_bytes())
            if takeover and (other["start"], other["stop"]) == (start, stop):
                sync(store.set(key, proto.buffer.from_bytes(record.encode())))
                taken.append(shard)
                continue
            _release(store, taken)
            raise WorldBlockConflictError(
                f"World indices [{start}, {stop}) overlap the block [{other['start']}, "
                f"{other['stop']}) that another writer claimed. Give each writer a disjoint "
                "block; to resume a crashed writer's own block, pass takeover=True."
            )
        try:
            sync(store.set_if_not_exists(key, proto.buffer.from_bytes(record.encode())))
        except FileExistsError:
            pass
        got = json.loads(sync(store.get(key, prototype=proto)).to_bytes())
        if got["writer"] != writer:
            _release(store, taken)
            raise WorldBlockConflictError(
                f"World indices [{start}, {stop}) overlap the block [{got['start']}, "
                f"{got['stop']}) that another writer claimed at the same moment. "
                "Give each writer a disjoint block."
            )
        taken.append(shard)
    return writer


def _release(store: Any, shards: list[int]) -> None:
    from zarr.core.sync import sync

    for shard in shards:
        sync(store.delete(_key(shard)))
