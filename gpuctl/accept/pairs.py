"""The bad node among many: all-reduce between pairs of nodes, then bisection to the node or the
link that is slow or failing (``gpuctl accept --pairs``).

A cluster's all-reduce is as fast as its slowest link, and a job over 512 nodes that hangs or
crawls says nothing about which node to drain. This pass finds it in two rounds of pair tests,
each pair one all-reduce between two nodes (the suite's [DDP] all-reduce: every element checked,
its bus bandwidth timed), the pairs of a round run at once:

1. the nodes in disjoint pairs (01-02, 03-04, ...). A pair is bad when its all-reduce failed or
   its bus bandwidth is below ``slow`` (half) of the best pair's;
2. each node of a bad pair (and the odd node out) is tested again with a node of a good pair. A
   node still bad with a good partner is the bad node; a bad pair whose two nodes are both good
   with good partners is named as the link between them.

``find_bad(nodes, run_pair)`` holds the logic, over any ``run_pair`` (tests give it their own);
``slurm_pairs`` runs each pair as a two-node Slurm job of the suite, its [DDP] all-reduce alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from gpuctl.workloads.accept_suite.schema import SECTIONS

SLOW = 0.5  # a pair below this fraction of the best pair's bus bandwidth is slow


@dataclass(frozen=True, slots=True)
class PairResult:
    """One pair's all-reduce: ``ok`` when it ran and every element was right, its bus
    bandwidth (GB/s; None when it did not run), ``why`` it failed, the ``round`` it ran in."""

    nodes: tuple[str, str]
    ok: bool
    busbw: float | None = None
    why: str | None = None
    round: int = 1

    def text(self) -> str:
        pair = "-".join(self.nodes)
        if not self.ok:
            return f"{pair} failed: {self.why or 'no result'}"
        return f"{pair} {self.busbw or 0:.3f} GB/s"


RunPair = Callable[[str, str, int], Awaitable[PairResult]]


def _bad(r: PairResult, best: float | None, slow: float) -> bool:
    return not r.ok or (best is not None and (r.busbw or 0.0) < slow * best)


async def find_bad(nodes: list[str], run_pair: RunPair, *, slow: float = SLOW) -> dict[str, Any]:
    """Test ``nodes`` in pairs and bisect; the pass's report (see the module docstring):
    ``pairs`` (every pair tested), ``best_busbw``, ``bad_nodes`` (node -> evidence),
    ``bad_links`` ([{nodes, evidence}]), ``untested`` and ``verdict`` (PASS | FAIL)."""
    if len(nodes) < 2:
        raise ValueError("--pairs needs two nodes or more")
    first = [(a, b) for a, b in zip(nodes[0::2], nodes[1::2], strict=False)]
    results = await _all(run_pair(a, b, 1) for a, b in first)
    best = max((r.busbw for r in results if r.ok and r.busbw), default=None)
    bad_pairs = [r for r in results if _bad(r, best, slow)]
    good = [n for r in results if not _bad(r, best, slow) for n in r.nodes]
    suspects = [n for r in bad_pairs for n in r.nodes]
    if len(nodes) % 2:
        suspects.append(nodes[-1])  # the odd node out, not tested yet
    second: list[PairResult] = []
    untested: list[str] = []
    if good:
        # Waves in which each good node partners one suspect at most: two pairs sharing a node
        # at once would measure their contention, not the suspect.
        for start in range(0, len(suspects), len(good)):
            wave = suspects[start : start + len(good)]
            second += await _all(run_pair(s, g, 2) for s, g in zip(wave, good, strict=False))
    else:
        untested = suspects  # every pair bad: no good node to test against
    by_suspect = {r.nodes[0]: r for r in second}
    bad_nodes: dict[str, str] = {}
    for s, r in by_suspect.items():
        if _bad(r, best, slow):
            first_pair = next((p for p in bad_pairs if s in p.nodes), None)
            with_first = f"; {first_pair.text()}" if first_pair else ""
            bad_nodes[s] = f"{r.text()} (a good partner){with_first}" + _best_text(best)
    bad_links = []
    for p in bad_pairs:
        if all(n in by_suspect and n not in bad_nodes for n in p.nodes):
            partners = ", ".join(by_suspect[n].text() for n in p.nodes)
            bad_links.append(
                {
                    "nodes": list(p.nodes),
                    "evidence": f"{p.text()}, while each is good with another node ({partners})"
                    + _best_text(best),
                }
            )
    if not good:
        for n in nodes:
            bad_nodes[n] = "every pair failed or was slow: no good node to bisect with"
    failures = [f"{n}: {e}" for n, e in bad_nodes.items()]
    failures += [f"link {'-'.join(link['nodes'])}: {link['evidence']}" for link in bad_links]
    return {
        "schema": "gpuctl.accept.pairs",
        # the cluster report's keys that gpuctl.accept.results reads (exit code, drain)
        "nodes": {
            n: {"verdict": "FAIL", "failures": [f"pairs: {bad_nodes[n]}"]}
            if n in bad_nodes
            else {"verdict": "PASS", "failures": []}
            for n in nodes
        },
        "failures": failures,
        "pairs": [asdict(r) for r in results + second],
        "best_busbw": best,
        "slow_fraction": slow,
        "bad_nodes": bad_nodes,
        "bad_links": bad_links,
        "untested": untested,
        "verdict": "FAIL" if bad_nodes or bad_links else "PASS",
    }


async def _all(pairs: Iterable[Awaitable[PairResult]]) -> list[PairResult]:
    """Every pair of a round, at once; when one fails (its ``sbatch`` refused), the others are
    cancelled and waited for (their Slurm jobs cancelled) before the error goes on."""
    tasks = [asyncio.ensure_future(p) for p in pairs]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _best_text(best: float | None) -> str:
    return f"; the best pair reached {best:.3f} GB/s" if best else ""


def pair_options(options: Any) -> Any:
    """The suite's options for one pair: its [DDP] all-reduce alone, no size sweep."""
    skips = tuple(a for s in SECTIONS if s != "ddp_allreduce" for a in ("--skip", s))
    return replace(options, extra_args=(*options.extra_args, *skips, "--sweep-max", "0"))


