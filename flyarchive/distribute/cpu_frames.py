"""What one OpenGL segment task renders, frame by frame: every output of a world's frames,
or the tiled frames of a mosaic, with overlays burnt in (:mod:`flyarchive.replay.compose`).

A frame whose state holds NaN or infinity is black, and its maps say "nothing there"
(depth 0, segmentation 0), as on the Warp backends.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from flyarchive.replay.outputs import depth_to_counts, ids_to_counts, map_outputs
from flyarchive.replay.compose import burn_text, tile_frames
from flyarchive.schema import finite_frames

__all__ = ["States", "world_frames", "mosaic_frames"]

#: One world's states over a range of frames: qpos ``(n, nq)``, mocap poses or None.
States = tuple[np.ndarray, "np.ndarray | None", "np.ndarray | None"]


def world_frames(renderer: Any, states: States, outputs: Sequence[str], depth_scale: float,
                 texts: Sequence[str] | None = None
                 ) -> Iterator[tuple[np.ndarray | None, dict[str, np.ndarray]]]:
    """Render a world's frames one at a time (memory: one frame).

    Args:
        renderer: A :class:`~flyarchive.replay.opengl.CpuRenderer` making ``outputs``.
        states: The frames' states.
        outputs: What to make.
        depth_scale: Model units per depth count.
        texts: One overlay text per frame, or None.

    Yields:
        ``(rgb, maps)`` per frame: ``(n_cameras, H, W, 3)`` uint8 (None without RGB) and
        ``{name: (n_cameras, H, W) uint16 counts}`` for each map output.
    """
    qpos, mocap_pos, mocap_quat = states
    valid = finite_frames(qpos, mocap_pos, mocap_quat)
    maps = map_outputs(outputs)
    ncam, (height, width) = len(renderer.cameras), renderer.size
    for k in range(len(qpos)):
        rgb, counts = None, {}
        if not valid[k]:
            rgb = np.zeros((ncam, height, width, 3), np.uint8) if "rgb" in outputs else None
            counts = {n: np.zeros((ncam, height, width), np.uint16) for n in maps}
        else:
            pose = (qpos[k], None if mocap_pos is None else mocap_pos[k],
                    None if mocap_quat is None else mocap_quat[k])
            if maps:
                made = renderer.render_outputs(*pose)
                rgb = made.get("rgb")
                counts = {n: depth_to_counts(made[n], depth_scale) if n == "depth"
                          else ids_to_counts(made[n]) for n in maps}
            else:
                rgb = renderer.render_frame(*pose)
            if texts is not None and rgb is not None:
                for image in rgb:
                    burn_text(image, texts[k])
        yield rgb, counts


def mosaic_frames(renderer: Any, tiles: Sequence[States | None], n_frames: int,
                  mosaic: tuple[int, int], texts: Sequence[Sequence[str] | None]
                  ) -> Iterator[np.ndarray]:
    """Render the mosaic frames of a segment one at a time.

    Args:
        renderer: An RGB :class:`~flyarchive.replay.opengl.CpuRenderer` at the tile size.
        tiles: Per tile, its world's states from the segment's first frame on (fewer
            than ``n_frames`` when the world's recording ends earlier), or None (blank).
        n_frames: Frames of the segment.
        mosaic: ``(rows, cols)``.
        texts: Per tile, one label text per frame of its states, or None.

    Yields:
        ``(n_cameras, rows * H, cols * W, 3)`` uint8 per frame; blank tiles black.
    """
    ncam, (height, width) = len(renderer.cameras), renderer.size
    valid = [None if t is None else finite_frames(*t) for t in tiles]
    for k in range(n_frames):
        images = np.zeros((len(tiles), ncam, height, width, 3), np.uint8)
        for t, states in enumerate(tiles):
            if states is None or k >= len(states[0]) or not valid[t][k]:  # type: ignore[index]
                continue
            qpos, mocap_pos, mocap_quat = states
            renderer.render_frame(qpos[k], None if mocap_pos is None else mocap_pos[k],
                                  None if mocap_quat is None else mocap_quat[k], out=images[t])
            if texts[t] is not None:
                for image in images[t]:
                    burn_text(image, texts[t][k])  # type: ignore[index]
        yield np.stack([tile_frames(images[:, c], *mosaic) for c in range(ncam)])
