"""Fleet consistency: the nodes of one GPU model should run one driver, one VBIOS, one CUDA,
NCCL and torch, and a node's GPUs one VBIOS. A run over several nodes compares what each
node's [ENV] read and names the odd ones out as warnings (the run's outcome becomes WARN, exit 4,
unless something failed): drift left by a half-finished upgrade, found before it becomes a
job that hangs on one node.

``odd_ones(reports)`` takes each node's suite report (``gpuctl.workloads.accept_suite.schema``)
and returns node -> warnings. Where most nodes of a model agree, only the others are named
("driver 535.104.05, where 14 of 16 NVIDIA H100 80GB HBM3 nodes have 550.54.15"); where no
value has a majority, every node of the model is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

FACTS = ("driver", "vbios", "cuda", "nccl", "torch")


def node_facts(report: Mapping[str, Any]) -> tuple[str | None, dict[str, str]]:
    """(the node's GPU model, its facts): the model its GPUs mostly are (None without GPUs)."""
    env = (report.get("sections") or {}).get("env") or {}
    gpus = [g for g in env.get("gpus") or [] if isinstance(g, Mapping)]
    names = Counter(str(g["name"]) for g in gpus if g.get("name"))
    model = names.most_common(1)[0][0] if names else None
    facts = {k: str(env[k]) for k in FACTS if k != "vbios" and env.get(k)}
    vbios = sorted({str(g["vbios"]) for g in gpus if g.get("vbios")})
    if vbios:
        facts["vbios"] = "/".join(vbios)
    return model, facts


def odd_ones(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """node -> what sets it apart from the other nodes of its GPU model (and its own GPUs)."""
    out: dict[str, list[str]] = {}
    groups: dict[str, dict[str, dict[str, str]]] = {}
    for node, report in reports.items():
        model, facts = node_facts(report)
        if model is None:
            continue
        groups.setdefault(model, {})[node] = facts
        if "/" in facts.get("vbios", ""):
            out.setdefault(node, []).append(f"its GPUs run different VBIOS: {facts['vbios']}")
    for model, nodes in groups.items():
        for fact in FACTS:
            values = {n: f[fact] for n, f in nodes.items() if fact in f}
            counts = Counter(values.values())
            if len(counts) < 2:
                continue
            common, k = counts.most_common(1)[0]
            if 2 * k > len(values):
                for n, v in values.items():
                    if v != common:
                        out.setdefault(n, []).append(
                            f"{fact} {v}, where {k} of {len(values)} {model} nodes have {common}"
                        )
                continue
            spread = ", ".join(
                f"{v} on {_few(sorted(n for n, x in values.items() if x == v))}" for v in counts
            )
            for n, v in values.items():
                out.setdefault(n, []).append(f"{fact} {v}; the {model} nodes differ: {spread}")
    return out


def _few(nodes: list[str]) -> str:
    return ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
