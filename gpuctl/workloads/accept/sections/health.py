"""[HEALTH]: ECC, remapped rows, XIDs and throttling read from NVML."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuctl.workloads.accept.suite import Suite

BAD_THROTTLE = ("hw_slowdown", "hw_thermal", "hw_power_brake")
WARN_THROTTLE = ("sw_thermal",)


def run(suite: "Suite") -> "dict[str, Any]":
    """[HEALTH]: ECC, remapped rows, XIDs and throttling read from NVML."""
    if not suite.cuda:
        return {"verdict": "SKIP", "summary": "no GPU on a CPU run (NVML not read)", "gpus": []}
    if suite.nvml is None or suite.nvml.nv is None:
        why = suite.nvml.error if suite.nvml else "NVML not opened"
        return {"verdict": "SKIP", "summary": f"NVML unavailable ({why})", "gpus": []}
    suite.nvml.poll_xids()
    gpus, failures, warns = [], [], []
    for g in suite.gpus:
        i = g["index"]
        h = suite.nvml.health(i)
        h.update(
            index=i,
            xids=sorted(set(suite.nvml.xids.get(i, []))),
            throttle=sorted(suite.nvml.throttle.get(i, ())),
            verdict="PASS",
            reason=None,
        )
        problems = []
        if h["ecc_uncorrected_volatile"]:
            problems.append(f"{int(h['ecc_uncorrected_volatile'])} uncorrectable ECC errors")
        rows = h["remapped_rows"] or {}
        if rows.get("pending"):
            problems.append("row remapping pending (reset the GPU)")
        if rows.get("failure"):
            problems.append("row remapping failed")
        if h["xids"]:
            problems.append(f"XID {','.join(str(x) for x in h['xids'])} during the run")
        hw = [t for t in h["throttle"] if t in BAD_THROTTLE]
        if hw:
            problems.append(f"throttled during COMPUTE: {','.join(hw)}")
        soft = [t for t in h["throttle"] if t in WARN_THROTTLE]
        if problems:
            h["verdict"], h["reason"] = "FAIL", "; ".join(problems)
            failures.append(f"health gpu{i}: {h['reason']}")
        elif soft:
            h["verdict"], h["reason"] = (
                "WARN",
                f"throttled during COMPUTE: {','.join(soft)}",
            )
            warns.append(i)
        gpus.append(h)
        suite.out.line(
            f"gpu{i} ECC uncorrected {h['ecc_uncorrected_volatile']}, "
            f"remapped rows {rows or None}, XID {h['xids'] or 'none'}, "
            f"throttle {','.join(h['throttle']) or 'none'}  {h['verdict']}"
            + (f" ({h['reason']})" if h["reason"] else "")
        )
    verdict = "FAIL" if failures else ("WARN" if warns else "PASS")
    return {
        "verdict": verdict,
        "gpus": gpus,
        "failures": failures,
        "summary": "; ".join(failures) or f"{len(gpus)} GPU(s) healthy",
    }
