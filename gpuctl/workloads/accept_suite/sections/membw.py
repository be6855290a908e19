"""[MEMBW]: device memory copy bandwidth against the datasheet."""

from typing import TYPE_CHECKING, Any

from gpuctl.workloads.accept_suite import peaks

if TYPE_CHECKING:
    from gpuctl.workloads.accept_suite.suite import Suite


def run(suite: "Suite") -> "dict[str, Any]":
    """[MEMBW]: device memory copy bandwidth against the datasheet."""
    torch = suite.torch
    a = suite.args
    results, failures = [], []
    for label, device, name in suite.devices():
        if suite.cuda:
            free, _total = torch.cuda.mem_get_info(device)
            nbytes = min((512 << 20) if a.quick else (2 << 30), free // 4)
        else:
            nbytes = (64 << 20) if a.quick else (256 << 20)
        numel = nbytes // 4
        src = torch.arange(numel, device=device, dtype=torch.int32)
        dst = torch.empty_like(src)
        dst.copy_(src)
        begin, finish = suite.timer(device)
        begin()
        dst.copy_(src)
        one = max(finish(), 1e-6)
        iters = int(min(1000, max(3, (0.3 if a.quick else 2.0) / one)))
        dst.zero_()
        begin()
        for _ in range(iters):
            dst.copy_(src)
        seconds = finish()
        gbps = 2.0 * nbytes * iters / seconds / 1e9  # each byte read once and written once
        r = {
            "index": device.index,
            "label": label,
            "name": name,
            "bytes": nbytes,
            "iters": iters,
            "gbps": gbps,
            "peak_gbps": None,
            "fraction": None,
            "verdict": "PASS",
            "reason": None,
        }
        if not torch.equal(dst, src):
            r["verdict"], r["reason"] = "FAIL", "copy differs from its source"
        elif suite.cuda:
            peak = peaks.peak_membw(name)
            r["peak_gbps"] = peak
            if peak:
                r["fraction"] = gbps / peak
                if r["fraction"] < a.membw_floor:
                    r["verdict"] = "FAIL"
                    r["reason"] = (
                        f"{gbps:.0f} GB/s is {r['fraction']:.2f} of the {peak:g} GB/s spec "
                        f"(floor {a.membw_floor:.2f})"
                    )
        del src, dst
        results.append(r)
        frac = f" = {r['fraction']:.2f} of {r['peak_gbps']:g}" if r["fraction"] else ""
        suite.out.line(
            "{} copy {:.1f} GB/s{}  {}{}".format(
                label,
                gbps,
                frac,
                r["verdict"],
                " ({})".format(r["reason"]) if r["reason"] else "",
            )
        )
        if r["verdict"] == "FAIL":
            failures.append(f"membw {label}: {r['reason']}")
    summary = ", ".join(f"{r['label']} {r['gbps']:.1f} GB/s" for r in results)
    return {
        "verdict": "FAIL" if failures else "PASS",
        "summary": summary,
        "devices": results,
        "floor": a.membw_floor,
        "failures": failures,
    }
