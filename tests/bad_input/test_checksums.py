"""Metadata cannot switch checksums off: every variant of flyarchive.testing.checksums (an
array's consolidated copy or its own zarr.json without its CRC-32C stage, or decoding
otherwise than the other) is refused by every read path, locally and on S3, with an
error naming the array and the fix, and nothing is changed.

A plain run reads each variant locally with one reader (the readers taking turns, so each
reads variants of every kind) and on S3 one variant of each kind; ``--run-sweeps`` reads
every variant with every reader, locally and on S3."""

import uuid

import pytest

from flyarchive.errors import CorruptArchiveError, SchemaError
from flyarchive.testing.checksums import (
    READERS,
    VARIANTS,
    make_sound,
    make_variant,
    names,
    read_with,
    upload,
)
from flyarchive.testing.fixtures import listing_snapshot, snapshot

BUCKET = "flyarchive-test"  # created by the s3_server fixture
pytestmark = pytest.mark.timeout(120)
#: (variant, reader) locally: variant i read by reader i mod 5 in a plain run, the rest sweeps.
LOCAL_CASES = [pytest.param(name, reader, marks=() if reader == READERS[i % len(READERS)]
                            else pytest.mark.sweep)
               for i, name in enumerate(VARIANTS) for reader in READERS]
#: One variant of each kind read on S3 in a plain run (checksum stage dropped from a copy,
#: from an array's own zarr.json, from both; decoding otherwise; portable; lossy scale).
S3_KINDS = ("copy: qpos chunks without crc32c", "own: qpos chunks without crc32c",
            "both: qpos chunks without crc32c", "copy: qpos float32", "copy: world big-endian",
            "copy: portable qpos without crc32c", "own: portable qpos without crc32c",
            "copy: abs:1e-6 qpos scale doubled")
S3_CASES = [pytest.param(name, marks=() if name in S3_KINDS else pytest.mark.sweep)
            for name in VARIANTS]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("checksums")


@pytest.fixture(scope="module")
def variant_url(workdir):
    """``variant_url(name)``: a local copy of the sound archive with variant ``name``
    applied (made once per module: reading changes nothing, which every test checks)."""
    made = {}

    def make(name):
        if name not in made:
            sound = make_sound(workdir, VARIANTS[name].codec)
            made[name] = make_variant(sound, name, workdir / f"v{len(made)}.zarr")
        return made[name]

    return make


@pytest.fixture
def s3_fs(s3_server):
    import s3fs

    return s3fs.S3FileSystem(**s3_server.storage_options())


def s3_prefix_snapshot(fs, url):
    """Every object under ``url``: key -> (ETag: the MD5 of its bytes, size, time)."""
    return listing_snapshot(fs, url.removeprefix("s3://"))


@pytest.fixture(scope="module")
def s3_variant_url(variant_url, s3_server):
    """``s3_variant_url(name)``: :func:`variant_url` uploaded to the shared bucket, once per
    module (reading changes nothing, which the tests of every reader check)."""
    made = {}

    def upload_once(name):
        if name not in made:
            made[name] = upload(variant_url(name), f"s3://{BUCKET}/{uuid.uuid4().hex}.zarr",
                                s3_server.storage_options())
        return made[name]

    return upload_once


# ----------------------------------------------------------------------------- controls
@pytest.mark.parametrize("codec", ["lossless", "portable", "abs:1e-6"])
def test_the_sound_archives_pass_every_read_path(workdir, codec):
    url = make_sound(workdir, codec)

    outcomes = {reader: read_with(reader, url) for reader in READERS}

    assert all(o.accepted for o in outcomes.values()), outcomes


def test_a_flipped_byte_under_sound_metadata_on_s3_is_a_corrupt_archive_error(
        workdir, tmp_path, s3_server):
    from flyarchive import open_archive
    from flyarchive.testing import flip_bits, shard_file

    local = tmp_path / "flipped.zarr"
    __import__("shutil").copytree(make_sound(workdir), local)
    flip_bits(shard_file(str(local), "qpos"))
    url = upload(str(local), f"s3://{BUCKET}/{uuid.uuid4().hex}.zarr",
                 s3_server.storage_options())

    with pytest.raises(CorruptArchiveError, match="CRC-32C"):
        open_archive(url, s3_server.storage_options()).qpos.values


