"""A model shipped to Dask workers: its MJB bytes as one input of a dask graph, sent to a
cluster once per client and model (:func:`graph_model`, :func:`scatter_model`,
:class:`ModelRef`), and loaded once per worker process (:func:`shipped_model`).

A graph built while a default ``distributed.Client`` exists refers to the bytes by the
key they were scattered under (``flyarchive-model-<sha256>``, sent to every worker), as
Dask recommends for large inputs ("scatter data ahead of time and use futures"): each
``compute()`` then sends the scheduler 14 kB for NeuroMechFly's positions instead of 22 MB
(distributed warns "Sending large graph" above 10 MB). The tasks do not name the scattered
future as an input (a graph that did would compute nowhere but on that client: dask's
local schedulers fail with "Missing dependency"): the same graph holds the bytes in the
process that built it, never pickled, so computed there (threaded or synchronous
scheduler, the client open or closed) it needs no cluster; on a worker a task finds them
in its worker's memory, or fetches them once per process from a worker that holds them
(Dask's active memory manager soon keeps one copy of data no task waits for). Built
without a client, the graph holds the bytes as one key, sent with each compute. Renders
on a cluster scatter the bytes the same way (:func:`scatter_model`).

Distributed is imported only where it is already imported (a client can exist only then)
or on a Dask worker. The futures sent and the bytes fetched are kept in
:class:`~flyarchive.lru.LRUCache` s; the model loaded from the bytes in the process's one
cache of models (:mod:`flyarchive.models.cache`).
"""

from __future__ import annotations

import hashlib
import sys
import threading
from typing import Any

import mujoco

from flyarchive.errors import ModelLoadError
from flyarchive.lru import LRUCache
from flyarchive.models.cache import loaded_model

#: The key of a model's bytes scattered to a cluster: this and their SHA-256 (hex).
SCATTER_PREFIX = "flyarchive-model-"

#: Models kept scattered per client, at most (the oldest is released first; a graph that
#: still refers to it keeps it).
KEPT_PER_CLIENT = 4

#: Clients whose sent models are kept, at most (a process has one or two).
CLIENTS_KEPT = 4

#: Client id -> the client, and the futures of the models it sent, by their SHA-256.
_SENT: LRUCache[str, tuple[Any, LRUCache[str, Any]]] = LRUCache(
    CLIENTS_KEPT, name="clients and the models they sent")
_SENT_LOCK = threading.Lock()  # one client's futures looked at, dropped and sent at once
#: On a worker: the bytes fetched from the cluster, by their key (the last 2).
_FETCHED: LRUCache[str, bytes] = LRUCache(2, name="model bytes fetched from the cluster")
_FETCHED_LOCK = threading.Lock()


class ModelRef:
    """MJB bytes as a task of a dask graph gets them: :meth:`blob`.

    Built with a scattered ``future``, it pickles (a graph sent to a scheduler) as the
    SHA-256 and the key alone, and a task on a worker finds the bytes under that key in
    its worker's memory (or fetches them from the worker that holds them); in the process
    that built it, the bytes are at hand. Without a future it pickles with the bytes.

    Attributes:
        sha256: SHA-256 of the bytes (hex).
        key: The key they were scattered under; None: not scattered.
    """

    __slots__ = ("sha256", "key", "_blob", "_future")

    def __init__(self, sha256: str, blob: bytes | None, key: str | None = None,
                 future: Any = None) -> None:
        self.sha256, self.key, self._blob, self._future = sha256, key, blob, future

    def __reduce__(self) -> tuple[Any, ...]:
        if self.key is None:
            return (ModelRef, (self.sha256, self._blob))
        return (ModelRef, (self.sha256, None, self.key))

    def __repr__(self) -> str:
        where = "in the graph" if self.key is None else f"scattered as {self.key!r}"
        return f"ModelRef(sha256={self.sha256[:12]}..., {where})"

    def blob(self) -> bytes:
        """The MJB bytes: at hand, or from this Dask worker's cluster.

        Raises:
            ModelLoadError: they are not at hand and this is not a worker of a cluster
                that holds them (the client that sent them closed, another cluster or
                scheduler computes the graph).
        """
        if self._blob is not None:
            return self._blob
        assert self.key is not None
        blob = _fetched(self.key)
        if blob is None:
            raise ModelLoadError(
                f"The model (sha256 {self.sha256[:12]}...) was sent once to the Dask cluster "
                f"of the client that was the default when this graph was built, as "
                f"{self.key!r}, and this process cannot find it there. The client that sent "
                "it closed, or the graph is computed on another cluster or in another process "
                "pool. Compute it on that client (or in the process that built it), or build "
                "it again (e.g. flyarchive.positions(...)) with the client you compute on as "
                "the default.")
        return blob


def mjb_of(value: bytes | ModelRef) -> bytes:
    """The MJB bytes of a graph's model input (:func:`graph_model`): bytes as they are."""
    return value.blob() if isinstance(value, ModelRef) else value


def shipped_model(sha256: str, value: bytes | ModelRef) -> mujoco.MjModel:
    """The model of a graph's model input whose SHA-256 is ``sha256`` (computed by the
    caller), loaded once per process (:func:`flyarchive.models.cache.loaded_model`); the
    bytes of a :class:`ModelRef` are looked for only then.

    Raises:
        ModelLoadError: the bytes cannot be found (:meth:`ModelRef.blob`), or are not an
            MJB this MuJoCo can load.
    """
    try:
        return loaded_model(sha256, lambda: mjb_of(value))
    except ModelLoadError as err:
        worker = _worker_address()
        if worker is None:
            raise
        raise ModelLoadError(
            f"On the Dask worker {worker} (MuJoCo {mujoco.__version__}): {err} Workers run "
            "the MuJoCo of the process that renders: start them in its environment.") from None


