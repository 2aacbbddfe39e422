"""Video: frames to H.264 mp4 files, segments joined without re-encoding, outputs named
and published to any fsspec URL, manifests, and decoding for checks.

- :mod:`~flyarchive.video.mp4`: H.264 mp4 through ffmpeg: :class:`VideoWriter`,
  :class:`VideoOptions`, :func:`concat_segments` (segments joined without re-encoding);
- :mod:`~flyarchive.video.outputs`: every output of a video, named
  (:func:`safe_video_path`), written together (:class:`OutputWriter`) and published
  (:func:`write_output`);
- :mod:`~flyarchive.video.manifest`: ``manifest.json`` beside the videos;
- :mod:`~flyarchive.video.maps`: depth and segmentation maps, lossless zarr arrays beside
  the videos;
- :mod:`~flyarchive.video.decode`: :func:`read_video`, :func:`read_depth`,
  :func:`read_segmentation`;
- :mod:`~flyarchive.video.mosaic`: many worlds tiled into one video per camera;
- :mod:`~flyarchive.video.overlay_text`: the text burnt into each frame, from the archive;
- :mod:`~flyarchive.video.workspace`: a render run's folders (parts, scratch), removed by
  the next run once their owner is dead;
- :mod:`~flyarchive.video.guard`: output folders guarded as archives are (links out,
  odd files).

Internal: the public names are re-exported by ``flyarchive``.
"""

from flyarchive.errors import FrameFormatError, VideoEncodeError
from flyarchive.replay.sizes import PIXEL_FORMATS, frame_shape
from flyarchive.video.decode import read_depth, read_segmentation, read_video
from flyarchive.video.mp4 import PRESETS, VideoOptions, VideoWriter, concat_segments, encode_segment
from flyarchive.video.outputs import safe_video_path, write_output

