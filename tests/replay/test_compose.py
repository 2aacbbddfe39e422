"""Frames composed after rendering: 16-bit map counts, text burnt in, tiles joined into
mosaics; on the host (numpy, the OpenGL backend) and on the Warp device, alike."""

from __future__ import annotations

import numpy as np
import pytest

from flyarchive.errors import OptionsError, RenderOptionsError
from flyarchive.replay.mosaic_tiles import tile_frames
from flyarchive.replay.output_kinds import (
    counts_to_depth,
    counts_to_ids,
    depth_to_counts,
    ids_to_counts,
    parse_outputs,
)
from flyarchive.replay.overlay_text import CELL_H, CELL_W, GLYPHS, TEXT_X, TEXT_Y, burn_text, text_codes
from flyarchive.testing import reference_frames, rgb_to_i420, tiny_model
from flyarchive.testing.markers import WARP_DEVICE, requires_warp

SIZE = (48, 64)


def grey_frame() -> np.ndarray:
    return np.full((*SIZE, 3), 200, np.uint8)


# -- counts --------------------------------------------------------------------------


def test_depth_counts_round_to_the_nearest_multiple_of_the_scale():
    depth = np.array([0.26, 1.0, 1.24, np.nan, 0.01], np.float32)

    counts = depth_to_counts(depth, 0.5)

    np.testing.assert_array_equal(counts, [1, 2, 2, 0, 1])  # a hit is at least 1


def test_depth_counts_back_to_depth_are_within_half_a_scale_and_nan_at_no_hit():
    depth = np.random.default_rng(0).uniform(0.1, 40.0, 1000).astype(np.float32)
    depth[::7] = np.nan

    back = counts_to_depth(depth_to_counts(depth, 0.01), 0.01)

    np.testing.assert_array_equal(np.isnan(back), np.isnan(depth))
    assert np.nanmax(np.abs(back - depth)) <= 0.005 + 1e-6


def test_depths_beyond_the_last_count_saturate():
    counts = depth_to_counts(np.array([1e9], np.float32), 1.0)

    assert counts.tolist() == [65535]


def test_segmentation_counts_are_geom_id_plus_one_and_back():
    ids = np.array([-1, 0, 5, 700], np.int32)

    counts = ids_to_counts(ids)

    assert counts.tolist() == [0, 1, 6, 701]
    np.testing.assert_array_equal(counts_to_ids(counts), ids)


def test_outputs_are_returned_in_a_fixed_order_from_a_list_or_a_comma_string():
    assert parse_outputs("segmentation,rgb") == ("rgb", "segmentation")
    assert parse_outputs(["depth"]) == ("depth",)


@pytest.mark.parametrize(("outputs", "fragment"), [
    ("rgb,normals", "Unknown output 'normals'"),
    (("rgb", "rgb"), "at most once"),
    ((), "at least one"),
    (5, "must be a sequence of names"),
])
def test_outputs_that_are_not_known_names_are_refused(outputs, fragment):
    with pytest.raises(RenderOptionsError, match=fragment):
        parse_outputs(outputs)


# -- text ----------------------------------------------------------------------------


def test_every_printable_character_has_a_glyph_and_space_is_blank():
    drawn = [chr(c) for c in range(33, 127) if GLYPHS[c].any()]

    assert len(drawn) == 94
    assert not GLYPHS[ord(" ")].any() and not GLYPHS[:32].any()


def test_burnt_text_is_white_glyphs_on_a_box_darkened_to_half():
    frame = grey_frame()
    expected_box = (TEXT_Y, TEXT_Y + CELL_H, TEXT_X, TEXT_X + 3 * CELL_W)

    burn_text(frame, "w12")

    y0, y1, x0, x1 = expected_box
    box = frame[y0:y1, x0:x1]
    glyphs = np.hstack(GLYPHS[[ord("w"), ord("1"), ord("2")]]).astype(bool)
    assert (box[glyphs] == 255).all() and (box[~glyphs] == 100).all()
    outside = np.ones(SIZE, bool)
    outside[y0:y1, x0:x1] = False
    assert (frame[outside] == 200).all()


def test_text_past_the_frames_edge_stops_after_the_last_whole_character():
    frame = grey_frame()
    whole = (SIZE[1] - TEXT_X + 1) // CELL_W  # 10 characters of 64 pixels

    burn_text(frame, "x" * 40)  # 240 pixels across a frame 64 wide

    last = TEXT_X + (whole - 1) * CELL_W
    glyph = GLYPHS[ord("x"), :7, :5].astype(bool)
    assert (frame[TEXT_Y:TEXT_Y + 7, last:last + 5][glyph] == 255).all()  # drawn whole
    assert (frame[:, TEXT_X + whole * CELL_W:] == 200).all()  # no part of an 11th
    assert (frame[TEXT_Y + CELL_H:] == 200).all()


