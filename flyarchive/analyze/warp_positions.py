"""Positions of keypoints with mujoco-warp: a batch of frames is a batch of worlds of one
``Data``; ``kinematics`` on Warp's CPU device or on CUDA, float32.

The twin of :mod:`~flyarchive.analyze.cpu_positions` (same skeleton model, same keypoint
picking): :class:`WarpKinematics` copies a batch's ``qpos`` (and mocap poses) into the
``Data`` (host arrays; on CUDA through a pinned staging buffer), runs ``kinematics``,
gathers the keypoints on the device (:func:`gather_keypoints`: one small array comes
back, not every body), and copies them to the host. Within float32 of the CPU's values
(NeuroMechFly: 2e-6 mm measured on an H200; the tests allow 1e-4 model units).

An engine is built once per process for a model, keypoints, device and batch size
(:func:`warp_engine`: the :data:`ENGINES_KEPT` last used are kept, with what callers keep
beside them, such as the streamed pipeline's pinned slots): the next call with the same
window pays no upload, allocation or kernel load. Its ``Data`` is allocated on the device
(``make_data``: zeros and the model's rest pose), not copied from the host (``put_data``
tiles a host ``MjData`` per world: 3.5 s for 16,384 NeuroMechFly worlds on Warp's CPU
device against 0.56 s).

Imported only when a Warp backend is asked for (``import flyarchive`` imports no warp).
"""

from __future__ import annotations

import copy
import threading
import time
import warnings
from typing import Any

import mujoco
import numpy as np

from flyarchive.analyze.cpu_positions import quat_mul
from flyarchive.analyze.keypoints import KeypointSet
from flyarchive.analyze.skeleton import kinematic_model
from flyarchive.errors import OptionsError
from flyarchive.lru import LRUCache
from flyarchive.warp_log import import_mujoco_warp, import_warp, no_cuda

wp = import_warp("Positions with mujoco-warp (backend 'warp-cpu' or 'gpu')")
mjw = import_mujoco_warp("Positions with mujoco-warp (backend 'warp-cpu' or 'gpu')")

#: Frames per batch (worlds of the ``Data``) by device kind.
DEFAULT_BATCH = {"cpu": 4096, "cuda": 65536}

#: Engines a process keeps, at most (the least recently used goes first) ...
ENGINES_KEPT = 2
#: ... and what their device arrays may weigh together, bytes (NeuroMechFly's engine of
#: 65,536 worlds: 3.4 GiB): an engine of another big model lets the older one go.
ENGINES_BYTES = 8 * 2**30

_ENGINES: LRUCache[tuple[Any, ...], WarpKinematics] = LRUCache(
    ENGINES_KEPT, max_weight=ENGINES_BYTES, weight=lambda engine: engine.nbytes,
    name="mujoco-warp positions engines")


@wp.kernel
def gather_keypoints(
    xpos: wp.array2d(dtype=wp.vec3),  # type: ignore[valid-type]
    site_xpos: wp.array2d(dtype=wp.vec3),  # type: ignore[valid-type]
    xquat: wp.array2d(dtype=wp.quat),  # type: ignore[valid-type]
    from_site: wp.array(dtype=wp.int32),  # type: ignore[valid-type]
    index: wp.array(dtype=wp.int32),  # type: ignore[valid-type]
    body: wp.array(dtype=wp.int32),  # type: ignore[valid-type]
    channels: wp.int32,
    out: wp.array3d(dtype=wp.float32),  # type: ignore[valid-type]
):
    """``out[w, k]``: keypoint ``k`` of world ``w``: a body's or a site's position, then
    (``channels == 7``) its body's quaternion, as stored (w, x, y, z)."""
    w, k = wp.tid()
    p = xpos[w, index[k]]
    if from_site[k] != 0:
        p = site_xpos[w, index[k]]
    out[w, k, 0] = p[0]
    out[w, k, 1] = p[1]
    out[w, k, 2] = p[2]
    if channels == 7:
        q = xquat[w, body[k]]
        out[w, k, 3] = q[0]
        out[w, k, 4] = q[1]
        out[w, k, 5] = q[2]
        out[w, k, 6] = q[3]


