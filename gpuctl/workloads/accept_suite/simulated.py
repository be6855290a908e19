"""A simulated acceptance run (``--device sim``): every section of the suite, judged by the
real sections' rules (floors of peak, the same-model rule, XIDs and throttling in [HEALTH]), on
figures made from a simulated node's GPUs as its agent reads them at the start (model, PCIe
link, SM clock, heat throttling, XIDs, lost GPUs; ``SimReader.accept_facts``).

It is what ``gpuctl demo`` runs on ``a``: the demo needs no torch, and its story shows in the
verdicts (the burning GPU's clock held down by heat is slower than its siblings, the XID fails
[HEALTH]). Every summary starts with "simulated", the report's device is "sim" (the history keeps
it apart from real runs) and it travels the real path: progress events, the JSON report, the
pane and the history. No torch, no GPU: nothing here is measured.
"""

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuctl.node.metrics import throttle_badges

from . import peaks
from .sections.health import BAD_THROTTLE, WARN_THROTTLE

if TYPE_CHECKING:
    from .suite import Suite

EFFICIENCY = 0.8  # a healthy simulated GPU reaches this fraction of its datasheet peak
MEMBW_EFFICIENCY = 0.85
PCIE_EFFICIENCY = 0.8
P2P_GBPS = {True: 250.0, False: 20.0}  # NVLink-class SXM parts vs PCIe cards, per pair
BUSBW_GBPS = {True: 340.0, False: 18.0}
TRAIN_STEPS = 50
Runner = Callable[["Suite"], "dict[str, Any]"]


