"""The one archive a viewer shows: opened once (and again when it was replaced), its world
table, its states read per world and kept in a bounded cache, and its model.

Everything goes through the package's own readers (:func:`flyarchive.store.opening.open_header`,
:func:`flyarchive.open_archive`, :func:`flyarchive.load_model`), so the viewer reads
exactly what every other reader reads, with the same checks.

Opening is in two steps, so that the page is up in a second or two: the header
(attributes, coordinates, ``n_frames``, world variables: no xarray, no dask) before the
server listens, and the lazy dataset that reads states (xarray and dask: seconds of
imports on a 2-core machine) after, on a thread of its own (:meth:`ViewedArchive.dataset`),
checked to be the archive whose header the page shows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flyarchive.errors import ArchiveReplacedError, SelectionError

#: Bytes of states kept in memory (whole worlds: 1000 NeuroMechFly frames are 0.58 MB).
CACHE_BYTES = 512 << 20


def load_viewed_model(url: str, storage_options: Mapping[str, Any] | None,
                      model_path: str | None) -> Any:
    """The model to pose and render with: the file given, else the one kept beside the
    archive (untrusted input: :func:`flyarchive.load_model` loads it in a short-lived child
    process first).

    Raises:
        ModelLoadError: no model file at ``model_path``, or no kept model (the viewer
            then shows the table and traces only).
        CorruptArchiveError, UnsafeModelError: a damaged or unsafe kept model.
    """
    import flyarchive

    if model_path:
        return flyarchive.load_model(model_path)
    return flyarchive.load_model(url, storage_options)


class ViewedArchive:
    """An opened archive and what the viewer keeps of it.

    Attributes:
        url: As given to ``flyarchive view``.
        generation: Incremented each time the archive is opened (again).
        attrs: The archive's attributes (from its header).
        ds: The dataset (:func:`flyarchive.open_archive`), opened on first use
            (:meth:`dataset`).
        world_ids: ``(n_worlds,)`` int64.
        times: ``(n_times,)`` float64 simulated seconds of the frames.
        columns: World table columns: ``world``, ``n_frames``, then each per-world
            variable, name -> ``(n_worlds,)`` values.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.generation = 0
        self._lock = threading.RLock()
        self._cache: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()
        self._cached_bytes = 0
        self._ds: Any = None
        self._opening = threading.Lock()  # one opening of the dataset at a time
        self.open()

    # ------------------------------------------------------------------ opening
    def open(self) -> None:
        """Open (or open again) the archive's header; forget everything read from the last
        one (the dataset is opened again on first use).

        Raises:
            As :func:`flyarchive.store.opening.open_header`.
        """
        from flyarchive.store.opening import open_header

        header = open_header(self.url, self.storage_options or None)
        world_ids = np.asarray(header["world"].values, dtype=np.int64)
        n_frames = np.asarray(header["n_frames"].values, dtype=np.int64)
        columns: dict[str, np.ndarray] = {"world": world_ids, "n_frames": n_frames}
        for name, var in sorted(header.data_vars.items()):  # the same order every time
            if var.dims == ("world",) and name != "n_frames":
                columns[str(name)] = np.asarray(var.values)
        with self._lock:
            self.attrs = header.attrs
            self.world_ids, self.n_frames, self.columns = world_ids, n_frames, columns
            self.times = np.asarray(header["time"].values, dtype=np.float64)
            self.dofs = [str(d) for d in header["dof"].values]
            self._index = {int(w): i for i, w in enumerate(world_ids)}
            self._cache.clear()
            self._cached_bytes = 0
            self._ds = None
            self.generation += 1

    def dataset(self) -> Any:
        """The lazy dataset that reads states (:func:`flyarchive.open_archive`), opened on
        first use (or by :meth:`Viewer.warm_up <flyarchive.view.app.Viewer.warm_up>`).

        Raises:
            ArchiveReplacedError: the archive there now is not the one whose header the page
                shows (another ``archive_id``).
            As :func:`flyarchive.open_archive`.
        """
        import flyarchive

        with self._opening:
            with self._lock:
                ds, generation, opened_id = self._ds, self.generation, self.archive_id
            if ds is None:
                ds = flyarchive.open_archive(self.url, self.storage_options or None)
                now = str(ds.attrs.get("archive_id", ""))
                if now != opened_id:
                    raise ArchiveReplacedError(
                        f"The archive at {self.url!r} was replaced after the viewer opened it "
                        f"(its archive_id is now {now!r}, it was {opened_id!r}). Open it again "
                        "to see the archive that is there now.")
                with self._lock:
                    if generation == self.generation:
                        self._ds = ds
        return ds

    @property
    def ds(self) -> Any:
        """:meth:`dataset`."""
        return self.dataset()

    @property
    def fps(self) -> float:
        return float(self.attrs["output_fps"])

    @property
    def archive_id(self) -> str:
        return str(self.attrs.get("archive_id", ""))

    def check_same(self) -> None:
        """Read one stored value: every read checks that the archive is still the one
        opened. Before the dataset is open there is nothing to check: the page shows the
        header read moments ago, and the dataset is checked against it as it opens.

        Raises:
            ArchiveReplacedError: it was replaced or deleted since it was opened.
        """
        with self._lock:
            ds = self._ds
        if ds is not None and ds.sizes["time"] and ds.sizes["world"]:
            ds.qpos.isel(world=0, time=0, dof=0).values  # noqa: B018  (the read is the check)

    # ------------------------------------------------------------------ states
    def index_of(self, worlds: Sequence[int]) -> list[int]:
        """Positions of world ids in the archive.

        Raises:
            SelectionError: an id the archive does not hold.
        """
        missing = [w for w in worlds if int(w) not in self._index]
        if missing:
            raise SelectionError(
                f"The archive has no world {missing[0]!r}; it holds {len(self.world_ids)} worlds "
                f"with ids {int(self.world_ids.min())} to {int(self.world_ids.max())}.")
        return [self._index[int(w)] for w in worlds]

    def states(self, worlds: Sequence[int]) -> list[dict[str, np.ndarray]]:
        """Every frame of each world: ``qpos`` ``(n_times, nq)`` float64 (NaN past its
        ``n_frames``), and ``mocap_pos`` / ``mocap_quat`` when the archive has them.

        Worlds not in the cache are read together, in one read.

        Raises:
            SelectionError: an unknown world id.
            ArchiveReplacedError, CorruptArchiveError: as reads of the dataset.
        """
        self.index_of(worlds)  # unknown ids refused first
        with self._lock:
            generation = self.generation
            missing = sorted({int(w) for w in worlds if int(w) not in self._cache})
        fresh = {}
        if missing:
            ds = self.dataset()
            # World by world: a read of one world reads only its own chunks (a list of
            # scattered worlds made dask read their whole shards: 7x slower, measured).
            # Four at a time: decoding releases the GIL in part (25 NeuroMechFly worlds of
            # 1000 frames, 2 busy cores: 1.32 -> 0.92 s).
            names = [n for n in ("qpos", "mocap_pos", "mocap_quat") if n in ds]

            def read(world: int) -> dict[str, np.ndarray]:
                one = ds[names].isel(world=self._index[world])
                return {n: np.asarray(one[n].values, dtype=np.float64) for n in names}

            with ThreadPoolExecutor(max_workers=min(4, len(missing))) as pool:
                fresh = dict(zip(missing, pool.map(read, missing)))
            self._keep(generation, fresh)
        with self._lock:
            got = [fresh.get(int(w)) or self._cache.get(int(w)) for w in worlds]
            for w in worlds:
                if int(w) in self._cache:
                    self._cache.move_to_end(int(w))
        return [g for g in got if g is not None]

    def _keep(self, generation: int, fresh: Mapping[int, dict[str, np.ndarray]]) -> None:
        with self._lock:
            if generation != self.generation:
                return  # read from an archive that was opened again meanwhile
            for world, arrays in fresh.items():
                self._cache[world] = arrays
                self._cached_bytes += sum(a.nbytes for a in arrays.values())
            while self._cached_bytes > CACHE_BYTES and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cached_bytes -= sum(a.nbytes for a in old.values())

    def frame_window(self, start: float | None, end: float | None) -> slice:
        """The frames whose times lie in ``[start, end]`` (None: open on that side)."""
        lo = 0 if start is None else int(np.searchsorted(self.times, start, side="left"))
        hi = len(self.times) if end is None else int(np.searchsorted(self.times, end, side="right"))
        return slice(lo, max(lo, hi))

