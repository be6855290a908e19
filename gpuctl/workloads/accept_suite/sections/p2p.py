"""[P2P]: the GPU-to-GPU copy bandwidth matrix inside the node. Every ordered pair copies the same
buffer (best of a few timed runs, so a busy host does not make a pair look slow); the finding is
the odd pair out: a pair below ``--p2p-floor`` (0.7) x the median of all pairs fails, naming both
GPUs and the figures. The copied data is compared too.
"""

import statistics
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuctl.workloads.accept_suite.suite import Suite

RUNS = 3  # timed runs per pair; the best counts
CPU_BYTES = 4 << 20  # the CPU stand-in's buffer (tests)


def run(suite: "Suite") -> "dict[str, Any]":
    """[P2P]: copy bandwidth of every ordered GPU pair; the pair far below the others fails."""
    torch = suite.torch
    a = suite.args
    if suite.cuda:
        devices = [(label, dev) for label, dev, _name in suite.devices()]
        nbytes = (64 << 20) if a.quick else (256 << 20)
    elif a.test_p2p_devices:
        # Test only: N host buffers stand in for N GPUs, so the matrix and its judgement run.
        devices = [(f"dev{k}", torch.device("cpu")) for k in range(a.test_p2p_devices)]
        nbytes = CPU_BYTES
    else:
        return {"verdict": "SKIP", "summary": "no GPU pairs on a CPU run", "pairs": []}
    if len(devices) < 2:
        return {"verdict": "SKIP", "summary": f"{len(devices)} GPU: no pair to copy between"}
    threads = torch.get_num_threads()
    if not suite.cuda:
        # One thread copies host memory steadily; a team of threads on a shared CPU waits for
        # its slowest member and turns a 4 MiB copy into a lottery.
        torch.set_num_threads(1)
    try:
        return _matrix(suite, devices, nbytes)
    finally:
        torch.set_num_threads(threads)


def _matrix(suite: "Suite", devices: "list[tuple[str, Any]]", nbytes: int) -> "dict[str, Any]":
    torch = suite.torch
    a = suite.args
    iters = 3 if a.quick else 10
    slow = _slow_pair(a.test_slow_pair)
    bufs = [
        torch.arange(nbytes // 4, dtype=torch.int32).to(dev) + k
        for k, (_label, dev) in enumerate(devices)
    ]
    labels = [label for label, _dev in devices]
    pairs: list[dict[str, Any]] = []
    for i, (src_label, src_dev) in enumerate(devices):
        for j, (dst_label, dst_dev) in enumerate(devices):
            if i == j:
                continue
            dst = torch.empty(nbytes // 4, dtype=torch.int32, device=dst_dev)
            repeat = 8 if (i, j) == slow else 1
            best = None
            for _ in range(RUNS):
                seconds = _timed_copies(suite, dst, bufs[i], iters * repeat, src_dev, dst_dev)
                gbps = nbytes * iters / seconds / 1e9
                best = gbps if best is None else max(best, gbps)
            peer = None
            if suite.cuda:
                peer = bool(torch.cuda.can_device_access_peer(src_dev.index, dst_dev.index))
            pairs.append(
                {
                    "src": src_label,
                    "dst": dst_label,
                    "gbps": round(best or 0.0, 3),
                    "peer_access": peer,
                    # compared where the copy landed: no trip through host memory
                    "data_ok": bool(torch.equal(dst, bufs[i].to(dst_dev))),
                }
            )
            del dst
    median = statistics.median(p["gbps"] for p in pairs)
    failures = []
    for p in pairs:
        p["fraction"] = round(p["gbps"] / median, 3) if median else None
        problems = []
        if not p["data_ok"]:
            problems.append("copied data differs")
        if p["fraction"] is not None and p["fraction"] < a.p2p_floor:
            problems.append(
                f"{p['gbps']:.2f} GB/s is {p['fraction']:.2f} of the median pair "
                f"({median:.2f} GB/s; floor {a.p2p_floor:.2f})"
            )
        p["verdict"] = "FAIL" if problems else "PASS"
        p["reason"] = "; ".join(problems) or None
        if problems:
            failures.append(f"p2p {p['src']}->{p['dst']}: {p['reason']}")
    for line in matrix_lines(labels, pairs):
        suite.out.line(line)
    return {
        "verdict": "FAIL" if failures else "PASS",
        "summary": "; ".join(failures)
        or f"{len(pairs)} pairs, median {median:.2f} GB/s, slowest "
        f"{min(p['gbps'] for p in pairs):.2f} GB/s",
        "failures": failures,
        "bytes": nbytes,
        "iters": iters,
        "median_gbps": median,
        "floor": a.p2p_floor,
        "devices": labels,
        "pairs": pairs,
    }


def _timed_copies(suite: "Suite", dst: Any, src: Any, n: int, src_dev: Any, dst_dev: Any) -> float:
    suite.sync(src_dev)
    suite.sync(dst_dev)
    t0 = time.perf_counter()
    for _ in range(n):
        dst.copy_(src, non_blocking=True)
    suite.sync(src_dev)
    suite.sync(dst_dev)
    return max(time.perf_counter() - t0, 1e-9)


def _slow_pair(text: "str | None") -> "tuple[int, int] | None":
    if not text:
        return None
    a, b = text.split(",")
    return int(a), int(b)


def matrix_lines(labels: "list[str]", pairs: "list[dict[str, Any]]") -> "list[str]":
    """The matrix as text: rows are sources, columns destinations, GB/s; a failing pair is
    marked with ``!``."""
    cell = {(p["src"], p["dst"]): p for p in pairs}
    width = max(8, *(len(x) + 1 for x in labels))
    out = ["GB/s src\\dst".ljust(width + 4) + "".join(x.rjust(width) for x in labels)]
    for s in labels:
        row = []
        for d in labels:
            p = cell.get((s, d))
            mark = "!" if p is not None and p["verdict"] == "FAIL" else ""
            text = "-" if p is None else f"{p['gbps']:.1f}{mark}"
            row.append(text.rjust(width))
        out.append(s.ljust(width + 4) + "".join(row))
    return out
