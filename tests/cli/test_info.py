"""``flyarchive info``: world ids as they are, the codec with what a reader needs, world
variables with their types."""

import json

import pytest

from flyarchive.store.world_vars import add_world_vars
from flyarchive.summary import describe_codec_line, format_ids
from flyarchive.testing.fixtures import record


def info_lines(cli, url):
    code, out, err = cli("info", url)
    assert code == 0, err
    return dict(line.split(None, 1) for line in out.splitlines())


@pytest.mark.parametrize(("ids", "expected"), [
    ([0, 3], "0, 3"),
    ([*range(512), 1024], "0..511, 1024"),
    ([4, 5], "4, 5"),
    ([7], "7"),
    ([9, 1, 2, 3], "9, 1..3"),
    ([], ""),
])
def test_world_ids_are_listed_with_ranges_where_contiguous(ids, expected):
    assert format_ids(ids) == expected


def test_info_lists_world_ids_that_are_not_contiguous(cli, tiny, tmp_path):
    url = record(tiny, str(tmp_path / "run.zarr"), world_ids=[0, 3], n_steps=8)

    lines = info_lines(cli, url)

    assert lines["world_ids"] == "0, 3"


def test_info_json_gives_world_ids_as_a_list(cli, tiny, tmp_path):
    url = record(tiny, str(tmp_path / "run.zarr"), world_ids=[0, 3], n_steps=8)

    code, out, _ = cli("info", url, "--json")

    assert code == 0
    assert json.loads(out)["world_ids"] == [0, 3]


@pytest.mark.parametrize(("codec", "fragment"), [
    ("lossless", "lossless: pcodec, crc32c (readers need numcodecs[pcodec])"),
    ("portable", "portable: blosc-zstd, crc32c (portable: zarr v3 core codecs only"),
    ("abs:1e-6", "abs:1e-6: pcodec, crc32c, max error 1e-06 (readers need numcodecs[pcodec])"),
])
def test_info_codec_line_names_what_a_reader_needs(cli, tiny, tmp_path, codec, fragment):
    url = record(tiny, str(tmp_path / "run.zarr"), n_steps=8, codec=codec)

    lines = info_lines(cli, url)

    assert lines["codec"].startswith(fragment)


def test_info_json_keeps_the_codec_spec_and_adds_what_a_reader_needs(cli, tiny, tmp_path):
    url = record(tiny, str(tmp_path / "run.zarr"), n_steps=8, codec="portable")

    info = json.loads(cli("info", url, "--json")[1])

    assert info["codec"] == "portable"
    assert "any zarr v3 reader" in info["reader_needs"]


def test_info_shows_world_variables_with_their_types(cli, tiny, tmp_path):
    url = record(tiny, str(tmp_path / "run.zarr"), n_steps=8)
    add_world_vars(url, {"genotype": ["wt", "mutA"], "success": [1, 0]})

    lines = info_lines(cli, url)
    info = json.loads(cli("info", url, "--json")[1])

    assert lines["world_vars"] == "genotype (text), success (int64)"
    assert info["world_vars"] == ["genotype", "success"]
    assert info["world_var_types"] == {"genotype": "text", "success": "int64"}


def test_the_codec_line_of_an_unknown_spec_is_refused():
    from flyarchive.errors import CodecSpecError

    with pytest.raises(CodecSpecError, match="Unknown codec 'zip'"):
        describe_codec_line("zip")
