"""[COMPUTE]: GEMM throughput per device and dtype, its result checked against float64."""

from typing import TYPE_CHECKING, Any

from gpuctl.workloads.accept_suite import peaks

if TYPE_CHECKING:
    from gpuctl.workloads.accept_suite.suite import Suite


def gemm_size(suite: "Suite") -> int:
    """The GEMM size: 8192 on a GPU, smaller on the CPU (quick runs smaller still)."""
    if suite.cuda:
        return 8192
    return 512 if suite.args.quick else 1024


def measure_gemm(
    suite: "Suite", device: Any, dtype: str, n: int, min_seconds: float, slow: int = 1
) -> "dict[str, Any]":
    """Time C = A @ B on preallocated matrices; returns figures and the result check.

    ``slow`` (test option) runs each timed product that many times while counting it once.
    """
    torch = suite.torch
    tdtype = {
        "fp32": torch.float32,
        "tf32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
    }[dtype]
    gen = torch.Generator(device=device).manual_seed(42)
    a = torch.rand(n, n, generator=gen, device=device, dtype=torch.float32).sub_(0.5).to(tdtype)
    b = torch.rand(n, n, generator=gen, device=device, dtype=torch.float32).sub_(0.5).to(tdtype)
    c = torch.empty(n, n, device=device, dtype=tdtype)
    first = torch.empty_like(c)
    old_tf32 = None
    if device.type == "cuda":
        old_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        torch.mm(a, b, out=first)
        for _ in range(2):  # warm-up: kernels chosen, clocks up
            torch.mm(a, b, out=c)
        begin, finish = suite.timer(device)
        begin()
        torch.mm(a, b, out=c)
        one = max(finish(), 1e-6)
        if device.type == "cuda":  # let clocks and power settle before the timed loop
            for _ in range(int(min(10000, 0.5 * min_seconds / one))):
                torch.mm(a, b, out=c)
        iters = int(min(10000, max(3, min_seconds / one)))
        begin()
        for _ in range(iters):
            for _ in range(slow):
                torch.mm(a, b, out=c)
        seconds = finish()
        check = check_gemm(suite, a, b, c, first, dtype)
    finally:
        if old_tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = old_tf32
    tflops = 2.0 * n**3 * iters / seconds / 1e12
    return {
        "dtype": dtype,
        "n": n,
        "iters": iters,
        "seconds": seconds,
        "tflops": tflops,
        "check": check,
    }


def check_gemm(suite: "Suite", a: Any, b: Any, c: Any, first: Any, dtype: str) -> "str | None":
    """None when C is right: finite, identical to the first product, close to float64."""
    torch = suite.torch
    if not bool(torch.isfinite(c).all()):
        return "result has NaN or Inf"
    if not torch.equal(c, first):
        diff = int((c != first).sum().item())
        return f"repeated product differs from the first in {int(diff)} elements"
    rows = min(16, a.shape[0])
    ref = a[:rows].double() @ b.double()
    err = float((c[:rows].double() - ref).norm() / ref.norm().clamp_min(1e-30))
    tol = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 2e-2, "fp16": 5e-3}[dtype]
    if err > tol:
        return f"relative error {err:.2e} against float64 exceeds {tol:.0e}"
    return None


def run(suite: "Suite") -> "dict[str, Any]":
    """[COMPUTE]: GEMM TFLOP/s per device and dtype, checked, against peaks and siblings."""
    a = suite.args
    min_seconds = (0.5 if a.quick else 3.0) if suite.cuda else (0.25 if a.quick else 1.0)
    if suite.nvml is not None:
        suite.nvml.start_throttle_watch()
    devices: list[dict[str, Any]] = []
    try:
        for label, device, name in suite.devices():
            entry: dict[str, Any] = {
                "index": device.index if suite.cuda else None,
                "label": label,
                "name": name,
                "model_key": peaks.model_key(name) if suite.cuda else None,
                "results": [],
            }
            devices.append(entry)
            for dtype in a.dtypes:
                r = compute_one(suite, device, name, dtype, min_seconds)
                entry["results"].append(r)
                suite.out.line(compute_line(label, r))
    finally:
        if suite.nvml is not None:
            suite.nvml.stop_throttle_watch()
    judge_same_model(devices, a.same_model_tolerance)
    failures: list[str] = []
    warnings: list[str] = []
    for d in devices:
        for r in d["results"]:
            if r["verdict"] == "FAIL":
                failures.append(f"compute {d['label']} {r['dtype']}: {r['reason']}")
            elif r["verdict"] == "WARN":
                warnings.append(f"compute {d['label']} {r['dtype']}: {r['reason']}")
    best: dict[str, float] = {}
    for d in devices:
        for r in d["results"]:
            if r.get("tflops"):
                best[r["dtype"]] = max(best.get(r["dtype"], 0.0), r["tflops"])
    summary = ", ".join(f"{k} {v:.3g} TFLOP/s" for k, v in best.items()) or "nothing ran"
    return {
        "verdict": "FAIL" if failures else ("WARN" if warnings else "PASS"),
        "summary": summary,
        "devices": devices,
        "floor": a.floor,
        "floors": a.floors,
        "same_model_tolerance": a.same_model_tolerance,
        "failures": failures,
        "warnings": warnings,
    }


