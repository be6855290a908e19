"""``gpuctl accept --emit k8s``: the acceptance suite as Kubernetes Jobs (YAML), one per node.

The manifest is self-contained: a ConfigMap carries gpuctl's node bundle (the same zip the agents
run, ~200 KB, under ConfigMap's 1 MiB limit), each Job's one pod mounts it and runs
``python3 -m gpuctl.workloads.accept_suite`` in the image given with ``--container`` (it must hold
torch with CUDA, e.g. ``nvcr.io/nvidia/pytorch:24.05-py3``). The suite starts torchrun itself
for its DDP sections (one torchrun per node, ``--nproc-per-node`` = the GPUs asked for). The pod
asks for ``nvidia.com/gpu`` (the NVIDIA device plugin), gets a memory-backed ``/dev/shm`` for
NCCL, and writes its JSON report to the ``reports`` volume: a PersistentVolumeClaim (default
``gpuctl-accept-reports``) that must exist. With node names, each Job is pinned to its node
(``kubernetes.io/hostname``).

gpuctl does not apply the manifest (``kubectl apply -f``) and nothing here talks to a cluster.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Sequence
from typing import Any

import yaml

from gpuctl.bundle import bundle_bytes, bundle_name

BUNDLE_DIR = "/opt/gpuctl"
REPORT_DIR = "/reports"
DEFAULT_PVC = "gpuctl-accept-reports"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class ManifestError(ValueError):
    """A value that cannot go into the manifest; ``str()`` is one line naming the option."""


def dns_label(text: str, what: str) -> str:
    """``text`` as a Kubernetes name (lower case, digits, '-', at most 63); ManifestError."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    if not _DNS_LABEL.fullmatch(name):
        raise ManifestError(f"{what}: {text!r} gives no Kubernetes name")
    return name


def job_manifests(
    suite_args: Sequence[str],
    image: str,
    *,
    nodes: Sequence[str] = (),
    gpus: int = 8,
    pvc: str = DEFAULT_PVC,
    timeout_s: float = 3600.0,
    cuda: bool = True,
    stamp: str | None = None,
) -> str:
    """The YAML: one ConfigMap (the bundle), then one Job per node (one Job for any node when
    ``nodes`` is empty). ``suite_args`` are the suite's options (``AcceptOptions.suite_args``).

    Raises ManifestError for an image, PVC or node name Kubernetes would refuse.
    """
    if not image or re.search(r"\s", image):
        raise ManifestError(f"--container: {image!r} is not an image reference")
    claim = dns_label(pvc, "--k8s-pvc")
    if claim != pvc:
        raise ManifestError(f"--k8s-pvc: {pvc!r} is not a Kubernetes name (try {claim!r})")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ManifestError(f"--gpus-per-node must be at least 1, not {gpus!r}")
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    digest, data = bundle_bytes()
    bundle_file = bundle_name(digest)
    config_name = dns_label(f"gpuctl-accept-bundle-{digest}", "bundle")
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": config_name, "labels": _labels()},
            "binaryData": {bundle_file: base64.b64encode(data).decode("ascii")},
        }
    ]
    targets: list[str | None] = [*nodes] or [None]
    for node in targets:
        suffix = f"-{dns_label(node, '--nodes')}" if node else ""
        name = dns_label(f"gpuctl-accept-{stamp}{suffix}", "job name")
        job = _job(name, node, suite_args, image, gpus, claim, timeout_s, cuda)
        docs.append(_mount_bundle(job, config_name, bundle_file))
    return str(yaml.safe_dump_all(docs, sort_keys=False, width=100))


def _mount_bundle(job: dict[str, Any], config_name: str, bundle_file: str) -> dict[str, Any]:
    """The ConfigMap's bundle mounted at BUNDLE_DIR and on the container's PYTHONPATH."""
    pod = job["spec"]["template"]["spec"]
    pod["volumes"].insert(0, {"name": "gpuctl", "configMap": {"name": config_name}})
    container = pod["containers"][0]
    container["volumeMounts"].insert(
        0, {"name": "gpuctl", "mountPath": BUNDLE_DIR, "readOnly": True}
    )
    container["env"].append({"name": "PYTHONPATH", "value": f"{BUNDLE_DIR}/{bundle_file}"})
    return job


def _labels() -> dict[str, str]:
    return {"app.kubernetes.io/name": "gpuctl-accept", "app.kubernetes.io/managed-by": "gpuctl"}


def _job(
    name: str,
    node: str | None,
    suite_args: Sequence[str],
    image: str,
    gpus: int,
    claim: str,
    timeout_s: float,
    cuda: bool,
) -> dict[str, Any]:
    command = [
        "python3",
        "-m",
        "gpuctl.workloads.accept_suite",
        *suite_args,
        "--node-name",
        "$(NODE_NAME)",  # Kubernetes expands $(VAR) from the container's env
        "--report-dir",
        REPORT_DIR,
        "--report-name",
        "accept-{node}-$(JOB_NAME).json",
        "--ddp-procs",
        str(gpus),
    ]
    container: dict[str, Any] = {
        "name": "accept",
        "image": image,
        "command": command,
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "JOB_NAME", "value": name},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "volumeMounts": [
            {"name": "reports", "mountPath": REPORT_DIR},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }
    if cuda:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [
            {"name": "reports", "persistentVolumeClaim": {"claimName": claim}},
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
        ],
    }
    if node:
        pod["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": _labels()},
        "spec": {
            "backoffLimit": 0,  # a failed acceptance is an answer, not something to retry
            "activeDeadlineSeconds": int(timeout_s) + 300,
            "ttlSecondsAfterFinished": 7 * 86400,
            "template": {"metadata": {"labels": _labels()}, "spec": pod},
        },
    }
