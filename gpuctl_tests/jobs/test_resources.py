"""gpus= and cpus= where no scheduler allocates them (local and SSH): the supervisor picks GPUs
through the node's readers, NVML (the stand-in library of gpuctl_tests.node.nvml_stub) else
nvidia-smi (the stand-in from gpuctl_tests.node.smi_stub, replaying a two-GPU node), and sets
thread counts, or fails fast naming what the node lacks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gpuctl.jobs import JobFailed
from gpuctl_tests.node import smi_stub
from gpuctl_tests.node.nvml_stub import CONFIG_ENV, NvmlStub


def gpu_env() -> dict[str, str | None]:
    import os

    names = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    return {k: os.environ.get(k) for k in names}


@pytest.fixture
def smi(tmp_path: Path) -> dict[str, Any]:
    """A node with two GPUs (H100 index 0, RTX 4090 index 1); returns the stub's data and the
    job environment that puts it on PATH."""
    data = smi_stub.default_data()
    bin_dir, data_path = tmp_path / "smi-bin", tmp_path / "smi.json"
    smi_stub.install(bin_dir, data_path, data)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", smi_stub.DATA_ENV: str(data_path)}
    return {"data": data, "path": data_path, "env": env}


def failure(job: Any) -> JobFailed:
    with pytest.raises(JobFailed) as info:
        job.result(60)
    return info.value


def test_gpus_pick_the_idle_gpu_first(make_executor: Any, smi: dict[str, Any]) -> None:
    data = smi["data"]
    data["apps"] = [[data["gpus"][0]["uuid"], 4242, 70000]]  # someone trains on GPU 0
    smi_stub.write_data(smi["path"], data)
    got = make_executor(job_env=smi["env"], gpus=1).submit(gpu_env).result(60)
    assert got["CUDA_VISIBLE_DEVICES"] == "1"
    assert got["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    both = make_executor(job_env=smi["env"], gpus=2).submit(gpu_env).result(60)
    assert both["CUDA_VISIBLE_DEVICES"] == "1,0"  # the busy one last


def test_gpus_choose_within_the_visible_devices_the_env_sets(
    make_executor: Any, smi: dict[str, Any]
) -> None:
    env = dict(smi["env"], CUDA_VISIBLE_DEVICES="1")
    got = make_executor(job_env=env, gpus=1).submit(gpu_env).result(60)
    assert got["CUDA_VISIBLE_DEVICES"] == "1"
    err = failure(make_executor(job_env=env, gpus=2).submit(gpu_env))
    assert err.kind == "resources_unavailable"
    assert "gpus=2 asked, and this node has 1 GPU(s) of CUDA_VISIBLE_DEVICES=1" in str(err)


def test_more_gpus_than_the_node_has_fail_before_venv2_starts(
    make_executor: Any, smi: dict[str, Any]
) -> None:
    job = make_executor(job_env=smi["env"], gpus=3).submit(gpu_env)
    err = failure(job)
    assert err.kind == "resources_unavailable", err
    assert "gpus=3 asked, and this node has 2 GPU(s)" in str(err)
    assert not Path(job.jobdir, "status.jsonl").exists()  # VENV2 never ran


def test_gpus_on_a_node_without_nvidia_smi_or_a_driver(
    make_executor: Any, smi: dict[str, Any], tmp_path: Path
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = dict(smi["env"], PATH=f"{empty}{os.pathsep}/usr/bin:/bin")
    err = failure(make_executor(job_env=env, gpus=1).submit(gpu_env))
    assert err.kind == "resources_unavailable"
    assert "no nvidia-smi on PATH" in str(err)
    smi_stub.write_data(smi["path"], dict(smi["data"], fail=smi_stub.NO_DRIVER))
    err = failure(make_executor(job_env=smi["env"], gpus=1).submit(gpu_env))
    assert "the GPUs cannot be read here: nvidia-smi failed (exit 9): NVIDIA-SMI has failed" in str(
        err
    )


def test_cpus_set_thread_counts_and_are_checked(make_executor: Any) -> None:
    got = make_executor(cpus=1).submit(gpu_env).result(60)
    assert got["OMP_NUM_THREADS"] == "1" and got["MKL_NUM_THREADS"] == "1"
    assert got["CUDA_VISIBLE_DEVICES"] is None  # no gpus= asked: nothing chosen
    mine = make_executor(cpus=1, job_env={"OMP_NUM_THREADS": "7"}).submit(gpu_env).result(60)
    assert mine["OMP_NUM_THREADS"] == "7"  # the job's own setting wins
    too_many = len(os.sched_getaffinity(0)) + 1
    err = failure(make_executor(cpus=too_many).submit(gpu_env))
    assert err.kind == "resources_unavailable"
    assert f"cpus={too_many} asked" in str(err)


def test_gpus_are_read_through_nvml_without_nvidia_smi(
    make_executor: Any, nvml_lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor reads GPUs as the agent does: NVML first (the stand-in library, three GPUs,
    a process on GPU 0), through the pynvml the job folder carries (VENV1 3.6 has none), with
    no nvidia-smi anywhere on PATH."""
    stub = NvmlStub(nvml_lib_dir, tmp_path / "nvml.conf", "count 3\nproc 0 4242 1000\n")
    # a node's library path, which the supervisor inherits (read when its process starts)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(nvml_lib_dir))
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = {"PATH": f"{empty}{os.pathsep}/usr/bin:/bin", CONFIG_ENV: str(stub.config)}
    got = make_executor(job_env=env, gpus=2).submit(gpu_env).result(60)
    assert got["CUDA_VISIBLE_DEVICES"] == "1,2"  # the two idle ones of three
    assert got["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
