"""The portable form of a kept model (a MuJoCo spec zip beside the archive's MJB): how it
is made, kept, compiled once per MuJoCo release, and what names the model.
Bad portable models: tests/bad_input/test_portable_model.py."""

from __future__ import annotations

import pytest

from flyarchive.models import MODEL_ATTR, PORTABLE_MODEL_ATTR, model_identity

A, B = "a" * 64, "b" * 64


# ----------------------------------------------------------------------------- identity
@pytest.mark.parametrize(("attrs", "expected"), [
    ({MODEL_ATTR: {"sha256": A, "size": 1}, PORTABLE_MODEL_ATTR: {"sha256": B, "size": 2}}, B),
    ({MODEL_ATTR: {"sha256": A, "size": 1}}, A),
    ({PORTABLE_MODEL_ATTR: {"sha256": B, "size": 2}}, B),
    ({}, None),
], ids=["both forms: the portable one", "an MJB only", "a portable form only", "no model"])
def test_the_model_identity_is_the_portable_form_when_kept_else_the_mjb(attrs, expected):
    actual = model_identity(attrs)

    assert actual == expected


@pytest.mark.parametrize("damaged", [{"sha256": "B" * 64}, {"sha256": 5}, "b" * 64, None])
def test_a_damaged_portable_entry_does_not_name_the_model(damaged):
    attrs = {MODEL_ATTR: {"sha256": A, "size": 1}, PORTABLE_MODEL_ATTR: damaged}

    actual = model_identity(attrs)

    assert actual == A