# ----------------------------------------------------------------------------- every variant
@pytest.mark.parametrize(("name", "reader"), LOCAL_CASES)
def test_a_local_variant_is_refused(variant_url, name, reader):
    url = variant_url(name)
    before = snapshot(url)

    outcome = read_with(reader, url)

    assert not outcome.accepted
    assert names(VARIANTS[name], outcome.error), outcome.error
    assert "flyarchive verify" in outcome.error or reader == "verify"
    assert snapshot(url) == before


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", S3_CASES)
def test_an_s3_variant_is_refused_by_every_reader(s3_variant_url, name, s3_server, s3_fs):
    options = s3_server.storage_options()
    url = s3_variant_url(name)
    before = s3_prefix_snapshot(s3_fs, url)

    outcomes = {reader: read_with(reader, url, options) for reader in READERS
                if reader != "verify"}  # verify on S3: below (it reads every chunk, slowly)

    assert not [r for r, o in outcomes.items() if o.accepted]
    assert all(names(VARIANTS[name], o.error) for o in outcomes.values()), outcomes
    assert s3_prefix_snapshot(s3_fs, url) == before


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["copy: qpos chunks without crc32c", "own: n_frames without crc32c"])
def test_verify_on_s3_reports_a_variant(s3_variant_url, name, s3_server):
    options = s3_server.storage_options()
    url = s3_variant_url(name)

    outcome = read_with("verify", url, options)

    assert not outcome.accepted
    assert names(VARIANTS[name], outcome.error), outcome.error


# ----------------------------------------------------------------------------- messages
def test_a_copy_without_crc32c_on_s3_names_the_copy_the_array_and_the_fix(
        s3_variant_url, s3_server):
    from flyarchive import open_archive

    options = s3_server.storage_options()
    url = s3_variant_url("copy: qpos chunks without crc32c")

    with pytest.raises(SchemaError) as err:
        open_archive(url, options)

    message = str(err.value)
    assert f"{url}/zarr.json (the consolidated metadata of 'qpos'): the pipeline " \
           "['numcodecs.pcodec'] does not end in one crc32c stage" in message
    assert f"run `flyarchive verify {url}`" in message
    assert "restore the file from a backup" in message


def test_an_own_zarr_json_without_crc32c_on_s3_is_found_beside_the_coordinates(
        s3_variant_url, s3_server):
    from flyarchive.store.dataset import open_header

    options = s3_server.storage_options()
    url = s3_variant_url("own: qpos chunks without crc32c")

    with pytest.raises(SchemaError, match=f"{url}/qpos/zarr.json: the pipeline "
                       r"\['numcodecs.pcodec'\] does not end in one crc32c stage"):
        open_header(url, options)


def test_a_copy_decoding_otherwise_says_what_differs_in_both_files(s3_variant_url, s3_server):
    from flyarchive.store import StateReader

    options = s3_server.storage_options()
    url = s3_variant_url("copy: qpos float32")

    with pytest.raises(SchemaError) as err:
        StateReader(url, options)

    assert str(err.value).startswith(
        f"The metadata of 'qpos' disagrees with itself: its consolidated copy in {url}/zarr.json "
        f"and its own {url}/qpos/zarr.json differ in data type (\"float32\" in the copy, "
        "\"float64\" in its own).")
    assert "restore both files from a backup" in str(err.value)


def test_a_big_endian_copy_of_world_ids_on_s3_is_not_what_flyarchive_writes(s3_variant_url,
                                                                          s3_server):
    from flyarchive.store.dataset import open_header

    options = s3_server.storage_options()
    url = s3_variant_url("copy: world big-endian")

    with pytest.raises(SchemaError, match="the consolidated metadata of 'world'.*is not the one "
                       r"flyarchive writes for 'world' \(bytes, little-endian, then crc32c\)"):
        open_header(url, options)


# ----------------------------------------------------------------------------- the CLI
def test_flyarchive_info_on_s3_refuses_a_copy_without_crc32c(s3_variant_url, s3_server, cli):
    import json

    options = s3_server.storage_options()
    url = s3_variant_url("copy: n_frames without crc32c")

    code, out, err = cli("info", url, "--storage-options", json.dumps(options))

    assert code == 2
    assert out == ""
    assert "(the consolidated metadata of 'n_frames'): the pipeline ['bytes'] does not end in " \
           "one crc32c stage" in err


def test_flyarchive_render_refuses_a_copy_decoding_otherwise_before_rendering(
        variant_url, cli, tmp_path, model_xml):
    url = variant_url("copy: portable qpos transpose (0, 1, 2)")
    before = snapshot(url)

    code, _, err = cli("render", url, "--model", model_xml, "--camera", "front", "--size",
                       "48x64", "--out", tmp_path / "videos", "--workers", "0", "--quiet")

    assert code == 2
    assert "(the consolidated metadata of 'qpos'): the transpose order [0, 1, 2] is not the " \
           "one flyarchive writes ([0, 2, 1]: time last)" in err
    assert not (tmp_path / "videos").exists()
    assert snapshot(url) == before