def pair_result(a: str, b: str, round_: int, report: dict[str, Any]) -> PairResult:
    """A pair's result from its two-node run's cluster report (``gpuctl.accept.run``)."""
    nodes = report.get("nodes") or {}
    sections = [
        ((n.get("report") or {}).get("sections") or {}).get("ddp_allreduce") or {}
        for n in nodes.values()
    ]
    ran = [s for s in sections if s.get("verdict") == "PASS" and s.get("busbw_gbps")]
    if len(ran) == len(nodes) == 2:
        return PairResult((a, b), True, min(float(s["busbw_gbps"]) for s in ran), round=round_)
    why = next(
        (str(f) for n in nodes.values() for f in n.get("failures") or []),
        None,
    ) or next((str(n.get("reason")) for n in nodes.values() if n.get("reason")), None)
    return PairResult((a, b), False, None, why or "the pair gave no all-reduce", round=round_)


IN_FLIGHT = 16  # pair jobs submitted and not ended at once: a round of 500 pairs queues


def slurm_pairs(
    options: Any, start: Callable[[Any, str, str], Awaitable[Any]], in_flight: int = IN_FLIGHT
) -> RunPair:
    """``run_pair`` over Slurm: ``start(options, a, b)`` submits the two-node run
    (``gpuctl.accept.slurm.start_slurm_run``) and returns its ``AcceptRun``. At most
    ``in_flight`` pairs are submitted and not ended at once (a big round does not flood the
    controller with ``sbatch``); a pair whose wait is cancelled (another pair's submission
    failed, Ctrl-C) cancels its Slurm job, so nothing is left in the queue."""
    opts = pair_options(options)
    slots = asyncio.Semaphore(in_flight)

    async def run_pair(a: str, b: str, round_: int) -> PairResult:
        async with slots:
            run = await start(opts, a, b)
            try:
                return pair_result(a, b, round_, await run.wait())
            except asyncio.CancelledError:
                await asyncio.shield(run.cancel())
                raise

    return run_pair
