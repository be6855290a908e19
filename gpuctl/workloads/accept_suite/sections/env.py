"""[ENV]: host, Python, torch, CUDA, driver, NCCL and the GPUs, against the expected count."""

import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from gpuctl.workloads.accept_suite import peaks
from gpuctl.workloads.accept_suite.nvml import Nvml

if TYPE_CHECKING:
    from gpuctl.workloads.accept_suite.suite import Suite


def run(suite: "Suite") -> "dict[str, Any]":
    """[ENV]: the software stack and the GPUs this node shows, against what it should have."""
    torch = suite.torch
    a = suite.args
    info = {
        "hostname": socket.gethostname(),
        "node": suite.node,
        "python": ".".join(str(v) for v in sys.version_info[:3]),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": None,
        "nccl": None,
        "gpu_count": 0,
        "expected_gpus": None,
        "gpus": [],
        "nvidia_smi_l": [],
        "cpu_threads": torch.get_num_threads(),
    }
    suite.out.line(
        f"host {info['hostname']} (node {suite.node}), Python {info['python']}, "
        f"torch {info['torch']}, CUDA {info['cuda']}"
    )
    if not suite.cuda:
        info["verdict"] = "PASS"
        info["summary"] = (
            f"CPU run ({int(info['cpu_threads'])} threads): judged on correctness, not on peaks"
        )
        suite.out.line(info["summary"])
        return info
    expected, source = expected_count(a)
    info["expected_gpus"] = expected
    info["expected_source"] = source if expected is not None else None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    info["gpu_count"] = count
    if count == 0:
        why = "torch.cuda.is_available() is False"
        if torch.version.cuda is None:
            why = f"this torch is a CPU-only build ({torch.__version__})"
        suite.no_gpu = True
        short = count_shortfall(suite.node, count, expected, source)
        if short is not None:
            why = f"{short}; {why}"
        if a.allow_no_gpu and short is None:
            info["verdict"] = "SKIP"
            info["summary"] = f"no GPU found ({why}); --allow-no-gpu: GPU sections skipped"
        else:
            info["verdict"] = "FAIL"
            info["summary"] = f"no GPU found ({why}); pass --allow-no-gpu to skip"
        suite.out.line(info["summary"])
        return info
    suite.nvml = Nvml()
    suite.nvml.map_devices(torch, count)
    info["driver"] = suite.nvml.driver()
    info["nvml_bindings"] = suite.nvml.bindings
    try:
        v = torch.cuda.nccl.version()
        info["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:
        info["nccl"] = None
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        uuid = suite.nvml.uuid(i) or (str(props.uuid) if getattr(props, "uuid", None) else None)
        g = {
            "index": i,
            "name": props.name,
            "uuid": uuid,
            "model_key": peaks.model_key(props.name),
            "memory_bytes": props.total_memory,
            "capability": f"{int(props.major)}.{int(props.minor)}",
            "vbios": suite.nvml.vbios(i),
        }
        info["gpus"].append(g)
        info["nvidia_smi_l"].append(f"GPU {i}: {props.name} (UUID: {uuid})")
    suite.gpus = info["gpus"]
    suite.note_link_errors()
    for line in info["nvidia_smi_l"]:
        suite.out.line(line)
    suite.out.line(
        f"driver {info['driver']}, NCCL {info['nccl']}, "
        f"NVML {f'ok ({suite.nvml.bindings})' if suite.nvml.nv else suite.nvml.error}"
    )
    short = count_shortfall(suite.node, count, expected, source)
    if short is not None:
        info["verdict"] = "FAIL"
        info["summary"] = short
    else:
        models = sorted(set(g["name"] for g in suite.gpus))
        info["verdict"] = "PASS"
        info["summary"] = f"{int(count)} GPU(s): {', '.join(models)}, driver {info['driver']}"
    suite.out.line(info["summary"])
    return info


def run_prolog(suite: "Suite") -> "dict[str, Any]":
    """[ENV] of ``--prolog``: the GPUs NVML sees, against what the node should have; no torch
    is imported (seconds matter in a Slurm prolog, and its Python may have none)."""
    a = suite.args
    nvml = suite.nvml = Nvml()
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "node": suite.node,
        "python": ".".join(str(v) for v in sys.version_info[:3]),
        "torch": None,
        "driver": None,
        "gpu_count": 0,
        "expected_gpus": None,
        "gpus": [],
        "nvml_bindings": nvml.bindings,
    }
    expected, source = expected_count(a)
    info["expected_gpus"] = expected
    info["expected_source"] = source if expected is not None else None
    if nvml.nv is None:
        suite.no_gpu = True
        why = f"NVML cannot be opened ({nvml.error})"
        if a.allow_no_gpu and expected is None:
            info["verdict"], info["summary"] = (
                "SKIP",
                f"{why}; --allow-no-gpu: GPU sections skipped",
            )
        else:
            info["verdict"], info["summary"] = "FAIL", why
        suite.out.line(info["summary"])
        return info
    count = info["gpu_count"] = nvml.map_indices()
    info["driver"] = nvml.driver()
    for i in sorted(nvml.handles):
        name = nvml.shape(i)["name"]
        info["gpus"].append(
            {
                "index": i,
                "name": name,
                "uuid": nvml.uuid(i),
                "model_key": peaks.model_key(name) if name else None,
                "memory_bytes": nvml.memory_total(i),
                "vbios": nvml.vbios(i),
            }
        )
    suite.gpus = info["gpus"]
    suite.out.line(f"host {info['hostname']} (node {suite.node}), driver {info['driver']}, NVML")
    short = count_shortfall(suite.node, count, expected, source)
    if short is not None:
        info["verdict"], info["summary"] = "FAIL", short
    elif count == 0:
        suite.no_gpu = True
        info["verdict"] = "SKIP" if a.allow_no_gpu else "FAIL"
        info["summary"] = "NVML sees no GPU" + ("; --allow-no-gpu" if a.allow_no_gpu else "")
    else:
        models = sorted(set(str(g["name"]) for g in suite.gpus))
        info["verdict"] = "PASS"
        info["summary"] = f"{int(count)} GPU(s): {', '.join(models)}, driver {info['driver']}"
    suite.out.line(info["summary"])
    return info


def expected_count(a: Any) -> "tuple[int | None, str | None]":
    """The node's expected GPU count and where it came from: ``--expect-gpus`` (which the
    login side fills from the config or Slurm's gres), else the Slurm job's own count."""
    if a.expect_gpus is not None:
        return a.expect_gpus, a.expect_source
    slurm = os.environ.get("SLURM_GPUS_ON_NODE")
    if slurm and slurm.isdigit():
        return int(slurm), "the Slurm job's SLURM_GPUS_ON_NODE"
    return None, None


def count_shortfall(
    node: str, count: int, expected: "int | None", source: "str | None"
) -> "str | None":
    """The failure line of a node showing fewer GPUs than expected, or None when it has them.

    ``gpu07: 7 of 8 GPUs visible (expected: Slurm gres gpu:h100:8)``.
    """
    if expected is None or count >= expected:
        return None
    return f"{node}: {int(count)} of {int(expected)} GPUs visible (expected: {source})"