def _worker_address() -> str | None:
    """The address of the Dask worker this runs in; None outside one."""
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return None


def graph_model(blob: bytes, sha256: str | None = None) -> Any:
    """The model's MJB bytes as one input of a dask graph: a ``dask.delayed`` holding a
    :class:`ModelRef`, scattered to the default Dask client's workers first when there
    is one (:func:`scatter_model`, once per client and model).

    Args:
        blob: The MJB bytes.
        sha256: Their SHA-256 (hex), if known (else computed: 0.03 s for 23 MB).
    """
    import dask

    sha256 = sha256 or hashlib.sha256(blob).hexdigest()
    client = default_client()
    if client is None:
        ref, name = ModelRef(sha256, blob), f"{SCATTER_PREFIX}bytes-{sha256}"
    else:
        future = scatter_model(client, blob, sha256)
        ref, name = ModelRef(sha256, blob, future.key, future), f"{SCATTER_PREFIX}ref-{sha256}"
    return dask.delayed(ref, name=name, pure=True)


def default_client() -> Any:
    """The default ``distributed.Client`` of this thread; None: none (or distributed is
    not imported, so none can exist: it is not imported here)."""
    if "distributed" not in sys.modules:
        return None
    from distributed import default_client as default

    try:
        return default()
    except ValueError:  # no default client
        return None


def scatter_model(client: Any, blob: bytes, sha256: str | None = None, *,
                  again: bool = False) -> Any:
    """Send the MJB bytes to every worker of ``client``'s cluster, once per client and
    model; the future of them.

    The key is ``flyarchive-model-<sha256>``: Dask does not tokenize the bytes itself
    (0.4 s for NeuroMechFly's 23 MB, measured, against 0.03 s for hashlib). A model sent
    before by the same client (and still held) is not sent again: its future is kept
    here, for the :data:`KEPT_PER_CLIENT` models the client sent last, while the client
    runs. ``again``: send it even so (the workers that held it died; its future may not
    say so yet).
    """
    sha256 = sha256 or hashlib.sha256(blob).hexdigest()
    key = SCATTER_PREFIX + sha256
    with _SENT_LOCK:
        for client_id in list(_SENT.keys()):
            kept = _SENT.peek(client_id)
            if kept is not None and not _running(kept[0]):
                _SENT.pop(client_id)  # a closed client's futures are gone
        sent = _SENT.get(client.id, lambda: (client, LRUCache(
            KEPT_PER_CLIENT, name=f"models sent by client {client.id}")))[1]
        future = sent.peek(sha256)
        if future is not None and (again or future.status != "finished"):  # lost, cancelled
            sent.pop(sha256)
        return sent.get(sha256, lambda: _scattered(client, key, blob))


def _scattered(client: Any, key: str, blob: bytes) -> Any:
    """``client.scatter`` of the bytes to every worker, its "No valid workers found" said
    in words (a cluster without workers, or whose workers died)."""
    try:
        return client.scatter({key: blob}, broadcast=True)[key]
    except TimeoutError as err:
        if "no valid workers" not in str(err).lower():
            raise
        from flyarchive.errors import RenderFailedError

        address = getattr(getattr(client, "scheduler", None), "address", None) or "its scheduler"
        raise RenderFailedError(
            f"The Dask cluster at {address} has no worker to render on: none joined, or "
            "they died (a worker that cannot import flyarchive, or MuJoCo, dies at its "
            "first task; its log says why). Start workers in an environment with "
            "flyarchive and the same extras installed, or render without the cluster "
            "(--workers N, or --workers 0).") from None


def _running(client: Any) -> bool:
    """Whether ``client`` still runs."""
    return getattr(client, "status", None) in ("running", "connecting")


def _fetched(key: str) -> bytes | None:
    """The bytes scattered under ``key`` (:func:`_from_cluster`), kept by this process
    once found (the 2 latest models): a worker's copy may be dropped (see there), and
    tasks that need the bytes (not a model loaded from them) fetch them once per process."""
    with _FETCHED_LOCK:  # one fetch at a time: the next thread finds what the first fetched
        blob = _FETCHED.peek(key)
        if blob is None:
            blob = _from_cluster(key)
        if blob is not None:
            _FETCHED.put(key, blob)  # the most recently used
        return blob


def _from_cluster(key: str) -> bytes | None:
    """The bytes scattered under ``key``, from this Dask worker's memory or straight from a
    worker of its cluster that holds them (Dask's active memory manager soon keeps one
    copy of data that no task waits for: a task does not wait for these, as it does not
    name them as its input); None: this is not a Dask worker, or its cluster holds none."""
    if "distributed" not in sys.modules:  # not a Dask worker
        return None
    from distributed import get_client, get_worker
    from distributed.utils_comm import gather_from_workers

    try:
        worker = get_worker()
    except ValueError:  # not in a task of a worker
        return None
    try:
        return worker.data[key]
    except KeyError:
        pass
    client = get_client()
    holders = client.sync(client.scheduler.who_has, keys=[key]).get(key)
    if not holders:
        return None
    found, *_ = client.sync(gather_from_workers, {key: holders}, client.rpc)
    return found.get(key)