def compute_one(
    suite: "Suite", device: Any, name: str, dtype: str, min_seconds: float
) -> "dict[str, Any]":
    """One device and dtype: measured, checked, judged against its peak."""
    torch = suite.torch
    base: dict[str, Any] = {
        "dtype": dtype,
        "n": None,
        "iters": None,
        "seconds": None,
        "tflops": None,
        "peak_tflops": None,
        "fraction": None,
        "floor": None,
        "floor_source": None,
        "check": None,
        "reason": None,
    }
    if device.type == "cpu" and dtype == "tf32":
        return dict(base, verdict="SKIP", reason="no TF32 on the CPU")
    if device.type == "cuda" and (
        not peaks.has_unit(name, dtype) or (dtype == "bf16" and not torch.cuda.is_bf16_supported())
    ):
        return dict(base, verdict="SKIP", reason=f"{name} has no {dtype} unit")
    r = dict(base)
    r.update(
        measure_gemm(
            suite, device, dtype, gemm_size(suite), min_seconds, suite.args.test_slow_compute
        )
    )
    if r["check"] is not None:
        return dict(r, verdict="FAIL", reason=f"wrong result: {r['check']}")
    if device.type == "cpu":
        return dict(r, verdict="PASS", reason="result checked (CPU: no peak judged)")
    return judge_peak(r, name, suite.args.floors, suite.args.floor)


def judge_peak(
    r: "dict[str, Any]",
    name: str,
    floors: "dict[str, dict[str, float]] | None",
    uniform: "float | None",
) -> "dict[str, Any]":
    """A measured GEMM figure against its model's peak and floor (per model and dtype).

    A model gpuctl has no peak for is a WARN that carries the figure: never a silent pass.
    """
    dtype = r["dtype"]
    peak = peaks.peak_tflops(name, dtype)
    r["peak_tflops"] = peak
    if peak is None:
        return dict(
            r,
            verdict="WARN",
            reason=f"{name}: measured {r['tflops']:.1f} TFLOP/s, not judged: no reference "
            "peak for this model",
        )
    key = peaks.model_key(name)
    floor, source = peaks.floor_for(key, dtype, floors, uniform)
    r["fraction"] = r["tflops"] / peak
    r["floor"], r["floor_source"] = floor, source
    if r["fraction"] < floor:
        return dict(
            r,
            verdict="FAIL",
            reason=f"{r['tflops']:.1f} TFLOP/s is {r['fraction']:.2f} of the {key} {dtype} "
            f"peak {peak:g} (floor {floor:.2f}, {source})",
        )
    return dict(r, verdict="PASS")


def judge_same_model(devices: "list[dict[str, Any]]", tol: float) -> None:
    """A GPU more than the tolerance below the best GPU of its model on this node fails."""
    groups: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for d in devices:
        for r in d["results"]:
            if r.get("tflops"):
                groups.setdefault((d["name"], r["dtype"]), []).append((d, r))
    for (_name, _dtype), members in groups.items():
        if len(members) < 2:
            continue
        best = max(r["tflops"] for _, r in members)
        for d, r in members:
            if r["tflops"] < (1.0 - tol) * best and r["verdict"] != "FAIL":
                r["verdict"] = "FAIL"
                r["reason"] = (
                    f"{r['tflops']:.1f} TFLOP/s is {100 * (1 - r['tflops'] / best):.0f}% "
                    f"below the best {d['name']} here ({best:.1f})"
                )


def compute_line(label: str, r: "dict[str, Any]") -> str:
    """The human line of one result."""
    if r["tflops"] is None:
        return f"{label} {r['dtype']:4} {r['verdict']}: {r['reason']}"
    frac = f" = {r['fraction']:.2f} of {r['peak_tflops']:g}" if r["fraction"] else ""
    why = f" ({r['reason']})" if r.get("reason") else ""
    return f"{label} {r['dtype']:4} {r['tflops']:8.3f} TFLOP/s{frac}  {r['verdict']}{why}"
