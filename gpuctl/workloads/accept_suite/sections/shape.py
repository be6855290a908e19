"""[SHAPE]: the node is built as it should be, read from NVML: one GPU model (``--expect-model``),
every NVLink up (``--expect-nvlinks``), each PCIe link trained to what GPU and slot allow, ECC on,
persistence mode on, MIG as expected (``--expect-mig``, default off), no mode change pending."""

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from .env import count_shortfall, expected_count

if TYPE_CHECKING:
    from gpuctl.workloads.accept_suite.suite import Suite

LOAD_S = 0.5  # GPUs drop the PCIe link speed when idle: read it again under this much load


def run(suite: "Suite") -> "dict[str, Any]":
    """[SHAPE]: model, NVLink, PCIe link training, ECC, persistence and MIG of every GPU."""
    if not suite.cuda:
        return {"verdict": "SKIP", "summary": "no GPU on a CPU run (NVML not read)", "gpus": []}
    if suite.nvml is None or suite.nvml.nv is None:
        why = suite.nvml.error if suite.nvml else "NVML not opened"
        # Not a pass: nothing about the node's build was checked.
        return {"verdict": "WARN", "summary": f"NVML unavailable ({why}): shape unchecked"}
    a = suite.args
    gpus = []
    for g in suite.gpus:
        i = int(g["index"])
        s = suite.nvml.shape(i)
        if _below(s) and suite.torch is not None:
            s.update(_read_under_load(suite, i))
        s["index"] = i
        s["label"] = f"gpu{i}"
        s["name"] = s["name"] or g.get("name")
        gpus.append(s)
    problems: dict[int, list[str]] = {s["index"]: [] for s in gpus}
    names = Counter(s["name"] for s in gpus)
    usual = names.most_common(1)[0][0] if names else None
    most_links = max((s["nvlinks_active"] or 0 for s in gpus), default=0)
    for s in gpus:
        p = problems[s["index"]]
        name = s["name"]
        if a.expect_model and (name is None or a.expect_model.lower() not in name.lower()):
            p.append(f"model {name!r}, expected {a.expect_model!r}")
        elif len(names) > 1 and name != usual:
            p.append(f"model {name!r}, the node's other GPUs are {usual!r}")
        p.extend(_link_problems(s, judge_gen=not a.prolog or bool(s.get("read_under_load"))))
        if s["nvlinks"] is not None and s["nvlinks_active"] < s["nvlinks"]:
            p.append(f"NVLink {s['nvlinks_active']} of {s['nvlinks']} links active")
        elif most_links and (s["nvlinks_active"] or 0) < most_links:
            p.append(f"NVLink {s['nvlinks_active'] or 0} links active, other GPUs {most_links}")
        if a.expect_nvlinks is not None and (s["nvlinks_active"] or 0) != a.expect_nvlinks:
            p.append(f"NVLink {s['nvlinks_active'] or 0} links active, {a.expect_nvlinks} expected")
        if s["ecc_mode"] is False:
            p.append("ECC off")
        if s["ecc_mode"] is not None and s["ecc_pending"] != s["ecc_mode"]:
            p.append(f"ECC {'on' if s['ecc_pending'] else 'off'} pending a GPU reset")
        if s["persistence"] is False:
            p.append("persistence mode off")
        want_mig = a.expect_mig == "on"
        if s["mig"] is not None and s["mig"] != want_mig:
            p.append(f"MIG {'on' if s['mig'] else 'off'}, expected {a.expect_mig}")
        if s["mig"] is not None and s["mig_pending"] != s["mig"]:
            p.append(f"MIG {'on' if s['mig_pending'] else 'off'} pending a GPU reset")
    failures = []
    seen = suite.nvml.device_count()
    expected, source = expected_count(a)
    short = count_shortfall(suite.node, seen, expected, source) if seen is not None else None
    if short is not None:  # a GPU gone from the bus: NVML, unlike CUDA, sees the whole node
        failures.append(f"shape: {short}")
        suite.out.line(short)
    for s in gpus:
        p = problems[s["index"]]
        s["verdict"] = "FAIL" if p else "PASS"
        s["reason"] = "; ".join(p) or None
        if p:
            failures.append(f"shape {s['label']}: {s['reason']}")
        suite.out.line(_describe(s))
    unknown = [s["label"] for s in gpus if s["link_width"] is None or s["ecc_mode"] is None]
    verdict = "FAIL" if failures else "PASS"
    summary = "; ".join(failures) or (
        f"{len(gpus)} x {usual}"
        + (f", {most_links} NVLinks each" if most_links else "")
        + (f" ({', '.join(unknown)}: some facts unreadable)" if unknown else "")
    )
    return {
        "verdict": verdict,
        "summary": summary,
        "nvml_gpu_count": seen,
        "expected_gpus": expected,
        "gpus": gpus,
        "failures": failures,
        "expect_model": a.expect_model,
        "expect_nvlinks": a.expect_nvlinks,
        "expect_mig": a.expect_mig,
    }


