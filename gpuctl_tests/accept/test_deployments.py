"""Deployments that cannot run here (no Pyxis, no Kubernetes): their text, checked structurally.

``--container`` puts Pyxis options on the batch script's srun line; ``--emit k8s`` prints a
ConfigMap and Jobs. The tests parse what is emitted (bash -n, shlex, yaml) and check it against
what srun and the Job schema require, and that the bundle carried in the ConfigMap imports.
"""

from __future__ import annotations

import base64
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuctl.accept.run import AcceptOptions
from gpuctl.accept.slurm import SlurmJobSpec, batch_script
from gpuctl.reach.slurm import SlurmValueError, pyxis_args
from gpuctl.workloads.accept_suite.suite import parse_args
from gpuctl_tests.accept.test_cli import gpuctl

IMAGE = "nvcr.io#nvidia/pytorch:24.05-py3"


def srun_argv(script: str) -> list[str]:
    """The srun command of a batch script, continuation lines joined, as argv."""
    text = script.replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("srun "))
    return shlex.split(line)


def test_container_runs_the_suite_through_pyxis_with_the_job_folder_mounted(
    tmp_path: Path,
) -> None:
    job = Path("/shared/gpuctl-jobs/accept-1")
    spec = SlurmJobSpec(nnodes=2, gpus_per_node=8, container=IMAGE)
    script = batch_script(job, job / "gpuctl-node.pyz", "python3", spec, AcceptOptions())
    (tmp_path / "job.sh").write_text(script)
    subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], check=True)  # it parses
    argv = srun_argv(script)
    assert argv[0] == "srun"
    assert f"--container-image={IMAGE}" in argv
    assert f"--container-mounts={job}:{job}" in argv  # bundle, reports, events inside
    at = argv.index("python3")
    assert argv[at : at + 3] == ["python3", "-m", "gpuctl.workloads.accept_suite"]
    assert max(argv.index(a) for a in argv if a.startswith("--container-")) < at
    # The rendezvous port is found on the batch host, outside the container.
    assert re.search(r"^PORT=\$\(python3 -c ", script, re.M)
    # Without a container, nothing of Pyxis.
    plain = batch_script(job, job / "b.pyz", "/opt/py/bin/python", SlurmJobSpec(), AcceptOptions())
    assert "--container" not in plain


def test_bad_images_and_folders_are_refused_in_one_line() -> None:
    for image in ("a b", "img\n#SBATCH --wrap=id", "x,y", "--container-image=x", ""):
        with pytest.raises(SlurmValueError, match=r"^--container: bad image") as e:
            SlurmJobSpec(container=image)
        assert "\n" not in str(e.value)
    for folder in ("/jobs/a,b", "/jobs/a b", "/jobs/a:b", "jobs"):
        with pytest.raises(SlurmValueError, match="cannot be mounted"):
            pyxis_args(IMAGE, [folder])
    assert pyxis_args("/images/pytorch.sqsh") == ["--container-image=/images/pytorch.sqsh"]


def test_container_and_emit_mistakes_are_one_line(tmp_path: Path) -> None:
    for args, why in (
        (("--local", "--container", IMAGE), "--container runs the suite through Slurm"),
        (("--via", "ssh", "--container", IMAGE), "--container runs the suite through Slurm"),
        (("--emit", "k8s"), "--emit k8s needs --container IMAGE"),
        (("--emit", "k8s", "--container", "a b"), "is not an image reference"),
        (("--emit", "k8s", "--container", IMAGE, "--k8s-pvc", "My_PVC"), "--k8s-pvc"),
    ):
        r = gpuctl(tmp_path, *args)
        assert r.returncode == 2 and why in r.stderr, (args, r.stderr)
        assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def check_job(job: dict[str, Any]) -> dict[str, Any]:
    """The fields a batch/v1 Job must have (what kubectl's validation would refuse without)."""
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    name = job["metadata"]["name"]
    assert DNS_LABEL.fullmatch(name) and len(name) <= 63
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")  # Always is invalid for a Job
    (container,) = pod["containers"]
    assert container["name"] and container["image"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        assert mount["name"] in volumes and mount["mountPath"].startswith("/")
    for var in container["env"]:
        assert DNS_LABEL.fullmatch(var["name"].lower().replace("_", "-"))
        assert ("value" in var) != ("valueFrom" in var)
    return dict(container)


def test_emit_k8s_writes_a_configmap_and_one_job_per_node(tmp_path: Path) -> None:
    image = "nvcr.io/nvidia/pytorch:24.05-py3"
    r = gpuctl(
        tmp_path, "--emit", "k8s", "--container", image, "--nodes", "gpu[01-02]",
        "--quick", "--dtypes", "bf16", "--timeout", "600",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(r.stdout))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Job", "Job"]
    config_map, *jobs = docs
    for job, node in zip(jobs, ("gpu01", "gpu02"), strict=True):
        container = check_job(job)
        pod = job["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"kubernetes.io/hostname": node}
        assert job["metadata"]["name"].endswith(f"-{node}")
        assert job["spec"]["backoffLimit"] == 0
        assert job["spec"]["activeDeadlineSeconds"] == 900
        assert container["image"] == image
        assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["reports"]["persistentVolumeClaim"] == {"claimName": "gpuctl-accept-reports"}
        assert volumes["gpuctl"]["configMap"]["name"] == config_map["metadata"]["name"]
        assert volumes["shm"]["emptyDir"] == {"medium": "Memory"}
        command = container["command"]
        assert command[:3] == ["python3", "-m", "gpuctl.workloads.accept_suite"]
        args = parse_args([a.replace("$(NODE_NAME)", node) for a in command[3:]])
        assert (args.quick, args.dtypes, args.ddp_procs) == (True, ["bf16"], 8)
        assert args.report_dir == "/reports" and args.node_name == node
    # The ConfigMap carries a bundle that imports the suite by itself.
    ((file_name, blob),) = config_map["binaryData"].items()
    bundle = tmp_path / file_name
    bundle.write_bytes(base64.b64decode(blob))
    env = jobs[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "PYTHONPATH", "value": f"/opt/gpuctl/{file_name}"} in env
    probe = "import gpuctl.workloads.accept_suite.suite as s, gpuctl; print(gpuctl.__file__)"
    out = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        env={"PYTHONPATH": str(bundle)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith(str(bundle))
