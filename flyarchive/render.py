"""Kept for code written against ``flyarchive.render``: the replay entry points now live
in :mod:`flyarchive.distribute.api` and are re-exported by ``flyarchive`` itself
(``from flyarchive import RenderOptions, render_videos``)."""

from flyarchive.distribute.api import (  # noqa: F401
    BACKENDS,
    RenderOptions,
    RenderResult,
    VideoJob,
    default_video_options,
    render_frames,
    render_videos,
    select_frames,
)

__all__ = ["RenderOptions", "RenderResult", "render_videos", "render_frames",
           "default_video_options", "select_frames", "VideoJob", "BACKENDS"]
