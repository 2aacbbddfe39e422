"""The store: the only code that opens, reads and writes zarr archives (the codec pipelines
it writes with are defined in :mod:`flyarchive.codecs`). Create, append, commit, open, check.
The other zarr written by flyarchive is a render's lossless depth and segmentation maps,
plain zarr arrays beside its videos, written and read by :mod:`flyarchive.video.maps`
(read back by :mod:`flyarchive.video.decode`), not archives. zarr's internals are reached
only through :mod:`flyarchive.zarr_internals`.

- :mod:`~flyarchive.store.location`: URLs and zarr stores on any fsspec file system
  (:mod:`~flyarchive.store.localstore` on local disk), and the errors of storage clients
  in flyarchive's words (:mod:`~flyarchive.store.storage_errors`); files written whole on
  local disk outside archives (exports, tables, plots: :mod:`~flyarchive.store.local_files`);
- what is fixed when an archive is created (:class:`~flyarchive.archive_spec.ArchiveSpec`)
  and the blocks of frames it commits (:class:`~flyarchive.archive_spec.FrameBlock`) are
  the record stage's (:mod:`flyarchive.archive_spec`), which produces them;
- :mod:`~flyarchive.store.writer` (with :mod:`~flyarchive.store.creation`: root
  attributes, what is at a URL before creating, whether an archive can be appended to;
  :mod:`~flyarchive.store.nodes`: the arrays and groups of a new archive; and
  :mod:`~flyarchive.store.claims`): create, append and commit, one writer at a time;
- :mod:`~flyarchive.store.opener`: the one way an archive is opened for reading
  (:func:`~flyarchive.store.opener.open_for_reading`: the hardened store, the attributes
  validated, every array's metadata checked against :mod:`~flyarchive.store.allowlist`,
  what flyarchive accepts, and against its other copy, :mod:`~flyarchive.store.replicas`;
  an archive replaced since refused), and what is at a URL where an archive was expected
  and none is (a map, an array inside an archive), named in the error;
- the state reader family, every reader opening through the opener:
  :mod:`~flyarchive.store.reader` (:class:`~flyarchive.store.reader.StateReader`: pieces
  of worlds for renders, straight through zarr, decoded by
  :mod:`~flyarchive.store.decoders`; and the errors that name what failed to read) and
  :mod:`~flyarchive.store.window_reader` (rows of a window for positions, gait and the
  viewer: threads, worker processes writing into shared memory, or dask, behind one
  interface);
- :mod:`~flyarchive.store.dataset`: the lazy dataset readers get (selections read only
  the chunks they touch; frames past ``n_frames`` masked inside the read), and the header
  (:func:`~flyarchive.store.dataset.open_header`,
  :class:`~flyarchive.store.header.ArchiveHeader` of :mod:`~flyarchive.store.header`): what
  a render plans with, read without xarray or dask; both read through
  :mod:`~flyarchive.store.shards` (each shard fetched once, inner chunks decoded into the
  result, indexes of shards that can no longer change kept); inside ``n_frames`` a missing
  chunk, shard or index entry fails the read (:mod:`~flyarchive.store.chunk_holes`); both
  are built on :mod:`~flyarchive.store.coordinates` (``n_frames`` and the coordinates, read
  consistent and checked at open);
- :mod:`~flyarchive.store.consolidated`: every array's metadata in the root ``zarr.json``,
  written at each commit, never ahead of ``n_frames``;
- :mod:`~flyarchive.store.integrity`: ``verify``, every committed byte;
- :mod:`~flyarchive.store.shutdown`: writes that must still happen while Python exits;
- the models kept by content beside an archive, compiled (``models/<sha256>.mjb``) and
  portable (``models/<sha256>.mjz``), are read and written through the store by
  :mod:`flyarchive.models.kept`, a module of the store's floor in the models package;
- :mod:`~flyarchive.store.derived`: derived groups (keypoint positions) kept beside an
  archive or as an archive of their own, read and checked as its states are (every array
  of dims ``(world, time, ...)`` is state) and held to their archive;
- :mod:`~flyarchive.store.world_vars`: per-world variables added after recording.

Internal: the public names are re-exported by ``flyarchive``.
"""

from flyarchive.store.creation import package_versions, refuse_existing
from flyarchive.store.location import (
    access_denied,
    archive_exists,
    open_store,
    parse_mode,
    unavailable,
)
from flyarchive.store.opener import open_for_reading, open_for_writing
from flyarchive.store.reader import StateReader, stored_dataset
from flyarchive.archive_spec import ArchiveSpec, FrameBlock
from flyarchive.store.writer import ArchiveWriter

