"""Positions computed by worker processes (flyarchive.analyze.cpu_processes) are those of
one process, bit for bit: masks of unequal worlds, mocap bodies and points included; and
gait measures from them are the same."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import flyarchive
from flyarchive.analyze.cpu_processes import cpu_positions_in_processes
from flyarchive.analyze.keypoints import KeypointRequest
from flyarchive.analyze.lazy import computed_positions
from flyarchive.analyze.prepare import prepare

pytestmark = pytest.mark.subprocess  # worker processes (started once per test process)

POINTS = {"claw+": ("fly/lf_tarsus5", (0.1, 0.003, -0.2))}


def test_worker_processes_compute_what_one_process_computes_bit_for_bit(sites_archive,
                                                                         uneven_archive):
    for url, bodies, points in ((sites_archive, "*", POINTS), (uneven_archive, None, None)):
        expected = flyarchive.positions(url, bodies, points=points, stored=False).compute(
            scheduler="synchronous")

        prepared = prepare(url, KeypointRequest.of(bodies, None, points))
        by_workers = cpu_positions_in_processes(prepared, False, 2, here=False)
        actual = computed_positions(url, bodies, points, processes=2)  # this process too

        assert by_workers is not None  # not handed back to dask: read by the workers
        np.testing.assert_array_equal(by_workers, expected.values)  # NaN where expected is
        xr.testing.assert_identical(actual, expected)


def test_gait_from_worker_processes_equals_gait_from_one_thread(sites_archive):
    tips = {"lf_tip": ("fly/lf_tarsus5", (0.1, 0.0, -0.2))}

    expected = flyarchive.gait_summary(sites_archive, thorax="fly/c_thorax", tips=tips,
                                       processes=0)
    actual = flyarchive.gait_summary(sites_archive, thorax="fly/c_thorax", tips=tips,
                                     processes=2)

    xr.testing.assert_identical(actual, expected)
