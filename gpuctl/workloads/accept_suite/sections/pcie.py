"""[PCIE]: host-device bandwidth both ways against the link's theoretical rate."""

from typing import TYPE_CHECKING, Any

from gpuctl.workloads.accept_suite import peaks

if TYPE_CHECKING:
    from gpuctl.workloads.accept_suite.suite import Suite


def run(suite: "Suite") -> "dict[str, Any]":
    """[PCIE]: host-device bandwidth both ways against the link's theoretical rate."""
    if not suite.cuda:
        return {"verdict": "SKIP", "summary": "no host-device link on a CPU run", "devices": []}
    torch = suite.torch
    a = suite.args
    nbytes = (256 << 20) if a.quick else (1 << 30)
    host = torch.empty(nbytes // 4, dtype=torch.int32).pin_memory()
    host.copy_(torch.arange(nbytes // 4, dtype=torch.int32))
    back = torch.empty_like(host).pin_memory()
    results, failures = [], []
    for label, device, _name in suite.devices():
        dev = torch.empty(nbytes // 4, dtype=torch.int32, device=device)
        dev.copy_(host, non_blocking=True)
        suite.sync(device)
        iters = 3 if a.quick else 10
        figures = {}
        with torch.cuda.device(device):
            for direction, dst, src in (("h2d", dev, host), ("d2h", back, dev)):
                begin, finish = suite.timer(device)
                begin()
                for _ in range(iters):
                    dst.copy_(src, non_blocking=True)
                figures[direction] = nbytes * iters / finish() / 1e9
        gen, width, max_gen, max_width = (
            suite.nvml.pcie(device.index) if suite.nvml else (None,) * 4
        )
        peak = peaks.pcie_peak(gen, width)
        r = {
            "index": device.index,
            "label": label,
            "h2d_gbps": figures["h2d"],
            "d2h_gbps": figures["d2h"],
            "link_gen": gen,
            "link_width": width,
            "max_link_gen": max_gen,
            "max_link_width": max_width,
            "peak_gbps": peak,
            "fraction": None,
            "verdict": "PASS",
            "reason": None,
        }
        if not torch.equal(back, host):
            r["verdict"], r["reason"] = "FAIL", "data changed on the round trip"
        elif peak:
            r["fraction"] = min(figures.values()) / peak
            if r["fraction"] < a.pcie_floor:
                r["verdict"] = "FAIL"
                r["reason"] = (
                    f"{min(figures.values()):.1f} GB/s is {r['fraction']:.2f} of gen{gen} "
                    f"x{width} ({peak:.1f} GB/s; floor {a.pcie_floor:.2f})"
                )
            elif max_gen and max_width and (gen, width) < (max_gen, max_width):
                r["verdict"] = "WARN"
                r["reason"] = (
                    f"link runs gen{gen} x{width}, the GPU supports gen{max_gen} x{max_width}"
                )
        del dev
        results.append(r)
        suite.out.line(
            "{} h2d {:.1f} GB/s, d2h {:.1f} GB/s, link gen{} x{}  {}{}".format(
                label,
                r["h2d_gbps"],
                r["d2h_gbps"],
                gen,
                width,
                r["verdict"],
                " ({})".format(r["reason"]) if r["reason"] else "",
            )
        )
        if r["verdict"] == "FAIL":
            failures.append(f"pcie {label}: {r['reason']}")
    verdict = (
        "FAIL" if failures else ("WARN" if any(r["verdict"] == "WARN" for r in results) else "PASS")
    )
    summary = ", ".join(
        f"{r['label']} {r['h2d_gbps']:.1f}/{r['d2h_gbps']:.1f} GB/s" for r in results
    )
    return {
        "verdict": verdict,
        "summary": summary,
        "devices": results,
        "floor": a.pcie_floor,
        "failures": failures,
    }