def device_of(backend: str) -> str:
    """The Warp device of a backend: ``"cpu"`` for ``"warp-cpu"``, ``"cuda"`` for ``"gpu"``.

    Raises:
        OptionsError: ``"gpu"`` was asked for and Warp sees no CUDA device.
    """
    if backend == "warp-cpu":
        return "cpu"
    why = no_cuda(wp, "backend='warp-cpu' (mujoco-warp on the CPU, the same float32 "
                      "kinematics) or backend='cpu'")
    if why is not None:
        raise OptionsError(why)
    return "cuda"


def warp_engine(model: mujoco.MjModel, sha256: str, keypoints: KeypointSet, orientations: bool,
                backend: str, batch: int | None = None, *, largest: int | None = None
                ) -> WarpKinematics:
    """The process's engine for a model (``sha256`` of its MJB bytes), keypoints, device of
    ``backend`` and batch size: the one kept, or a new one (kept; see the module's
    docstring). One per process, not per thread: device memory is not duplicated;
    callers hold its lock while they use it.

    Args:
        batch: Frames per batch; None: the device's default (:data:`DEFAULT_BATCH`), or
            ``largest`` when it is smaller.
        largest: The most frames the caller gives at once (a lazy array's largest block):
            no bigger batch is allocated.

    Raises:
        OptionsError: ``"gpu"`` was asked for and Warp sees no CUDA device.
    """
    device = wp.get_device(device_of(backend))
    size = int(batch or DEFAULT_BATCH["cuda" if device.is_cuda else "cpu"])
    if batch is None and largest:
        size = min(size, int(largest))
    key = (sha256, keypoints.digest, orientations, str(device), size)
    return _ENGINES.get(key, lambda: WarpKinematics(model, keypoints, orientations,
                                                    device=str(device), batch=size))


def clear_engines() -> None:
    """Forget the engines this process keeps (their device memory is freed once no call
    uses them)."""
    _ENGINES.clear()


def _for_warp(model: mujoco.MjModel) -> mujoco.MjModel:
    """A copy of a model that ``put_model`` accepts for kinematics: noslip and contacts
    off (only dynamics use them; the layout is untouched)."""
    prepared = copy.deepcopy(model)
    prepared.opt.noslip_iterations = 0
    prepared.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    prepared.geom_contype[:] = 0
    prepared.geom_conaffinity[:] = 0
    return prepared


