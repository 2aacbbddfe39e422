"""The store: the only code that opens, reads and writes zarr stores (the codec pipelines
it writes with are defined in :mod:`flyarchive.codecs`). Create, append, commit, open, check.

- :mod:`~flyarchive.store.location`: URLs and zarr stores on any fsspec file system
  (:mod:`~flyarchive.store.localstore` on local disk), and the errors of storage clients
  in flyarchive's words (:mod:`~flyarchive.store.storage_errors`);
- :mod:`~flyarchive.store.spec`: what is fixed when an archive is created;
- :mod:`~flyarchive.store.writer` (with :mod:`~flyarchive.store.creation` and
  :mod:`~flyarchive.store.claims`): create, append and commit, one writer at a time;
- :mod:`~flyarchive.store.reader`: open (checked by :mod:`~flyarchive.store.hardening`,
  decoded by :mod:`~flyarchive.store.decoders`), read, and name what failed to read;
- :mod:`~flyarchive.store.dataset`: the lazy dataset readers get (selections read only
  the chunks they touch; frames past ``n_frames`` masked inside the read), read through
  :mod:`~flyarchive.store.shards` (each shard fetched once, inner chunks decoded into the
  result, indexes of shards that can no longer change kept); inside ``n_frames`` a missing
  chunk, shard or index entry fails the read (:mod:`~flyarchive.store.missing`);
- :mod:`~flyarchive.store.consolidated`: every array's metadata in the root ``zarr.json``,
  written at each commit, never ahead of ``n_frames``;
- :mod:`~flyarchive.store.integrity`: ``verify``, every committed byte;
- :mod:`~flyarchive.store.shutdown`: writes that must still happen while Python exits.
"""

from flyarchive.store.creation import package_versions
from flyarchive.store.location import (
    access_denied,
    archive_exists,
    open_store,
    parse_mode,
    refuse_existing,
    unavailable,
)
from flyarchive.store.reader import StateReader, open_checked, open_group, open_stored
from flyarchive.store.spec import ArchiveSpec, FrameBlock
from flyarchive.store.writer import ArchiveWriter

__all__ = [
    "ArchiveSpec", "ArchiveWriter", "FrameBlock", "StateReader", "open_store", "archive_exists",
    "open_group", "open_checked", "open_stored", "refuse_existing", "package_versions",
    "parse_mode", "access_denied", "unavailable",
]
