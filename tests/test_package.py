"""The package's import surface."""

import subprocess
import sys

import pytest


@pytest.mark.subprocess
def test_import_flyarchive_imports_no_warp_dask_or_s3fs():
    code = ("import sys, flyarchive; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'warp', 'mujoco_warp', 'dask', 'distributed', 's3fs', 'flygym'}))")

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert out.stdout.strip() == "[]"


@pytest.mark.subprocess
def test_the_models_package_imports_its_base_alone_and_its_other_floors_in_any_order():
    code = (
        "import sys, json\n"
        "import flyarchive.models as models\n"
        "eager = sorted({m.split('.')[0] for m in sys.modules} & {'zarr', 'xarray', 'dask', "
        "'distributed', 'fsspec', 's3fs', 'warp'})\n"
        "ours = sorted(m for m in sys.modules if m.startswith('flyarchive.') and "
        "not m.startswith(('flyarchive.models', 'flyarchive.errors', 'flyarchive.layout', "
        "'flyarchive.lru')))\n"
        "models.load_kept_model\n"  # its store-floor module before the store: no import cycle
        "import flyarchive.models.shipping\n"
        "print(json.dumps([eager, ours, 'flyarchive.store' in sys.modules]))\n"
    )

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)

    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '[[], [], true]'


def test_public_api_is_reexported_lazily():
    import flyarchive

    assert callable(flyarchive.render_videos)
    assert callable(flyarchive.open_archive)
    assert flyarchive.TrajectoryRecorder.__name__ == "TrajectoryRecorder"
    assert issubclass(flyarchive.ArchiveExistsError, FileExistsError)


def test_verify_stays_a_function_after_its_module_is_imported():
    import flyarchive
    import flyarchive.store.integrity  # noqa: F401

    assert flyarchive.verify is flyarchive.store.integrity.verify