def _below(s: "dict[str, Any]") -> bool:
    """Whether the link runs below its maximum in generation or width (as read)."""
    return any(
        now is not None and top is not None and now < top
        for now, top in ((s["link_gen"], s["max_link_gen"]), (s["link_width"], s["max_link_width"]))
    )


def _link_problems(s: "dict[str, Any]", judge_gen: bool = True) -> "list[str]":
    """What is wrong with the PCIe link; an idle GPU's lower generation is not judged where
    no load ran (``--prolog``): idle GPUs drop it to save power."""
    out = []
    width, max_width = s["link_width"], s["max_link_width"]
    if width is not None and max_width and width < max_width:
        out.append(f"PCIe x{s['link_width']}, capable of x{s['max_link_width']}")
    if (
        judge_gen
        and s["link_gen"] is not None
        and s["max_link_gen"]
        and s["link_gen"] < s["max_link_gen"]
    ):
        out.append(
            f"PCIe Gen{s['link_gen']} under load, capable of Gen{s['max_link_gen']}"
            if s.get("read_under_load")
            else f"PCIe Gen{s['link_gen']}, capable of Gen{s['max_link_gen']}"
        )
    return out


def _read_under_load(suite: "Suite", i: int) -> "dict[str, Any]":
    """The link generation and width while GPU i multiplies matrices: an idle GPU may drop to
    Gen1 to save power, which is not a link that trained down."""
    torch = suite.torch
    try:
        if not torch.cuda.is_available():
            return {}
        device = torch.device("cuda", i)
        x = torch.randn(4096, 4096, device=device)
        y = torch.empty_like(x)
        t0 = time.monotonic()
        while time.monotonic() - t0 < LOAD_S:
            for _ in range(8):
                torch.mm(x, x, out=y)
            torch.cuda.synchronize(device)
        gen, width, _, _ = suite.nvml.pcie(i) if suite.nvml else (None,) * 4
        del x, y
        return {"link_gen": gen, "link_width": width, "read_under_load": True}
    except Exception:  # an unusable GPU shows up in the other sections; keep the idle reading
        return {}


def _describe(s: "dict[str, Any]") -> str:
    def flag(v: Any) -> str:
        return "?" if v is None else ("on" if v else "off")

    link = (
        f"PCIe Gen{s['link_gen']} x{s['link_width']} (max Gen{s['max_link_gen']} "
        f"x{s['max_link_width']})"
    )
    nvl = "no NVLink" if s["nvlinks"] is None else f"NVLink {s['nvlinks_active']}/{s['nvlinks']}"
    return (
        f"{s['label']} {s['name']} at {s['pci']}: {link}, {nvl}, ECC {flag(s['ecc_mode'])}, "
        f"persistence {flag(s['persistence'])}, MIG {flag(s['mig'])}  {s['verdict']}"
        + (f" ({s['reason']})" if s["reason"] else "")
    )