def runners(facts_path: str) -> "dict[str, Runner]":
    """The sections' runners over the simulated GPUs described in ``facts_path`` (JSON)."""
    with open(facts_path) as f:
        facts: list[dict[str, Any]] = json.load(f)
    gpus = [g for g in facts if not g.get("lost")]

    def env(suite: "Suite") -> "dict[str, Any]":
        expected = suite.args.expect_gpus
        want = expected if expected is not None else len(facts)
        suite.gpus = [{"index": g["index"], "name": g["name"]} for g in gpus]
        suite.no_gpu = not gpus
        names = sorted({g["name"] for g in gpus})
        failures = []
        if len(gpus) < want:
            failures.append(f"env: {len(gpus)} GPUs visible, {want} expected")
        summary = f"simulated: {len(gpus)} GPUs ({', '.join(names) or 'none'})"
        return {
            "verdict": "FAIL" if failures else "PASS",
            "summary": "; ".join(failures) or summary,
            "failures": failures,
            "hostname": suite.node,  # the simulated node, not the machine running it
            "python": sys.executable,
            "torch": None,
            "cuda": None,
            "driver": facts[0].get("driver") if facts else None,
            "nccl": None,
            "gpu_count": len(gpus),
            "expected_gpus": want,
            "gpus": [
                {
                    "index": g["index"],
                    "name": g["name"],
                    "uuid": g.get("uuid"),
                    "model_key": peaks.model_key(g["name"]),
                    "memory_bytes": g.get("mem_total"),
                }
                for g in gpus
            ],
            "nvidia_smi_l": [],
        }

    def shape(suite: "Suite") -> "dict[str, Any]":
        want = suite.args.expect_model
        rows, failures = [], []
        for g in gpus:
            bad = want is not None and want.lower() not in g["name"].lower()
            reason = f"{g['name']} is not {want}" if bad else None
            if bad:
                failures.append(f"shape gpu{g['index']}: {reason}")
            rows.append(
                {
                    "index": g["index"],
                    "label": f"gpu{g['index']}",
                    "name": g["name"],
                    "pci": None,
                    "link_gen": g.get("pcie_gen"),
                    "link_width": g.get("pcie_width"),
                    "max_link_gen": g.get("pcie_gen"),
                    "max_link_width": g.get("pcie_width"),
                    "read_under_load": False,
                    "nvlinks": None,
                    "nvlinks_active": None,
                    "ecc_mode": "enabled",
                    "ecc_pending": False,
                    "persistence": True,
                    "mig": "off",
                    "mig_pending": False,
                    "verdict": "FAIL" if bad else "PASS",
                    "reason": reason,
                }
            )
        return {
            "verdict": "FAIL" if failures else "PASS",
            "summary": "; ".join(failures) or f"simulated: {len(rows)} GPUs as expected",
            "failures": failures,
            "gpus": rows,
            "expect_model": want,
            "expect_nvlinks": suite.args.expect_nvlinks,
            "expect_mig": suite.args.expect_mig,
        }

    def compute(suite: "Suite") -> "dict[str, Any]":
        a = suite.args
        devices, failures = [], []
        best: dict[tuple[str, str], float] = {}
        for g in gpus:
            clock = min(1.0, g["sm_clock"] / g["max_sm_clock"]) if g.get("max_sm_clock") else 1.0
            results = []
            for dtype in a.dtypes:
                peak = peaks.peak_tflops(g["name"], dtype)
                if peak is None or not peaks.has_unit(g["name"], dtype):
                    continue
                key = peaks.model_key(g["name"])
                floor, source = peaks.floor_for(key, dtype, a.floors, a.floor)
                tflops = round(peak * EFFICIENCY * clock, 1)
                best[(g["name"], dtype)] = max(best.get((g["name"], dtype), 0.0), tflops)
                results.append(
                    {
                        "dtype": dtype,
                        "n": None,
                        "iters": None,
                        "seconds": None,
                        "tflops": tflops,
                        "peak_tflops": peak,
                        "fraction": round(tflops / peak, 3),
                        "floor": floor,
                        "floor_source": source,
                        "check": None,
                        "verdict": "PASS",
                        "reason": None,
                    }
                )
            devices.append(
                {
                    "index": g["index"],
                    "label": f"gpu{g['index']}",
                    "name": g["name"],
                    "model_key": peaks.model_key(g["name"]),
                    "results": results,
                }
            )
        for d in devices:
            for r in d["results"]:
                top = best[(d["name"], r["dtype"])]
                if r["fraction"] < r["floor"]:
                    r["reason"] = f"{r['fraction']:.0%} of peak, below the floor {r['floor']:.0%}"
                elif r["tflops"] < top * (1 - a.same_model_tolerance):
                    r["reason"] = f"{1 - r['tflops'] / top:.0%} below the best {d['name']}"
                if r["reason"]:
                    r["verdict"] = "FAIL"
                    failures.append(f"compute {d['label']} {r['dtype']}: {r['reason']}")
                suite.out.line(
                    f"{d['label']} {r['dtype']} {r['tflops']:g} TFLOP/s "
                    f"({r['fraction']:.0%} of peak) {r['verdict']}"
                )
        summary = "; ".join(failures) or (
            f"simulated: {len(devices)} GPUs x {','.join(a.dtypes)} at {EFFICIENCY:.0%} of peak"
        )
        return {
            "verdict": "FAIL" if failures else "PASS",
            "summary": summary,
            "failures": failures,
            "devices": devices,
            "floor": a.floor,
            "floors": a.floors,
            "same_model_tolerance": a.same_model_tolerance,
            "warnings": [],
        }

    def membw(suite: "Suite") -> "dict[str, Any]":
        rows = []
        for g in gpus:
            peak = peaks.peak_membw(g["name"])
            gbps = None if peak is None else round(peak * MEMBW_EFFICIENCY, 1)
            rows.append(
                _row(
                    g,
                    bytes=None,
                    gbps=gbps,
                    peak_gbps=peak,
                    fraction=MEMBW_EFFICIENCY if peak else None,
                )
            )
        return _passed(rows, f"{MEMBW_EFFICIENCY:.0%} of the datasheet's GB/s")

    def memtest(suite: "Suite") -> "dict[str, Any]":
        rows = [
            _row(
                g,
                bytes=int((g.get("mem_total") or 0) * 0.9),
                patterns=4,
                gbps=None,
                wrong_words=0,
                first_bad=None,
            )
            for g in gpus
        ]
        return _passed(rows, "90% of each GPU's memory, no wrong word")

    def pcie(suite: "Suite") -> "dict[str, Any]":
        rows = []
        for g in gpus:
            peak = peaks.pcie_peak(g.get("pcie_gen"), g.get("pcie_width"))
            rate = None if peak is None else round(peak * PCIE_EFFICIENCY, 1)
            rows.append(
                _row(
                    g,
                    h2d_gbps=rate,
                    d2h_gbps=rate,
                    link_gen=g.get("pcie_gen"),
                    link_width=g.get("pcie_width"),
                    peak_gbps=peak,
                    fraction=PCIE_EFFICIENCY if peak else None,
                )
            )
        return _passed(rows, f"{PCIE_EFFICIENCY:.0%} of each link's GB/s")

    def p2p(suite: "Suite") -> "dict[str, Any]":
        if len(gpus) < 2:
            return {"verdict": "SKIP", "summary": "simulated: one GPU, no pair"}
        gbps = P2P_GBPS[_sxm(gpus)]
        pairs = [
            {
                "src": f"gpu{s['index']}",
                "dst": f"gpu{d['index']}",
                "gbps": gbps,
                "peer_access": True,
                "data_ok": True,
                "fraction": 1.0,
                "verdict": "PASS",
                "reason": None,
            }
            for s in gpus
            for d in gpus
            if s is not d
        ]
        return {
            "verdict": "PASS",
            "summary": f"simulated: {len(pairs)} pairs at {gbps:g} GB/s",
            "bytes": None,
            "iters": None,
            "median_gbps": gbps,
            "floor": suite.args.p2p_floor,
            "devices": [f"gpu{g['index']}" for g in gpus],
            "pairs": pairs,
        }

    def train(suite: "Suite") -> "dict[str, Any]":
        rows = [_loss({"index": g["index"]}) for g in gpus]
        return _passed(rows, f"{TRAIN_STEPS} steps cut the loss by 80% on each GPU")

    def burn(suite: "Suite") -> "dict[str, Any]":
        if not suite.args.burn:
            return {"verdict": "SKIP", "summary": "no --burn duration (e.g. --burn 10m)"}
        return {"verdict": "SKIP", "summary": "simulated: no sustained burn in a simulated run"}

    def allreduce(suite: "Suite") -> "dict[str, Any]":
        if len(gpus) < 2:
            return {"verdict": "SKIP", "summary": "simulated: one GPU, no collective"}
        busbw = BUSBW_GBPS[_sxm(gpus)]
        n = len(gpus)
        return {
            "verdict": "PASS",
            "summary": f"simulated: all-reduce over {n} ranks, busbw {busbw:g} GB/s",
            "world_size": n,
            "nnodes": 1,
            "backend": "simulated",
            "numel": None,
            "bytes": None,
            "iters": None,
            "algbw_gbps": round(busbw * n / (2 * (n - 1)), 1),
            "busbw_gbps": busbw,
            "ranks": [
                {"rank": i, "host": suite.node, "ok": True, "mismatches": 0} for i in range(n)
            ],
            "topology": f"{n}x1",
            "sweep": None,
            "sweep_busbw_gbps": None,
            "busbw_floor_gbps": None,
        }

    def ddp_train(suite: "Suite") -> "dict[str, Any]":
        if len(gpus) < 2:
            return {"verdict": "SKIP", "summary": "simulated: one GPU, no DDP"}
        ranks = [{**_loss({"rank": i}), "ok": True} for i in range(len(gpus))]
        return {
            "verdict": "PASS",
            "summary": f"simulated: {len(ranks)} ranks, identical parameters after "
            f"{TRAIN_STEPS} steps",
            "world_size": len(ranks),
            "steps": TRAIN_STEPS,
            "ranks": ranks,
            "params_identical": True,
        }

    def health(suite: "Suite") -> "dict[str, Any]":
        rows, failures, warns = [], [], []
        for g in gpus:
            xids = sorted(set(g.get("xids") or []))
            throttle = sorted(g.get("throttle") or [])
            problems = [f"XID {','.join(map(str, xids))} during the run"] if xids else []
            hw = [t for t in throttle if t in BAD_THROTTLE]
            if hw:
                problems.append(f"throttled during COMPUTE: {' '.join(throttle_badges(hw))}")
            soft = [t for t in throttle if t in WARN_THROTTLE]
            verdict, reason = "PASS", None
            if problems:
                verdict, reason = "FAIL", "; ".join(problems)
                failures.append(f"health gpu{g['index']}: {reason}")
            elif soft:
                soft_words = " ".join(throttle_badges(soft))
                verdict, reason = "WARN", f"throttled during COMPUTE: {soft_words}"
                warns.append(f"health gpu{g['index']}: {reason} at {g.get('temp')} C")
            rows.append(
                {
                    "index": g["index"],
                    "ecc_uncorrected_volatile": 0,
                    "ecc_uncorrected_aggregate": 0,
                    "remapped_rows": {
                        "correctable": 0,
                        "uncorrectable": 0,
                        "pending": False,
                        "failure": False,
                    },
                    "xids": xids,
                    "throttle": throttle,
                    "temp": g.get("temp"),  # what the GPU read when the run judged it
                    "retired_pending": False,
                    "pci": None,
                    "kernel_xids": [],
                    "aer": None,
                    "verdict": verdict,
                    "reason": reason,
                }
            )
            suite.out.line(
                f"gpu{g['index']} XID {xids or 'none'}, throttle "
                f"{' '.join(throttle_badges(throttle)) or 'none'}  {verdict}"
            )
        verdict = "FAIL" if failures else ("WARN" if warns else "PASS")
        return {
            "verdict": verdict,
            "summary": "; ".join(failures + warns) or f"simulated: {len(rows)} GPU(s) healthy",
            "failures": failures,
            "warnings": warns,
            "gpus": rows,
            "kernel_log": None,
            "kernel_log_error": "simulated: no kernel log",
            "node_xids": [],
        }

    return {
        "env": env,
        "shape": shape,
        "compute": compute,
        "membw": membw,
        "memtest": memtest,
        "pcie": pcie,
        "p2p": p2p,
        "train": train,
        "burn": burn,
        "ddp_allreduce": allreduce,
        "ddp_train": ddp_train,
        "health": health,
    }


def _row(gpu: "dict[str, Any]", **fields: Any) -> "dict[str, Any]":
    """One GPU's passing row of a section: its index, label and name, then ``fields``."""
    head = {"index": gpu["index"], "label": f"gpu{gpu['index']}", "name": gpu["name"]}
    return {**head, **fields, "verdict": "PASS", "reason": None}


def _passed(rows: "list[dict[str, Any]]", what: str) -> "dict[str, Any]":
    return {"verdict": "PASS", "summary": f"simulated: {what}", "devices": rows}


def _loss(row: "dict[str, Any]") -> "dict[str, Any]":
    return {
        **row,
        "steps": TRAIN_STEPS,
        "first_loss": 2.3,
        "final_loss": 0.46,
        "drop": 0.8,
        "verdict": "PASS",
        "reason": None,
    }


def _sxm(gpus: "list[dict[str, Any]]") -> bool:
    """Whether the GPUs are NVLink-class parts (SXM: H100, H200, A100), not PCIe cards."""
    return all("SXM" in (peaks.model_key(g["name"]) or "") for g in gpus)
