"""Backend "gpu" on every GPU of a host: which GPUs are seen (without CUDA), one worker per
GPU with its own device, resource and cores, and work balanced by frames.

The GPUs are a fake set of two (``CUDA_VISIBLE_DEVICES``, an injected ``nvidia-smi``
answer, or :class:`~flyarchive.distribute.gpus.Gpu` lists): CI has no CUDA. The local
cluster of GPU workers is started for real (worker processes), and asked what each
worker process holds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flyarchive.distribute.placement import placement
from flyarchive.distribute.gpus import Gpu, gpu_workers, split_cpus, visible_gpus
from flyarchive.render.plan import split_groups
from flyarchive.query.selection import VideoJob
from flyarchive.testing.markers import requires_distributed

TWO = [Gpu(0, "0"), Gpu(1, "1")]
SMI = ("0, GPU-aaaaaaaa-0000-0000-0000-000000000000, 00000000:17:00.0\n"
       "1, GPU-bbbbbbbb-0000-0000-0000-000000000000, 00000000:65:00.0\n")


def no_smi() -> None:
    return None


def test_cuda_visible_devices_names_the_gpus_without_cuda():
    gpus = visible_gpus(environ={"CUDA_VISIBLE_DEVICES": "0,1"}, nvidia_smi=no_smi,
                        warp_count=lambda: pytest.fail("Warp was asked"))

    assert [(g.ordinal, g.visible) for g in gpus] == [(0, "0"), (1, "1")]


def test_empty_cuda_visible_devices_means_no_gpu():
    gpus = visible_gpus(environ={"CUDA_VISIBLE_DEVICES": ""}, nvidia_smi=lambda: SMI)

    assert gpus == []


def test_nvidia_smi_gpus_are_named_by_uuid_and_bus_id(tmp_path: Path):
    gpus = visible_gpus(environ={}, nvidia_smi=lambda: SMI, proc_gpus=tmp_path / "none")

    assert [g.visible for g in gpus] == ["GPU-aaaaaaaa-0000-0000-0000-000000000000",
                                         "GPU-bbbbbbbb-0000-0000-0000-000000000000"]
    assert [g.bus_id for g in gpus] == ["0000:17:00.0", "0000:65:00.0"]


def test_each_gpu_worker_sees_its_gpu_alone_with_resource_gpu_1():
    workers = gpu_workers(TWO, cpus=range(8), sys_pci=Path("/nonexistent"))

    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in workers] == ["0", "1"]
    assert [w.resources for w in workers] == [{"GPU": 1}, {"GPU": 1}]
    assert [w.name for w in workers] == ["gpu0", "gpu1"]


def test_gpu_workers_get_disjoint_halves_of_the_cores_and_as_many_encoders():
    workers = gpu_workers(TWO, cpus=range(8), sys_pci=Path("/nonexistent"),
                          sys_cpu=Path("/nonexistent"))

    assert [w.cpus for w in workers] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [w.env["FLYARCHIVE_CPUS"] for w in workers] == ["0-3", "4-7"]
    assert [w.env["FLYARCHIVE_ENCODERS"] for w in workers] == ["4", "4"]


def test_gpu_workers_take_the_cores_of_their_gpus_numa_node(tmp_path: Path):
    for bus, cpus in (("0000:17:00.0", "4-7"), ("0000:65:00.0", "0-3")):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "local_cpulist").write_text(cpus + "\n")
    gpus = [Gpu(0, "0", "0000:17:00.0"), Gpu(1, "1", "0000:65:00.0")]

    workers = gpu_workers(gpus, cpus=range(8), sys_pci=tmp_path, sys_cpu=tmp_path)

    assert [w.cpus for w in workers] == [(4, 5, 6, 7), (0, 1, 2, 3)]


def test_hyperthreads_of_one_core_stay_in_one_block(tmp_path: Path):
    for cpu in range(8):  # cpu k and k+4 are the two threads of core k % 4
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0")
        (topology / "core_id").write_text(str(cpu % 4))

    blocks = split_cpus(range(8), 2, sys_cpu=tmp_path)

    assert blocks == [(0, 1, 4, 5), (2, 3, 6, 7)]


def test_groups_of_whole_videos_are_balanced_by_frames_not_by_count():
    lengths = [400, 100, 100, 100, 100]  # one long video, four short ones
    jobs = [VideoJob(i, i, 0, n) for i, n in enumerate(lengths)]

    groups = split_groups(jobs, 4, 2)

    assert [[j.world_id for j in g] for g in groups] == [[0], [1, 2, 3, 4]]
    assert [sum(j.n_frames for j in g) for g in groups] == [400, 400]


def test_two_gpus_render_on_a_local_cluster_of_two_gpu_workers():
    where = placement("gpu", 8, visible=TWO, cpus=range(4))

    assert where.where == "local-gpus"
    assert [w.gpu.ordinal for w in where.gpu_workers] == [0, 1]


def test_gpus_restricts_the_workers_to_the_gpus_named():
    one = placement("gpu", 8, visible=TWO, gpus=[1])
    both = placement("gpu", 8, visible=TWO, gpus=[1, 0], cpus=range(4))

    assert (one.where, one.device) == ("here", "cuda:1")
    assert [w.gpu.ordinal for w in both.gpu_workers] == [1, 0]


def test_a_cluster_given_takes_the_work_whatever_the_gpus_here():
    where = placement("gpu", 8, visible=TWO, scheduler="tcp://127.0.0.1:8786")

    assert where.where == "cluster"


@requires_distributed
@pytest.mark.timeout(120)
def test_local_gpu_cluster_workers_hold_their_gpu_resource_and_cores():
    import dask

    from flyarchive.distribute.cluster import connect
    from flyarchive.distribute.gpus import usable_cpus

    cores = usable_cpus()
    workers = gpu_workers(TWO, cpus=cores, sys_pci=Path("/nonexistent"))

    def seen() -> tuple[str, str, list[int]]:
        return (os.environ["CUDA_VISIBLE_DEVICES"], os.environ["FLYARCHIVE_CPUS"],
                sorted(os.sched_getaffinity(0)))

    # The two GPUs are fake: on a host with one real GPU, Dask's NVML monitor fails the
    # worker whose CUDA_VISIBLE_DEVICES=1 names a GPU that is not there (the nanny hands
    # its Dask configuration to the worker process).
    with dask.config.set({"distributed.diagnostics.nvml": False}), \
            connect(gpu_workers=workers) as client:
        info = client.scheduler_info()["workers"]
        by_name = {w["name"]: (w["resources"], w["nthreads"]) for w in info.values()}
        names = {a: w["name"] for a, w in info.items()}
        held = {names[a]: v for a, v in client.run(seen).items()}

    assert by_name == {"gpu0": ({"GPU": 1}, 1), "gpu1": ({"GPU": 1}, 1)}
    assert {n: v[0] for n, v in held.items()} == {"gpu0": "0", "gpu1": "1"}
    assert [held[w.name][2] for w in workers] == [list(w.cpus) for w in workers]
