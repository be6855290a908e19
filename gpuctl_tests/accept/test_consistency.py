"""Fleet consistency (#43.3): nodes of one GPU model on one driver, VBIOS, CUDA, NCCL and torch.
The reports are real: the suite's ``--prolog`` run over the stand-in NVML, one per node, each
node's driver and VBIOS set in its stand-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuctl.accept import consistency
from gpuctl.accept.run import AcceptOptions, AcceptRun, NodeOutcome
from gpuctl_tests.workloads.test_accept_prolog import run_prolog

SAME = "count 2\ndriver 550.54.15\n"


def reports(tmp_path: Path, stubs: dict[str, str]) -> dict[str, dict[str, Any]]:
    out = {}
    for node, stub in stubs.items():
        code, text, report = run_prolog(tmp_path / node, stub, "--node-name", node)
        assert code == 0, text
        out[node] = report
    return out


def test_the_odd_node_of_a_model_is_named_and_the_run_warns(tmp_path: Path) -> None:
    got = reports(
        tmp_path,
        {
            "gpu01": SAME,
            "gpu02": SAME,
            "gpu03": "count 2\ndriver 535.104.05\n",  # left behind by an upgrade
            "gpu04": SAME + "vbios 1 96.00.74.00.11\n",  # one GPU flashed apart
        },
    )
    odd = consistency.odd_ones(got)
    model = "NVIDIA H100 80GB HBM3"
    assert odd == {
        "gpu03": [f"driver 535.104.05, where 3 of 4 {model} nodes have 550.54.15"],
        "gpu04": [
            "its GPUs run different VBIOS: 96.00.74.00.11/96.00.99.00.01",
            f"vbios 96.00.74.00.11/96.00.99.00.01, where 3 of 4 {model} nodes have 96.00.99.00.01",
        ],
    }
    run = AcceptRun(list(got), AcceptOptions(), "ssh")
    run.outcomes = {n: NodeOutcome(n, "PASS", r) for n, r in got.items()}
    report = run._conclude(None, None)
    assert report["outcome"] == "WARN" and report["verdict"] == "PASS"
    assert f"gpu03: consistency: driver 535.104.05, where 3 of 4 {model} nodes" in (
        " ".join(report["warnings"])
    )


def test_without_a_majority_every_node_is_named() -> None:
    def rep(driver: str) -> dict[str, Any]:
        return {"sections": {"env": {"driver": driver, "gpus": [{"name": "L40S"}]}}}

    odd = consistency.odd_ones({"a": rep("1"), "b": rep("2"), "c": {"sections": {}}})
    assert odd == {
        "a": ["driver 1; the L40S nodes differ: 1 on a, 2 on b"],
        "b": ["driver 2; the L40S nodes differ: 1 on a, 2 on b"],
    }
