"""``flyarchive plot`` and :func:`flyarchive.plot.plot_traces`: where the picture goes, and
labels drawn as they are."""

import mujoco

from flyarchive.plot import plot_traces
from flyarchive.testing import TWO_HINGES_XML
from flyarchive.testing.fixtures import record


def test_plot_draws_a_mathtext_like_dof_label_as_plain_text(tmp_path):
    name = r"$\notacommand{$"
    model = mujoco.MjModel.from_xml_string(TWO_HINGES_XML.format(name=name))
    url = record(model, str(tmp_path / "math.zarr"), n_worlds=1)

    written = plot_traces(url, 0, tmp_path / "p.png", dofs=[name])

    assert written == tmp_path / "p.png"
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_long_dof_names_and_the_axis_label_are_inside_the_picture(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    from PIL import Image

    name = "nmf/lf_coxa-pitch_" + "x" * 60  # longer than the axes are wide
    model = mujoco.MjModel.from_xml_string(TWO_HINGES_XML.format(name=name))
    url = record(model, str(tmp_path / "long.zarr"), n_worlds=1)
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # kept, to measure what it drew

    written = plot_traces(url, 0, tmp_path / "p.png", dofs=[name, "joint0"])

    fig = figures[0]
    drawn = fig.get_tightbbox(fig.canvas.get_renderer())  # every artist, inches
    width, height = Image.open(written).size
    assert width >= drawn.width * fig.dpi - 2 and height >= drawn.height * fig.dpi - 2
    assert fig.axes[0].get_ylabel() == "qpos (rad)"  # hinges only


def test_plot_into_a_folder_writes_inside_it_and_reports_that_path(tiny, tmp_path, cli):
    url = record(tiny, str(tmp_path / "run.zarr"))
    folder = tmp_path / "work"
    folder.mkdir()

    code, out, _ = cli("plot", url, "--world", "1", "--out", folder)

    assert code == 0
    assert out.strip() == f"wrote {folder / 'world00001.png'}"
    assert (folder / "world00001.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_to_a_name_without_suffix_reports_the_png_it_wrote(tiny, tmp_path, cli):
    url = record(tiny, str(tmp_path / "run.zarr"))

    code, out, _ = cli("plot", url, "--world", "0", "--out", tmp_path / "traces")

    assert code == 0
    assert out.strip() == f"wrote {tmp_path / 'traces.png'}"
    assert (tmp_path / "traces.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_to_a_url_is_refused_and_writes_nothing_here(tiny, tmp_path, cli, monkeypatch):
    """--out s3://lab/traces.png wrote ./s3:/lab/traces.png and said it wrote s3:/lab/..."""
    url = record(tiny, str(tmp_path / "run.zarr"))
    monkeypatch.chdir(tmp_path)

    code, _, err = cli("plot", url, "--world", "0", "--out", "s3://lab/traces.png")

    assert code == 2 and "'s3://lab/traces.png' is a URL. Write it to a local path" in err
    assert not (tmp_path / "s3:").exists()


def test_plot_refuses_to_replace_an_image_unasked(tiny, tmp_path, cli):
    url = record(tiny, str(tmp_path / "run.zarr"))
    mine = tmp_path / "traces.png"
    mine.write_bytes(b"my figure")

    code, _, err = cli("plot", url, "--world", "0", "--out", mine)

    assert code == 2 and f"'{mine}' exists" in err and "--overwrite" in err
    assert mine.read_bytes() == b"my figure"


def test_plot_with_overwrite_replaces_the_image_whole_with_a_new_files_permissions(
        tiny, tmp_path, cli):
    import os
    import stat

    url = record(tiny, str(tmp_path / "run.zarr"))
    mine = tmp_path / "traces.png"
    mine.write_bytes(b"my figure")
    os.chmod(mine, 0o600)
    old = os.umask(0o027)
    try:
        code, out, _ = cli("plot", url, "--world", "0", "--out", mine, "--overwrite")
    finally:
        os.umask(old)

    assert code == 0 and out.strip() == f"wrote {mine}"
    assert mine.read_bytes()[:4] == b"\x89PNG"
    assert stat.S_IMODE(mine.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.zarr", "traces.png"]


def test_the_y_label_names_the_units_of_the_chosen_dofs(tiny, tmp_path, monkeypatch):
    """A free joint's position was labelled unitless (its dof labels are not joint names)."""
    import matplotlib.pyplot as plt

    url = record(tiny, str(tmp_path / "tiny.zarr"), n_worlds=1)
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)

    plot_traces(url, 0, tmp_path / "p.png", dofs=["root/x", "shoulder", "wrist/qw", "slider"])

    assert figures[0].axes[0].get_ylabel() == "qpos (model unit, rad, 1)"
