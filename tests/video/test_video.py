"""Video encoding: streaming mp4 writer, segments joined without re-encoding, outputs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import fsspec
import imageio_ffmpeg
import numpy as np
import pytest

from flyarchive.errors import FrameSizeError, OutputExistsError, SelectionError
from flyarchive.video import (
    FrameFormatError,
    VideoEncodeError,
    VideoOptions,
    VideoWriter,
    concat_segments,
    encode_segment,
    frame_shape,
    read_video,
    safe_video_path,
    write_output,
)

SIZE = (48, 64)
FPS = 25.0


def moving_bar(n_frames: int, size: tuple[int, int] = SIZE) -> np.ndarray:
    """``(n, H, W, 3)`` uint8: a white vertical bar moving 2 px per frame on a gradient."""
    height, width = size
    frames = np.zeros((n_frames, height, width, 3), np.uint8)
    frames[..., 2] = np.linspace(0, 120, width, dtype=np.uint8)
    for k in range(n_frames):
        column = (2 * k) % (width - 4)
        frames[k, :, column : column + 4] = 255
    return frames


def bar_columns(frames: np.ndarray) -> np.ndarray:
    """Centre column of the brightest vertical bar in each frame, pixels."""
    profile = frames.astype(float).min(axis=3).mean(axis=1)  # white: all channels high
    return np.array([np.flatnonzero(p > 0.5 * p.max()).mean() for p in profile])


def first_frame_is_keyframe(path: Path) -> bool:
    result = subprocess.run(
        [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", str(path),
         "-vf", "showinfo", "-frames:v", "1", "-f", "null", "-"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return "iskey:1" in result.stderr and "type:I" in result.stderr


def test_writer_streams_frames_one_and_many_at_a_time(tmp_path: Path) -> None:
    frames = moving_bar(12)
    path = tmp_path / "out.mp4"

    with VideoWriter(path, FPS, SIZE) as writer:
        writer.write(frames[0])
        writer.write(frames[1:])
    decoded = read_video(path)

    assert writer.n_frames == 12
    assert decoded.shape == (12, *SIZE, 3)
    assert np.abs(decoded.astype(int) - frames).mean() < 3
    assert np.allclose(bar_columns(decoded), bar_columns(frames), atol=0.5)


def test_same_frames_and_options_give_identical_bytes(tmp_path: Path) -> None:
    frames = moving_bar(8)

    encode_segment([frames], tmp_path / "a.mp4", FPS, SIZE)
    encode_segment([frames], tmp_path / "b.mp4", FPS, SIZE)

    assert (tmp_path / "a.mp4").read_bytes() == (tmp_path / "b.mp4").read_bytes()


def test_higher_crf_gives_a_smaller_file(tmp_path: Path) -> None:
    frames = moving_bar(20)

    encode_segment([frames], tmp_path / "fine.mp4", FPS, SIZE, VideoOptions(crf=10))
    encode_segment([frames], tmp_path / "coarse.mp4", FPS, SIZE, VideoOptions(crf=40))

    assert (tmp_path / "coarse.mp4").stat().st_size < (tmp_path / "fine.mp4").stat().st_size


def test_segment_starts_on_a_keyframe(tmp_path: Path) -> None:
    path = tmp_path / "seg.mp4"

    encode_segment(iter(moving_bar(10)[3:]), path, FPS, SIZE)

    assert first_frame_is_keyframe(path)


def test_concat_of_segments_matches_one_shot_encoding(tmp_path: Path) -> None:
    frames = moving_bar(30)
    bounds = [(0, 11), (11, 20), (20, 30)]
    segments = [tmp_path / f"seg{i}.mp4" for i in range(3)]
    for (start, stop), path in zip(bounds, segments):
        encode_segment((f for f in frames[start:stop]), path, FPS, SIZE)
    encode_segment([frames], tmp_path / "one.mp4", FPS, SIZE)

    concat_segments(segments, tmp_path / "joined.mp4")
    joined = read_video(tmp_path / "joined.mp4")
    one_shot = read_video(tmp_path / "one.mp4")

    assert joined.shape == one_shot.shape == (30, *SIZE, 3)
    assert np.abs(joined.astype(int) - one_shot).mean() < 2
    assert np.allclose(bar_columns(joined), bar_columns(frames), atol=0.5)


@pytest.mark.parametrize("lengths", [(4, 1), (4, 4, 1), (1, 1, 1), (2, 3)])
def test_segments_of_any_length_join_and_decode_to_exactly_their_frames(tmp_path: Path,
                                                                        lengths) -> None:
    """A short segment after a long one: ffmpeg 9 (imageio-ffmpeg 0.8), converting to a
    constant rate, decoded the frame before the join two more times."""
    frames = moving_bar(sum(lengths))
    starts = np.cumsum((0, *lengths))
    segments = [tmp_path / f"seg{i}.mp4" for i in range(len(lengths))]
    for start, stop, path in zip(starts, starts[1:], segments):
        encode_segment([frames[start:stop]], path, FPS, SIZE)

    concat_segments(segments, tmp_path / "joined.mp4")
    joined = read_video(tmp_path / "joined.mp4")

    assert joined.shape == frames.shape
    assert np.allclose(bar_columns(joined), bar_columns(frames), atol=0.5)


@pytest.mark.parametrize("lengths", [(24, 2), (25, 1), (2, 24), (24, 24, 2), (10, 10, 6)])
def test_a_joined_video_says_its_frame_rate_and_duration(tmp_path: Path, lengths) -> None:
    """x264 starts a segment of a frame or two without the B-frame delay of the others:
    joined as they were, the decode times had a gap, and players read 23.2 frames/s for
    25 (a render's last segment of 2 frames)."""
    import imageio.v3 as iio

    rng = np.random.default_rng(1)
    frames = rng.integers(0, 255, (sum(lengths), *SIZE, 3), dtype=np.uint8)
    starts = np.cumsum((0, *lengths))
    segments = [tmp_path / f"seg{i}.mp4" for i in range(len(lengths))]
    for start, stop, path in zip(starts, starts[1:], segments):
        encode_segment([frames[start:stop]], path, FPS, SIZE)
    one_by_one = np.concatenate([read_video(p) for p in segments])

    concat_segments(segments, tmp_path / "joined.mp4")

    meta = iio.immeta(tmp_path / "joined.mp4")
    assert meta["fps"] == FPS and meta["duration"] == pytest.approx(sum(lengths) / FPS)
    assert np.array_equal(read_video(tmp_path / "joined.mp4"), one_by_one)


def test_concat_refuses_segments_of_different_sizes(tmp_path: Path) -> None:
    encode_segment([moving_bar(3)], tmp_path / "a.mp4", FPS, SIZE)
    encode_segment([moving_bar(3, (32, 64))], tmp_path / "b.mp4", FPS, (32, 64))

    with pytest.raises(VideoEncodeError, match="same size"):
        concat_segments([tmp_path / "a.mp4", tmp_path / "b.mp4"], tmp_path / "out.mp4")

    assert not (tmp_path / "out.mp4").exists()


def test_concat_refuses_an_existing_output(tmp_path: Path) -> None:
    encode_segment([moving_bar(3)], tmp_path / "a.mp4", FPS, SIZE)
    (tmp_path / "out.mp4").write_bytes(b"keep me")

    with pytest.raises(OutputExistsError, match="overwrite=True"):
        concat_segments([tmp_path / "a.mp4"], tmp_path / "out.mp4")

    assert (tmp_path / "out.mp4").read_bytes() == b"keep me"


@pytest.mark.parametrize(("size", "suggestion"), [((47, 64), "(48, 64)"), ((48, 65), "(48, 66)")])
def test_odd_size_is_refused_with_the_nearest_even_size(
    tmp_path: Path, size: tuple[int, int], suggestion: str
) -> None:
    with pytest.raises(FrameSizeError, match=rf"yuv420p needs even sizes.*{suggestion}"):
        VideoWriter(tmp_path / "odd.mp4", FPS, size)


def test_frames_of_another_size_are_refused(tmp_path: Path) -> None:
    with VideoWriter(tmp_path / "v.mp4", FPS, SIZE) as writer:
        writer.write(moving_bar(1))
        with pytest.raises(FrameSizeError, match=r"\(2, 48, 62, 3\)"):
            writer.write(moving_bar(2, (48, 62)))


def test_float_frames_are_refused(tmp_path: Path) -> None:
    with VideoWriter(tmp_path / "v.mp4", FPS, SIZE) as writer:
        writer.write(moving_bar(1))
        with pytest.raises(FrameFormatError, match="uint8"):
            writer.write(moving_bar(1).astype(np.float32))


def test_failed_block_removes_the_partial_video(tmp_path: Path) -> None:
    path = tmp_path / "partial.mp4"

    with pytest.raises(KeyError):
        with VideoWriter(path, FPS, SIZE) as writer:
            writer.write(moving_bar(3))
            raise KeyError("simulated failure while rendering")

    assert not path.exists()


def test_empty_video_is_refused(tmp_path: Path) -> None:
    with pytest.raises(VideoEncodeError, match="No frames"):
        encode_segment([], tmp_path / "empty.mp4", FPS, SIZE)

    assert not (tmp_path / "empty.mp4").exists()


def test_ffmpeg_failing_is_an_error_with_its_message(tmp_path: Path) -> None:
    path = tmp_path / "v.not-a-container"  # ffmpeg knows no muxer for it and exits

    with pytest.raises(VideoEncodeError, match=r"exited with status \d+: .*format"):
        writer = VideoWriter(path, FPS, SIZE)
        writer.write(moving_bar(3))
        writer.close()

    assert not path.exists()


def test_writer_refuses_a_folder_even_with_overwrite(tmp_path: Path) -> None:
    folder = tmp_path / "v.mp4"
    (folder / "keep").mkdir(parents=True)

    with pytest.raises(OutputExistsError, match="is a folder"):
        VideoWriter(folder, FPS, SIZE, overwrite=True)

    assert (folder / "keep").is_dir()


def test_ffmpeg_dying_mid_video_is_an_error_and_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "v.mp4"
    writer = VideoWriter(path, FPS, SIZE)
    writer.write(moving_bar(2))
    writer._process.kill()  # the encoder crashes
    writer._process.wait()

    with pytest.raises(VideoEncodeError, match="ffmpeg stopped while encoding"):
        writer.write(np.repeat(moving_bar(2), 200, axis=0))  # more than a pipe holds

    assert not path.exists()


def test_writer_refuses_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "v.mp4"
    path.write_bytes(b"keep me")

    with pytest.raises(OutputExistsError, match="overwrite=True"):
        VideoWriter(path, FPS, SIZE)

    assert path.read_bytes() == b"keep me"


def test_write_output_copies_to_a_new_local_folder(tmp_path: Path) -> None:
    source = tmp_path / "video.mp4"
    source.write_bytes(b"mp4 bytes")
    target = tmp_path / "out" / "world00000" / "front.mp4"

    write_output(source, str(target))

    assert target.read_bytes() == b"mp4 bytes"
    assert [p.name for p in target.parent.iterdir()] == ["front.mp4"]  # no staging left


def test_write_output_refuses_an_existing_output(tmp_path: Path) -> None:
    source = tmp_path / "video.mp4"
    source.write_bytes(b"new")
    target = tmp_path / "front.mp4"
    target.write_bytes(b"old")

    with pytest.raises(OutputExistsError, match="overwrite=True"):
        write_output(source, str(target))

    assert target.read_bytes() == b"old"


def test_write_output_overwrites_when_asked(tmp_path: Path) -> None:
    source = tmp_path / "video.mp4"
    source.write_bytes(b"new")
    target = tmp_path / "front.mp4"
    target.write_bytes(b"old")

    write_output(source, f"file://{target}", overwrite=True)

    assert target.read_bytes() == b"new"


def test_write_output_uploads_to_an_fsspec_url(tmp_path: Path) -> None:
    source = tmp_path / "video.mp4"
    source.write_bytes(b"mp4 bytes")
    url = "memory://flyarchive-test-video/world00003/top.mp4"

    write_output(source, url)

    with fsspec.open(url, "rb") as remote:
        assert remote.read() == b"mp4 bytes"
    with pytest.raises(OutputExistsError):
        write_output(source, url)


def test_safe_video_path_names_world_and_camera() -> None:
    assert safe_video_path("s3://bucket/videos/", 7, "front") == (
        "s3://bucket/videos/world00007/front.mp4"
    )


@pytest.mark.parametrize(
    "camera", ["../../etc", "/etc/passwd", "..", ".", "a/../../b", "x\x00y", ""]
)
def test_safe_video_path_keeps_camera_files_inside_the_world_folder(
    tmp_path: Path, camera: str
) -> None:
    folder = (tmp_path / "world00001").resolve()

    path = Path(safe_video_path(tmp_path, 1, camera)).resolve()

    assert path.parent == folder
    assert "\x00" not in str(path) and path.name.endswith(".mp4")


def test_safe_video_path_keeps_sanitized_names_apart() -> None:
    assert safe_video_path("out", 0, "a/b") != safe_video_path("out", 0, "a_b")


@pytest.mark.parametrize("world_id", [-1, 1.5, True])
def test_safe_video_path_refuses_a_bad_world_id(world_id: object) -> None:
    with pytest.raises(SelectionError, match="world_id"):
        safe_video_path("out", world_id, "front")  # type: ignore[arg-type]


def test_video_options_refuse_bad_values() -> None:
    with pytest.raises(ValueError, match="crf"):
        VideoOptions(crf=60)
    with pytest.raises(ValueError, match="preset"):
        VideoOptions(preset="quick")


def slider_columns(n_frames: int, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Pixel column of the block in frame k (8 + 4k) and the slider qpos that puts it there."""
    height, width = size
    focal = (height / 2) / np.tan(np.deg2rad(30))  # camera 'front': fovy 60, 3 m away
    columns = 8.0 + 4.0 * np.arange(n_frames)
    qpos = (columns - (width - 1) / 2) * 3.0 / focal
    return columns, qpos[:, None]


def test_decoded_frame_k_shows_the_block_where_qpos_k_puts_it(tmp_path: Path) -> None:
    from flyarchive.replay.opengl_frames import OpenGLRenderer
    from flyarchive.testing import slider_model

    size = (96, 128)
    expected, qpos = slider_columns(28, size)
    segments = [tmp_path / f"seg{i}.mp4" for i in range(3)]

    with OpenGLRenderer(slider_model(), "front", size) as renderer:
        for path, block in zip(segments, np.array_split(np.arange(28), 3)):
            views = (frame[0] for frame in renderer.iter_frames(qpos[block]))
            encode_segment(views, path, FPS, size)
    concat_segments(segments, tmp_path / "slider.mp4")
    actual = bar_columns(read_video(tmp_path / "slider.mp4"))

    assert actual.shape == expected.shape
    assert np.abs(actual - expected).max() <= 1.5  # frames are 4 px apart


def test_write_output_uploads_to_s3_and_refuses_to_replace_it(
    tmp_path: Path, s3_server: object
) -> None:
    source = tmp_path / "video.mp4"
    source.write_bytes(b"first")
    url = "s3://flyarchive-test/videos/world00002/front.mp4"
    options = s3_server.storage_options()  # type: ignore[attr-defined]
    fs = s3_server.filesystem()  # type: ignore[attr-defined]

    write_output(source, url, options)
    source.write_bytes(b"second")
    with pytest.raises(OutputExistsError, match=url):
        write_output(source, url, options)

    assert fs.cat_file(url) == b"first"


# -- yuv420p input ----------------------------------------------------------------


def test_yuv420p_frames_encode_like_the_same_rgb_frames(tmp_path: Path) -> None:
    from flyarchive.testing import rgb_to_i420

    frames = moving_bar(10)
    with VideoWriter(tmp_path / "rgb.mp4", FPS, SIZE) as writer:
        writer.write(frames)
    with VideoWriter(tmp_path / "yuv.mp4", FPS, SIZE, pixel_format="yuv420p") as writer:
        writer.write(rgb_to_i420(frames[:4]))  # a block, then single frames
        for frame in rgb_to_i420(frames[4:]):
            writer.write(frame)

    from_rgb, from_yuv = read_video(tmp_path / "rgb.mp4"), read_video(tmp_path / "yuv.mp4")
    assert from_yuv.shape == frames.shape
    np.testing.assert_allclose(bar_columns(from_yuv), bar_columns(frames), atol=0.5)
    assert np.abs(from_yuv.astype(int) - frames).mean() < 3
    assert np.abs(from_yuv.astype(int) - from_rgb).mean() < 2


def test_yuv420p_writer_takes_i420_frames_only(tmp_path: Path) -> None:
    assert frame_shape(SIZE, "yuv420p") == (72, 64)
    with VideoWriter(tmp_path / "v.mp4", FPS, SIZE, pixel_format="yuv420p") as writer:
        with pytest.raises(FrameSizeError, match=r"\(72, 64\)"):
            writer.write(moving_bar(1))  # RGB frames
        writer.write(np.full((72, 64), 128, np.uint8))
    with pytest.raises(ValueError, match="pixel_format"):
        VideoWriter(tmp_path / "w.mp4", FPS, SIZE, pixel_format="nv12")

