"""Video: frames to H.264 mp4 files, segments joined without re-encoding, outputs named
and published to any fsspec URL, manifests, and decoding for checks.

- :mod:`~flyarchive.video.writer`: :class:`VideoWriter`, :class:`VideoOptions`;
- :mod:`~flyarchive.video.segments`: :func:`concat_segments`;
- :mod:`~flyarchive.video.output`: :func:`safe_video_path`, :func:`write_output`;
- :mod:`~flyarchive.video.manifest`: ``manifest.json`` beside the videos;
- :mod:`~flyarchive.video.maps`: depth and segmentation maps, lossless zarr arrays beside
  the videos;
- :mod:`~flyarchive.video.decode`: :func:`read_video`, :func:`read_depth`,
  :func:`read_segmentation`.
"""

from flyarchive.errors import FrameFormatError, VideoEncodeError
from flyarchive.replay.frames import PIXEL_FORMATS, frame_shape
from flyarchive.video.decode import read_depth, read_segmentation, read_video
from flyarchive.video.output import safe_video_path, write_output
from flyarchive.video.segments import concat_segments
from flyarchive.video.writer import PRESETS, VideoOptions, VideoWriter, encode_segment

__all__ = [
    "VideoOptions", "VideoWriter", "encode_segment", "concat_segments", "write_output",
    "safe_video_path", "read_video", "read_depth", "read_segmentation", "PRESETS", "PIXEL_FORMATS", "frame_shape",
    "FrameFormatError", "VideoEncodeError",
]
