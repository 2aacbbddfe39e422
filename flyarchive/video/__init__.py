"""Video: frames to H.264 mp4 files, segments joined without re-encoding, outputs named
and published to any fsspec URL, manifests, and decoding for checks.

- :mod:`~flyarchive.video.mp4`: H.264 mp4 through ffmpeg: :class:`VideoWriter`,
  :class:`VideoOptions`, :func:`concat_segments` (segments joined without re-encoding);
- :mod:`~flyarchive.video.output_files`: every output of a video, named
  (:func:`safe_video_path`), written together (:class:`OutputWriter`) and published
  (:func:`write_output`);
- :mod:`~flyarchive.video.manifest`: ``manifest.json`` beside the videos;
- :mod:`~flyarchive.video.maps`: depth and segmentation maps, lossless zarr arrays beside
  the videos;
- :mod:`~flyarchive.video.decode`: :func:`read_video`, :func:`read_depth`,
  :func:`read_segmentation`;
- :mod:`~flyarchive.video.mosaic`: many worlds tiled into one video per camera;
- :mod:`~flyarchive.video.workspace`: a render run's folders (parts, scratch), removed by
  the next run once their owner is dead;
- :mod:`~flyarchive.video.guard`: output folders guarded as archives are (links out,
  odd files).

Internal: the public names are re-exported by ``flyarchive``.
"""

import importlib
from typing import Any

# Names are imported when first used (PEP 562): `flyarchive render --help` needs PRESETS,
# not zarr and ffmpeg.
_WHERE = {
    "FrameFormatError": "flyarchive.errors", "VideoEncodeError": "flyarchive.errors",
    "PIXEL_FORMATS": "flyarchive.replay.sizes", "frame_shape": "flyarchive.replay.sizes",
    "read_depth": "flyarchive.video.decode", "read_segmentation": "flyarchive.video.decode",
    "read_video": "flyarchive.video.decode",
    "PRESETS": "flyarchive.video.mp4", "VideoOptions": "flyarchive.video.mp4",
    "VideoWriter": "flyarchive.video.mp4", "concat_segments": "flyarchive.video.mp4",
    "encode_segment": "flyarchive.video.mp4",
    "safe_video_path": "flyarchive.video.output_files", "write_output": "flyarchive.video.output_files",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'flyarchive.video' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
