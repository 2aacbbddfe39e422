"""flyarchive.store.storage_errors: storage faults become one clear StorageError, secrets hidden."""

import errno
import re

import pytest

from flyarchive.errors import StorageError
from flyarchive.store.storage_errors import check_storage_options, local_error, scrub, translate


def test_scrub_hides_secrets_at_any_depth():
    options = {"key": "AKIAEXAMPLE", "secret": "s3cr3t-value",
               "client_kwargs": {"aws_session_token": "tok-123456"}}

    text = scrub("AKIAEXAMPLE s3cr3t-value tok-123456 endpoint", options)

    assert text == "*** *** *** endpoint"


def test_a_permission_error_on_s3_names_the_url_and_hides_the_secret():
    options = {"secret": "hidden-value", "endpoint_url": "http://127.0.0.1:9"}
    err = PermissionError("Forbidden: signature for hidden-value")

    new = translate(err, "s3://lab/run.zarr", options)

    assert isinstance(new, StorageError)
    assert "Access to 's3://lab/run.zarr' was refused at http://127.0.0.1:9" in str(new)
    assert "hidden-value" not in str(new)


def test_errors_that_are_not_storage_faults_are_left_alone():
    assert translate(KeyError("qpos"), "s3://lab/run.zarr") is None
    assert translate(PermissionError("denied"), "/local/run.zarr") is None


def test_a_full_local_disk_says_so():
    err = OSError(errno.ENOSPC, "No space left on device")

    new = local_error("/data/world00003.npz", err)

    assert str(new) == ("Cannot write '/data/world00003.npz': No space left on device. "
                        "The disk is full: free some space or write elsewhere.")


@pytest.mark.parametrize(("options", "fragment"), [
    ({"endpoint_url": "localhost:9000"}, "'endpoint_url' for 's3://b/x' must be a URL"),
    ({"client_kwargs": {"endpoint_url": 5}}, "'client_kwargs.endpoint_url'"),
    ({"client_kwargs": "fast"}, "'client_kwargs' for 's3://b/x' must be a mapping"),
    ({"anon": "yes"}, "'anon' for 's3://b/x' must be true or false"),
    ({"secret": 12345678}, "'secret' for 's3://b/x' must be a string, got int"),
    ({"config_kwargs": {"retries": "x"}}, "'config_kwargs.retries' for 's3://b/x' must be a mapping"),
    ({"config_kwargs": {"read_timeout": "abc"}},
     "'config_kwargs.read_timeout' for 's3://b/x' must be a number of seconds > 0, got 'abc'"),
    ({"config_kwargs": {"connect_timeout": 0}}, "'config_kwargs.connect_timeout'"),
    ({"config_kwargs": {"retries": {"foo": 1}}},
     "'config_kwargs' for 's3://b/x' is not a botocore client configuration (Cannot provide"),
    ({"config_kwargs": {"bogus": 1}}, "(Got unexpected keyword argument 'bogus')"),
    ({"kee": "k", "secret": "s"}, "['kee'] for 's3://b/x' are not options of s3fs"),
])
def test_malformed_storage_options_are_refused_by_name(options, fragment):
    with pytest.raises(StorageError, match=re.escape(fragment)) as err:
        check_storage_options("s3://b/x", options)

    assert "12345678" not in str(err.value)


@pytest.mark.parametrize("raised, expected", [
    (PermissionError(13, "Permission denied"), "Access to '/a/run.zarr' was refused"),
    (OSError(28, "No space left on device"),
     "Adding things to '/a/run.zarr' failed (OSError: [Errno 28] No space left on device). "
     "The disk is full: free some space or write elsewhere. Then: Nothing half written; run it "
     "again."),
    (OSError(30, "Read-only file system"),
     "[Errno 30] Read-only file system). The file system is read-only: choose a writable "
     "location. Then: Nothing half written"),
    (OSError(5, "Input/output error"),
     "failed (OSError: [Errno 5] Input/output error). Nothing half written; run it again."),
])
def test_a_writes_storage_faults_are_said_with_what_holds_after(raised, expected):
    from flyarchive.errors import StorageError
    from flyarchive.store.location import write_faults

    with pytest.raises(StorageError) as caught, write_faults(
            "/a/run.zarr", None, "Adding things to", "Nothing half written; run it again."):
        raise raised

    assert expected in str(caught.value)


def test_flyarchives_own_errors_pass_a_write_unchanged():
    from flyarchive.errors import OutputExistsError
    from flyarchive.store.location import write_faults

    err = OutputExistsError("there already")
    with pytest.raises(OutputExistsError) as caught, write_faults("/a", None, "x", "y"):
        raise err

    assert caught.value is err
