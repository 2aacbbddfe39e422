"""The store: the only code that opens, reads and writes zarr archives (the codec pipelines
it writes with are defined in :mod:`flyarchive.codecs`). Create, append, commit, open, check.
The other zarr written by flyarchive is a render's lossless depth and segmentation maps,
plain zarr arrays beside its videos, written and read by :mod:`flyarchive.video.maps`
(read back by :mod:`flyarchive.video.decode`), not archives.

- :mod:`~flyarchive.store.location`: URLs and zarr stores on any fsspec file system
  (:mod:`~flyarchive.store.localstore` on local disk), and the errors of storage clients
  in flyarchive's words (:mod:`~flyarchive.store.storage_errors`);
- what is fixed when an archive is created (:class:`~flyarchive.record.spec.ArchiveSpec`)
  and the blocks of frames it commits (:class:`~flyarchive.record.spec.FrameBlock`) are
  the record stage's (:mod:`flyarchive.record.spec`), which produces them;
- :mod:`~flyarchive.store.writer` (with :mod:`~flyarchive.store.creation`,
  :mod:`~flyarchive.store.new_archive` and :mod:`~flyarchive.store.claims`): create,
  append and commit, one writer at a time;
- :mod:`~flyarchive.store.reader`: open (checked by :mod:`~flyarchive.store.hardening`,
  decoded by :mod:`~flyarchive.store.decoders`), read, and name what failed to read;
- :mod:`~flyarchive.store.dataset`: the lazy dataset readers get (selections read only
  the chunks they touch; frames past ``n_frames`` masked inside the read), read through
  :mod:`~flyarchive.store.shards` (each shard fetched once, inner chunks decoded into the
  result, indexes of shards that can no longer change kept); inside ``n_frames`` a missing
  chunk, shard or index entry fails the read (:mod:`~flyarchive.store.missing`); it and
  the header are built on :mod:`~flyarchive.store.coordinates` (``n_frames`` and the
  coordinates, read consistent and checked at open);
- :mod:`~flyarchive.store.consolidated`: every array's metadata in the root ``zarr.json``,
  written at each commit, never ahead of ``n_frames``;
- :mod:`~flyarchive.store.integrity`: ``verify``, every committed byte;
- :mod:`~flyarchive.store.shutdown`: writes that must still happen while Python exits;
- :mod:`~flyarchive.store.opening`: an archive opened for reading, looked at again should
  a writer change it meanwhile; its header (:func:`~flyarchive.store.opening.open_header`,
  :class:`~flyarchive.store.header.ArchiveHeader` of :mod:`~flyarchive.store.header`): what
  a render plans with, read without xarray or dask;
- :mod:`~flyarchive.store.copies`: an array's metadata and its consolidated copy, checked
  to agree;
- :mod:`~flyarchive.store.elsewhere`: what is at a URL where an archive was expected (a
  map, an array inside an archive), named in the error;
- the models kept by content beside an archive, compiled (``models/<sha256>.mjb``) and
  portable (``models/<sha256>.mjz``), are read and written through the store by
  :mod:`flyarchive.models.kept`, a module of the store's floor in the models package;
- :mod:`~flyarchive.store.derived`: derived groups (keypoint positions) kept beside an
  archive or as an archive of their own, read and checked as its states are (every array
  of dims ``(world, time, ...)`` is state) and held to their archive;
- :mod:`~flyarchive.store.world_vars`: per-world variables added after recording.

Internal: the public names are re-exported by ``flyarchive``.
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
from flyarchive.archive_spec import ArchiveSpec, FrameBlock
from flyarchive.store.writer import ArchiveWriter

