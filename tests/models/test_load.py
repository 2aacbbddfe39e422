"""The two ways to load a model, named for the trust they give: ``load_kept_model`` (the
model an archive keeps: untrusted, checked in a child process first) and
``load_model_file`` (a file you trust); and their old names, which still work with a
DeprecationWarning that names the new ones. The check itself: tests/models/test_check.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import flyarchive
import flyarchive.models
from flyarchive.errors import ArchiveNotFoundError, ModelLoadError
from flyarchive.models import load_kept_model, load_model_file, model_bytes, save_mjb
from flyarchive.testing import TINY_XML
from flyarchive.testing.fixtures import record

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny archive, recorded once: tests only read it."""
    from flyarchive.testing import tiny_model

    return record(tiny_model(), str(tmp_path_factory.mktemp("model-load") / "run.zarr"))


@pytest.fixture(params=[".xml", ".mjb"])
def model_file(request: pytest.FixtureRequest, tiny, tmp_path: Path) -> Path:
    """The tiny model as an MJCF file, or as an MJB."""
    path = tmp_path / f"tiny{request.param}"
    if request.param == ".xml":
        path.write_text(TINY_XML)
    else:
        save_mjb(tiny, path)
    return path


# ----------------------------------------------------------------------------- load_kept_model
def test_load_kept_model_is_the_model_the_archive_was_recorded_with(tiny, archive):
    model = flyarchive.load_kept_model(archive)

    assert model_bytes(model) == model_bytes(tiny)


def test_load_kept_model_of_an_archive_on_s3_is_its_kept_model(tiny, s3_location):
    record(tiny, s3_location.url, storage_options=s3_location.storage_options)

    model = load_kept_model(s3_location.url, s3_location.storage_options)

    assert model_bytes(model) == model_bytes(tiny)


def test_load_kept_model_takes_a_path_object_and_a_file_url(tiny, archive):
    by_path = load_kept_model(Path(archive))
    by_url = load_kept_model(f"file://{archive}")

    assert model_bytes(by_path) == model_bytes(by_url) == model_bytes(tiny)


def test_load_kept_model_of_an_archive_that_keeps_none_asks_for_one(tiny, tmp_path):
    url = record(tiny, str(tmp_path / "bare.zarr"), store_model=False)

    with pytest.raises(ModelLoadError, match="keeps no model .*store_model=False"):
        load_kept_model(url)


def test_load_kept_model_of_nothing_is_archive_not_found(tmp_path):
    with pytest.raises(ArchiveNotFoundError):
        load_kept_model(str(tmp_path / "missing.zarr"))


def test_load_kept_model_of_a_model_file_names_load_model_file(model_file):
    with pytest.raises(ModelLoadError, match=r"is a file, not an archive\. Load a model file you "
                                             r"trust with flyarchive\.load_model_file\("):
        load_kept_model(str(model_file))


# ----------------------------------------------------------------------------- load_model_file
def test_load_model_file_loads_an_mjcf_file_or_an_mjb(tiny, model_file):
    model = load_model_file(model_file)

    assert model.nq == tiny.nq and model.nmocap == tiny.nmocap


def test_load_model_file_of_nothing_names_what_it_looked_for(tmp_path):
    with pytest.raises(ModelLoadError, match="No model file at .*missing.mjb"):
        load_model_file(tmp_path / "missing.mjb")


def test_load_model_file_of_an_archive_names_load_kept_model(archive):
    with pytest.raises(ModelLoadError, match=r"It is an archive: load the model it keeps with "
                                             r"flyarchive\.load_kept_model\("):
        load_model_file(archive)


def test_both_are_public_in_flyarchive_and_its_models_package():
    assert flyarchive.load_kept_model is flyarchive.models.load_kept_model is load_kept_model
    assert flyarchive.load_model_file is flyarchive.models.load_model_file is load_model_file
    assert {"load_kept_model", "load_model_file"} <= set(flyarchive.__all__)
    assert {"load_kept_model", "load_model_file"} <= set(flyarchive.models.__all__)


# ----------------------------------------------------------------------------- the old names
def test_flyarchive_load_model_warns_and_still_loads_an_archive_and_a_file(tiny, archive,
                                                                           model_file):
    with pytest.warns(DeprecationWarning, match=r"load_kept_model\(url\).*load_model_file\(path\)"):
        old = flyarchive.load_model

    assert model_bytes(old(archive)) == model_bytes(load_kept_model(archive))
    assert model_bytes(old(str(model_file))) == model_bytes(load_model_file(model_file))


def test_flyarchive_load_model_of_a_missing_file_still_names_it(tmp_path):
    with pytest.warns(DeprecationWarning):
        old = flyarchive.load_model

    with pytest.raises(ModelLoadError, match="No model file at"):
        old(str(tmp_path / "missing.mjb"))


def test_flyarchive_models_load_model_warns_and_is_load_model_file():
    with pytest.warns(DeprecationWarning, match=r"flyarchive\.models\.load_model is "
                                                r"flyarchive\.models\.load_model_file"):
        from flyarchive.models import load_model

    assert load_model is load_model_file


def test_the_old_names_are_not_in_all():
    assert "load_model" not in flyarchive.__all__
    assert "load_model" not in flyarchive.models.__all__