class WarpKinematics:
    """Keypoint positions (and orientations) of batches of frames with mujoco-warp.

    Args:
        model: The compiled model (host; not modified).
        keypoints: Resolved in ``model``.
        orientations: Also give each keypoint's orientation.
        device: ``"cpu"`` or ``"cuda"`` (``"cuda:1"``...).
        batch: Frames per batch (worlds of the ``Data``); default by device kind.

    Attributes:
        lock: Held by whoever uses the engine (:meth:`frames` takes it).
        kept: What callers keep beside the engine, by name (the streamed pipeline's
            pinned slots and CUDA streams): built once, freed with it.
        nbytes: Bytes of its device arrays (the ``Data`` and the gather's output).
        created: When it was built (``time.perf_counter()``).

    Thread-safe: one batch at a time (a lock).
    """

    def __init__(self, model: mujoco.MjModel, keypoints: KeypointSet, orientations: bool, *,
                 device: str = "cpu", batch: int | None = None) -> None:
        built = kinematic_model(model, keypoints)
        self.device = wp.get_device(device)
        self.batch = int(batch or DEFAULT_BATCH["cuda" if self.device.is_cuda else "cpu"])
        self.channels = 7 if orientations else 3
        self.nq, self.nmocap = model.nq, model.nmocap
        self.lock = threading.Lock()
        self._keypoints = keypoints
        kinds = np.asarray(keypoints.kinds)
        from_site = (kinds != "body").astype(np.int32)
        index = np.where(from_site == 1, built.site_ids, keypoints.body_ids).astype(np.int32)
        host = _for_warp(built.model)
        with wp.ScopedDevice(self.device), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning)
            self.model = mjw.put_model(host)
            self.data = mjw.make_data(host, nworld=self.batch, nconmax=0, njmax=0)
            self._from_site = wp.array(from_site, dtype=wp.int32)
            self._index = wp.array(index, dtype=wp.int32)
            self._body = wp.array(keypoints.body_ids.astype(np.int32), dtype=wp.int32)
            self.out = wp.zeros((self.batch, len(keypoints), self.channels), dtype=wp.float32)
            # One site (never read) when the skeleton has none: the kernel needs an array.
            self._no_sites = wp.zeros((self.batch, 1), dtype=wp.vec3) if host.nsite == 0 else None
        self._host_in: dict[str, Any] = {}  # staging buffers (pinned on CUDA), made on first use
        self._host_out: Any = None
        self.kept: dict[str, Any] = {}
        self.created = time.perf_counter()
        arrays = [v for v in vars(self.data).values() if isinstance(v, wp.array)]
        self.nbytes = int(sum(a.capacity for a in arrays)) + int(self.out.capacity)

    def host_buffer(self, like: Any) -> Any:
        """A host array shaped as the device array ``like`` (pinned on CUDA)."""
        return wp.zeros(like.shape, dtype=like.dtype, device="cpu", pinned=self.device.is_cuda)

    def frames(self, qpos: np.ndarray, mocap_pos: np.ndarray | None = None,
               mocap_quat: np.ndarray | None = None) -> np.ndarray:
        """Keypoints of ``n`` frames, in batches.

        Args:
            qpos: ``(n, nq)`` (host, any float dtype; NaN rows give NaN).
            mocap_pos, mocap_quat: ``(n, nmocap, 3)``, ``(n, nmocap, 4)`` or None.

        Returns:
            ``(n, K, 3)`` float32 positions, or ``(n, K, 7)`` with orientations (host).
        """
        n = len(qpos)
        out = np.empty((n, len(self._keypoints), self.channels), dtype=np.float32)
        with self.lock:
            for r0 in range(0, n, self.batch):
                r1 = min(n, r0 + self.batch)
                state = {"qpos": qpos[r0:r1]}
                if self.nmocap and mocap_pos is not None and mocap_quat is not None:
                    state.update(mocap_pos=mocap_pos[r0:r1], mocap_quat=mocap_quat[r0:r1])
                self.upload(state, r1 - r0)
                self.launch()
                out[r0:r1] = self.download(r1 - r0)
        if self.channels == 7:
            out[..., 3:] = self.turn(out[..., 3:])
        return out

    def upload(self, state: dict[str, np.ndarray], n: int) -> None:
        """Copy the first ``n`` rows of each state array into the ``Data`` (on CUDA
        through a pinned buffer, on the device's stream)."""
        for name, values in state.items():
            host = self._host_in.get(name)
            if host is None:
                host = self._host_in[name] = self.host_buffer(getattr(self.data, name))
            host.numpy()[:n] = values
            wp.copy(getattr(self.data, name), host, count=n * int(np.prod(host.shape[1:])))

    def launch(self) -> None:
        """``kinematics`` and the keypoint gather on the device (queued on CUDA)."""
        with wp.ScopedDevice(self.device):
            mjw.kinematics(self.model, self.data)
            sites = self.data.site_xpos if self._no_sites is None else self._no_sites
            wp.launch(gather_keypoints, dim=(self.batch, len(self._keypoints)),
                      inputs=[self.data.xpos, sites, self.data.xquat, self._from_site,
                              self._index, self._body, self.channels, self.out])

    def download(self, n: int) -> np.ndarray:
        """The first ``n`` rows of the gathered keypoints, on the host (waits for them)."""
        if self._host_out is None:
            self._host_out = self.host_buffer(self.out)
        wp.copy(self._host_out, self.out, count=n * len(self._keypoints) * self.channels)
        if self.device.is_cuda:
            wp.synchronize_device(self.device)
        return self._host_out.numpy()[:n].copy()

    def turn(self, quats: np.ndarray) -> np.ndarray:
        """Body orientations ``(n, K, 4)`` turned by each site's ``site_quat``."""
        turned = np.flatnonzero((self._keypoints.quats != [1.0, 0.0, 0.0, 0.0]).any(axis=1))
        if turned.size:
            product = quat_mul(quats[:, turned].astype(np.float64), self._keypoints.quats[turned])
            quats[:, turned] = product / np.linalg.norm(product, axis=-1, keepdims=True)
        return quats
