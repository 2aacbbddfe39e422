"""What is rendered: :class:`RenderOptions` (size, backend, segments and batches, encoder
settings, outputs, mosaic, overlays), checked when made, and each backend's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from flyarchive.errors import RenderOptionsError
from flyarchive.replay import BACKENDS, backend_name
from flyarchive.replay.output_kinds import parse_depth_scale, parse_outputs
from flyarchive.replay.sizes import MAX_GL_SIDE, parse_frame_size
from flyarchive.video.mosaic import check_h264_size, mosaic_size, parse_mosaic
from flyarchive.video.mp4 import VideoOptions
from flyarchive.replay.overlay_text import parse_overlay


#: States per batch of each Warp backend unless told otherwise. On an H200 (NeuroMechFly
#: 240x320), the batch renderer's own rate is the same at 256 and 1024 (11.9k and 12.0k
#: frames/s) and so is a whole render of RGB videos, but RGB + depth + segmentation took
#: 1.27x the RGB time at 1024 against 1.36x at 256 (fewer, larger map copies).
DEFAULT_BATCH_WORLDS = {"gpu": 1024, "warp-cpu": 4}


@dataclass(frozen=True)
class RenderOptions:
    """How to render.

    Attributes:
        size: ``(height, width)`` of each frame, pixels; both even (H.264 yuv420p), at
            most 16384 on ``"opengl"``.
        backend: ``"opengl"`` (mujoco.Renderer, OpenGL/EGL, bit-exact; its old name
            ``"cpu"`` is accepted with a DeprecationWarning), ``"gpu"``
            (mujoco-warp batch renderer on CUDA) or ``"warp-cpu"`` (the same renderer on
            Warp's CPU device).
        segment_frames: Frames per independently encoded segment (a Dask task).
        batch_worlds: States per batch for the Warp backends (at most 4 on
            ``"warp-cpu"``, whose CPU device renders them one after another). None:
            :data:`DEFAULT_BATCH_WORLDS` of the backend. Each batch in flight holds
            its frames on the device and in pinned host memory (NeuroMechFly 240x320,
            1024 states: 118 MB of I420 frames, 315 MB more with depth and
            segmentation).
        video: Encoder settings. ``None`` (default): :func:`default_video_options` of
            the backend: x264 ``veryfast``, or ``ultrafast`` on ``"gpu"``.
        overwrite: Replace existing videos.
        progress: Show a progress bar in this process (one, however many workers).
        outputs: What to make per (world, camera), names from
            :data:`flyarchive.replay.output_kinds.OUTPUTS` (CLI ``--outputs rgb,depth``): an mp4
            of ``"rgb"``; lossless 16-bit maps of ``"depth"`` (planar depth, model length
            unit) and ``"segmentation"`` (geom id + 1) as zarr arrays beside it
            (:mod:`flyarchive.video.maps`; read them with :func:`flyarchive.read_depth`
            and :func:`flyarchive.read_segmentation`). Default RGB only.
        depth_scale: Model length units per depth count; None: the model's far plane
            / 65534 (:func:`flyarchive.replay.output_kinds.default_depth_scale`).
        mosaic: ``(rows, cols)`` (CLI ``--mosaic 2x3``): tile that many worlds, each at
            ``size``, into one video per camera, ``{out}/mosaic000/{name}.mp4`` (the
            camera's name as in world videos: :func:`flyarchive.video.safe_video_path`), each
            tile labelled with its world id, tiles in the order of the selected worlds
            (row by row). More worlds than tiles make several mosaic videos; fewer leave
            blank (black) tiles, listed in the manifest. RGB only (no maps), not with
            the windows of a ``(world, time)`` where mask; on the Warp backends the
            tiles are assembled on the device (:mod:`flyarchive.video.mosaic`).
        overlays: Text burnt into the RGB frames (CLI ``--overlay time,world``): any of
            ``"world"``, ``"time"``, ``"speed"`` and the archive's per-world variables
            (:mod:`flyarchive.replay.overlay_text`). Default none.

    Raises:
        RenderOptionsError: an unknown backend or output, counts below 1, a mosaic that is
            not two positive integers or with other outputs than RGB, or an overlay
            without RGB.
        FrameSizeError: a size H.264 (or, for ``"opengl"``, OpenGL) cannot take.
    """

    size: tuple[int, int] = (240, 320)
    backend: str = "opengl"
    segment_frames: int = 100
    batch_worlds: int | None = None
    video: VideoOptions = None  # type: ignore[assignment]  # set in __post_init__
    overwrite: bool = False
    progress: bool = False
    outputs: tuple[str, ...] = ("rgb",)
    depth_scale: float | None = None
    mosaic: tuple[int, int] | None = None
    overlays: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", backend_name(self.backend))
        if self.backend not in BACKENDS:
            raise RenderOptionsError(
                f"Unknown backend {self.backend!r}. Backends: {', '.join(map(repr, BACKENDS))}."
            )
        if self.batch_worlds is None:
            object.__setattr__(self, "batch_worlds", DEFAULT_BATCH_WORLDS.get(self.backend, 256))
        for name in ("segment_frames", "batch_worlds"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RenderOptionsError(f"{name} must be an integer of at least 1, got {value!r}.")
        gl = MAX_GL_SIDE if self.backend == "opengl" else None
        object.__setattr__(self, "size", parse_frame_size(self.size, even=True, max_side=gl))
        if self.video is None:
            object.__setattr__(self, "video", default_video_options(self.backend))
        elif not isinstance(self.video, VideoOptions):
            raise TypeError(f"video must be a VideoOptions or None, got {self.video!r}.")
        _check_outputs(self)


def _check_outputs(options: RenderOptions) -> None:
    """Check and normalize the output fields of a (frozen) ``RenderOptions`` in place.

    Raises:
        RenderOptionsError: see :class:`RenderOptions`.
    """
    outputs = parse_outputs(options.outputs)
    mosaic = parse_mosaic(options.mosaic)
    overlay = parse_overlay(options.overlays)
    if mosaic is not None and outputs != ("rgb",):
        raise RenderOptionsError(
            f"A mosaic tiles RGB videos; outputs={outputs!r} asks for maps too. Render depth "
            "and segmentation without mosaic=, and the mosaic with outputs=('rgb',).")
    if overlay and "rgb" not in outputs:
        raise RenderOptionsError(
            f"An overlay is burnt into RGB frames; outputs={outputs!r} has none. Add 'rgb' "
            "to outputs, or drop the overlay (maps are never drawn on).")
    if mosaic is not None:
        mosaic_size(options.size, mosaic)
    elif "rgb" in outputs:
        check_h264_size(options.size, f"Frames of {options.size[0]}x{options.size[1]} pixels")
    values = {"outputs": outputs, "mosaic": mosaic, "overlays": overlay,
              "depth_scale": parse_depth_scale(options.depth_scale)}
    for name, value in values.items():
        object.__setattr__(options, name, value)


def default_video_options(backend: str) -> VideoOptions:
    """The encoder settings a backend uses unless told otherwise.

    Both encode H.264 yuv420p at ``crf=18``. On ``"gpu"`` the x264 encoders on the host
    CPU are the slowest stage, so it uses the ``ultrafast`` preset: measured on an
    H200 host with 16 cores, NeuroMechFly 240x320, it costs 0.7 ms of CPU per frame
    against about 2 for ``veryfast``, for files about 3x larger at the same quality
    setting. The OpenGL and Warp CPU backends render far slower than they encode and
    keep ``veryfast``.
    """
    return VideoOptions(preset="ultrafast") if backend == "gpu" else VideoOptions()