@pytest.mark.parametrize("size", [(8, 64), (48, 6), (2, 2)])
def test_frames_too_small_for_one_character_get_no_text(size):
    frame = np.full((*size, 3), 200, np.uint8)

    burn_text(frame, "w3 t=0.04s")

    assert (frame == 200).all()


def test_characters_outside_printable_ascii_show_as_question_marks():
    assert text_codes(["é\t"], 4).tolist() == [[ord("?"), ord("?"), 0, 0]]


# -- mosaic (host) ---------------------------------------------------------------------


def test_tile_t_of_a_mosaic_is_at_row_t_div_cols_and_column_t_mod_cols():
    tiles = np.stack([np.full((*SIZE, 3), t, np.uint8) for t in range(6)])

    mosaic = tile_frames(tiles, 2, 3)

    h, w = SIZE
    assert mosaic.shape == (2 * h, 3 * w, 3)
    for t in range(6):
        r, c = divmod(t, 3)
        assert (mosaic[r * h:(r + 1) * h, c * w:(c + 1) * w] == t).all()


# -- on the Warp device ------------------------------------------------------------------


@pytest.fixture(scope="module")
def states():
    frames = reference_frames(tiny_model(), 1, 40)
    return frames["qpos"][0][:8], frames["mocap_pos"][0][:8], frames["mocap_quat"][0][:8]


@pytest.fixture(scope="module")
def plain_rgb(states):
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    renderer = WarpBatchRenderer(tiny_model(), ["front", "top"], SIZE, batch_worlds=8,
                                 device=WARP_DEVICE)
    return renderer.render_batch(*states)


TEXTS = [f"w{k:05d} t={0.04 * k:.3f}s" for k in range(8)]


def host_text(frames: np.ndarray) -> np.ndarray:
    """``frames`` (8, n_cameras, H, W, 3) with TEXTS[k] burnt into every camera of state k."""
    frames = frames.copy()
    for k, text in enumerate(TEXTS):
        for camera in frames[k]:
            burn_text(camera, text)
    return frames


@requires_warp
def test_text_burnt_on_the_device_equals_text_burnt_on_the_host(states, plain_rgb):
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    renderer = WarpBatchRenderer(tiny_model(), ["front", "top"], SIZE, batch_worlds=8,
                                 device=WARP_DEVICE, text_chars=16)

    actual = renderer.render_outputs(*states, texts=TEXTS)["rgb"]

    np.testing.assert_array_equal(actual, host_text(plain_rgb))


@requires_warp
def test_a_device_mosaic_is_the_i420_of_the_host_tiling_with_blank_tiles_black(states,
                                                                              plain_rgb):
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    valid = np.array([1, 1, 1, 0, 1, 0, 1, 1], bool)
    tiles = host_text(plain_rgb)
    tiles[~valid] = 0
    expected = np.stack([
        np.stack([rgb_to_i420(tile_frames(tiles[4 * m:4 * m + 4, c], 2, 2)) for c in range(2)])
        for m in range(2)])
    renderer = WarpBatchRenderer(tiny_model(), ["front", "top"], SIZE, batch_worlds=8,
                                 device=WARP_DEVICE, mosaic=(2, 2), pixel_format="yuv420p",
                                 text_chars=16)

    actual = renderer.submit(*states, texts=TEXTS, valid=valid).wait()

    np.testing.assert_array_equal(actual, expected)


@requires_warp
@pytest.mark.parametrize(("options", "fragment"), [
    ({"mosaic": (2, 2), "pixel_format": "rgb24"}, "I420 RGB frames only"),
    ({"mosaic": (2, 2), "pixel_format": "yuv420p", "outputs": ("rgb", "depth")},
     "I420 RGB frames only"),
    ({"mosaic": (3, 3), "pixel_format": "yuv420p"}, "multiple of 9"),
    ({"mosaic": (0, 2), "pixel_format": "yuv420p"}, "two positive integers"),
    ({"outputs": ("depth",), "text_chars": 8}, "unless RGB is an output"),
])
def test_compositions_the_renderer_cannot_make_are_refused(options, fragment):
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    with pytest.raises(OptionsError, match=fragment):
        WarpBatchRenderer(tiny_model(), "front", SIZE, batch_worlds=8, device=WARP_DEVICE,
                          **options)


@requires_warp
def test_a_mosaic_batch_of_partial_mosaic_frames_is_refused(states):
    from flyarchive.errors import SelectionError
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    renderer = WarpBatchRenderer(tiny_model(), "front", SIZE, batch_worlds=8, device=WARP_DEVICE,
                                 mosaic=(2, 2), pixel_format="yuv420p")

    with pytest.raises(SelectionError, match="whole mosaic frames of 4 tiles"):
        renderer.submit(states[0][:6])
