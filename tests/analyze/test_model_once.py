"""The model on a Dask cluster (:mod:`flyarchive.models.shipping`): positions built
under a default client send its bytes to the workers once per client and model, and each
compute only their key; the results equal those built without a client bit for bit, on
the cluster and in this process, also after the client closed."""

from __future__ import annotations

import pickle
import uuid
import warnings

import dask
import numpy as np
import pytest

import flyarchive
from flyarchive.models.shipping import SCATTER_PREFIX, ModelRef

distributed = pytest.importorskip("distributed")


def large_graph_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "Sending large graph" in str(w.message)]


def test_positions_built_under_a_client_send_it_the_model_once(dask_client, monkeypatch,
                                                               bulky_archive):
    url, blob = bulky_archive
    scatters = []
    scatter = dask_client.scatter
    monkeypatch.setattr(dask_client, "scatter",
                        lambda *a, **k: scatters.append(a) or scatter(*a, **k))
    threshold = {"distributed.admin.large-graph-warning-threshold": len(blob) // 2}

    with dask_client.as_current(), dask.config.set(threshold), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lazy = flyarchive.positions(url, stored=False)
        thorax = flyarchive.positions(url, "fly/c_thorax", stored=False)  # built again
        lazy.compute()
        lazy.max("time").compute()
        thorax.compute()
        holders = dask_client.who_has().get(f"{SCATTER_PREFIX}{lazy.attrs['model_sha256']}")

    assert large_graph_warnings(caught) == []  # 3 computes: each sent the key alone
    assert len(scatters) == 1  # for both arrays, before any compute
    assert holders  # still held for the next graph


def test_a_graph_built_without_a_client_holds_the_bytes_and_warns(dask_client, bulky_archive):
    url, blob = bulky_archive  # the check above is one: this is what it sees
    threshold = {"distributed.admin.large-graph-warning-threshold": len(blob) // 2}
    lazy = flyarchive.positions(url, stored=False)  # no default client

    with dask.config.set(threshold), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dask_client.compute(lazy.data).result()

    assert len(large_graph_warnings(caught)) == 1


def test_positions_built_under_a_client_equal_those_built_without_bit_for_bit(dask_client,
                                                                              bulky_archive):
    url, _ = bulky_archive
    expected = flyarchive.positions(url, orientations=True, stored=False).compute(
        scheduler="synchronous")  # the graph holds the bytes

    with dask_client.as_current():
        lazy = flyarchive.positions(url, orientations=True, stored=False)
        on_cluster = lazy.compute()  # its workers never had this model
    here = lazy.compute(scheduler="synchronous")
    threads = lazy.compute(scheduler="threads")

    for actual in (on_cluster, here, threads):
        assert np.array_equal(actual.position.values, expected.position.values)
        assert np.array_equal(actual.orientation.values, expected.orientation.values)


def test_positions_built_under_a_client_that_closed_compute_in_this_process(dask_cluster,
                                                                            bulky_archive):
    url, _ = bulky_archive
    expected = flyarchive.positions(url, stored=False).compute(scheduler="synchronous")
    with distributed.Client(dask_cluster, set_as_default=False) as other, other.as_current():
        lazy = flyarchive.positions(url, stored=False)  # the model sent to `other`

    actual = lazy.compute()  # no default client: dask's threads

    assert np.array_equal(actual.values, expected.values)


def test_a_worker_without_the_copy_fetches_it_once_from_one_that_has_it(dask_client):
    blob = uuid.uuid4().bytes * 1000
    key = f"{SCATTER_PREFIX}{uuid.uuid4().hex}"
    first, second = sorted(dask_client.scheduler_info()["workers"])
    held = dask_client.scatter({key: blob}, workers=[first], broadcast=False)  # noqa: F841
    ref = pickle.loads(pickle.dumps(ModelRef("0" * 64, blob, key)))  # as a task gets it

    fetched = dask_client.submit(lambda r: r.blob(), ref, workers=[second], pure=False).result()

    assert fetched == blob


def test_a_model_ref_pickles_as_its_key_when_scattered_and_with_its_bytes_when_not():
    blob = b"mjb" * 100_000
    sha = "0" * 64

    scattered = pickle.dumps(ModelRef(sha, blob, SCATTER_PREFIX + sha))
    held = pickle.loads(pickle.dumps(ModelRef(sha, blob)))

    assert len(scattered) < 500
    assert held.blob() == blob
