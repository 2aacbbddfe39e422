"""The MuJoCo models flyarchive records with, keeps beside archives and replays: one home.

Two ways to load one, named for the trust they give:

- :func:`load_model_file` ``(path)``: a model file you trust (MJCF ``.xml``, spec zip
  ``.mjz``, compiled ``.mjb``), loaded in this process;
- :func:`load_kept_model` ``(url)``: the model an archive keeps, untrusted input (anyone
  may write an archive, and MuJoCo's loader is not memory-safe on crafted files): its
  bytes checked against their name, then loaded (or compiled) first in a short-lived child
  process, the verdict kept by hash in a private cache folder.

A model takes two forms: its MJB (exact, bound to the MuJoCo release that wrote it; how it
travels to workers) and its portable form (its MJCF and every file it references in one
spec zip, compiled by any release; its hash is the model's identity). An archive keeps
both beside it, by content (:func:`attach_model` adds the portable form later).

The modules, each with its floor in the package order (tests/test_layout_rules.py checks
it): the base floor (this ``__init__`` imports from these alone, and re-exports their
public names)

- :mod:`flyarchive.models.mjb`: the MJB: written, read in memory, its header checked;
- :mod:`flyarchive.models.cameras`: a compiled model's cameras, by name;
- :mod:`flyarchive.models.files`: model files you trust (:func:`load_model_file`);
- :mod:`flyarchive.models.portable`: the portable form, made and compiled;
- :mod:`flyarchive.models.spec_zip`: spec zips, written deterministically and read with
  bounds (standard library only);
- :mod:`flyarchive.models.entries`: how an archive's attributes name its kept models, and
  the model's identity;
- :mod:`flyarchive.models.cache`: the one cache of models loaded from MJB bytes in a
  process;
- :mod:`flyarchive.models.check`: a kept model loaded (or compiled) first in a child
  process (the script :mod:`flyarchive.models.child`), the verdicts and compiled models
  kept in the private cache folder;

the store's floor (loaded on first use: :func:`load_kept_model`, :func:`attach_model`)

- :mod:`flyarchive.models.kept`: the kept forms in an archive, read, written, attached
  and loaded through the store's hardened zarr store;

and the analysis's floor

- :mod:`flyarchive.models.shipping`: a model's MJB sent to Dask workers once per client,
  loaded once per worker process.

Old names that still work, with a ``DeprecationWarning``: ``load_model``
(:func:`load_model_file`).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from flyarchive.models.cache import bytes_sha256, keep_loaded, model_from_bytes
from flyarchive.models.cameras import camera_ids, camera_names
from flyarchive.models.entries import MODEL_ATTR, PORTABLE_MODEL_ATTR, SPEC_ZIP_FORMAT, model_identity
from flyarchive.models.files import load_model_file
from flyarchive.models.mjb import (
    MJB_ID,
    check_data,
    check_mjb,
    load_mjb,
    mjb_version,
    model_bytes,
    mujoco_release,
    save_mjb,
)
from flyarchive.models.portable import PortableModel, compile_spec_zip, portable_model

#: Names loaded on first use, by module: they are of a floor above the base.
_LAZY = {
    "load_kept_model": "flyarchive.models.kept",
    "attach_model": "flyarchive.models.kept",
}

__all__ = ["load_model_file", "load_kept_model", "attach_model", "save_mjb", "model_bytes",
           "model_from_bytes", "bytes_sha256", "keep_loaded", "load_mjb", "check_mjb",
           "check_data", "mjb_version",
           "camera_names", "camera_ids", "MJB_ID", "MODEL_ATTR", "PORTABLE_MODEL_ATTR",
           "model_identity", "PortableModel", "portable_model", "compile_spec_zip",
           "mujoco_release", "SPEC_ZIP_FORMAT"]

#: Old names, kept working with a DeprecationWarning: old name -> (name, since, why).
_DEPRECATED = {
    "load_model": ("load_model_file", "0.2", "a model file you trust, loaded in this process; "
                   "the model an archive keeps is load_kept_model(url)"),
}


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        new, since, why = _DEPRECATED[name]
        warnings.warn(f"flyarchive.models.{name} is flyarchive.models.{new} since flyarchive "
                      f"{since} ({why}); {name} will be removed.", DeprecationWarning,
                      stacklevel=2)
        return globals()[new] if new in globals() else __getattr__(new)
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'flyarchive.models' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
