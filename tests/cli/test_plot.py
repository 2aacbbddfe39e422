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
