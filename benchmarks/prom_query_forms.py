"""What the store pays for the forms of a poll's queries: each query of this tree's
``gpuctl/fleet/prom.py`` and of a baseline tree's that differs from it, timed on one
Prometheus, alternated.

MIG support (issue 29) changed three forms: the stamp query and the utilisation query take a
MIG instance's ``DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!=""}`` beside ``GPU_UTIL`` (``or``), and
the memory queries sum a GPU's instances (``sum by (max by (.., GPU_I_ID))``; since the
detail screen lists the instances, a poll asks them per instance, ``max by (.., GPU_I_ID)``,
and gpuctl sums). A whole poll's
wall time (``prom_scale.py --baseline``) moves with how many hosts a poll finds moved, which
the phase of the scrapes decides; this times the queries alone, every host asked.

Debian's ``/usr/bin/prometheus`` scrapes ``--targets`` stand-in exporters serving ``--nodes`` x
``--gpus`` GPUs (DCGM exporter's default counters gpuctl reads, plus GR_ENGINE_ACTIVE, which the
default set collects: no GPU in MIG mode, a site's common case) every ``--scrape`` seconds;
each differing query is then asked ``--rounds`` times, this tree's and the baseline's in turn
(which first alternates), and the medians and their ratio printed; a query the baseline has
not is timed alone.

Usage: python benchmarks/prom_query_forms.py --baseline TREE [--nodes 1024] [--gpus 8]
       [--rounds 15] [--scrape 15] [--targets 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from prom_scale import READ, load_baseline, render  # noqa: E402

from gpuctl.fleet import prom as this_prom  # noqa: E402
from gpuctl_tests.harness.prometheus import (  # noqa: E402
    prometheus,
    serve_metrics,
)

SERVED = READ | {"DCGM_FI_PROF_GR_ENGINE_ACTIVE"}


def ask(url: str, promql: str) -> float:
    """Seconds for one instant query (its answer read whole)."""
    data = urllib.parse.urlencode({"query": promql}).encode()
    t = time.perf_counter()
    with urllib.request.urlopen(url + "/api/v1/query", data=data, timeout=60) as r:
        body = r.read()
    took = time.perf_counter() - t
    assert json.loads(body)["status"] == "success"
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", metavar="TREE", required=True)
    p.add_argument("--nodes", type=int, default=1024)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--scrape", type=float, default=15.0)
    p.add_argument("--targets", type=int, default=8)
    args = p.parse_args()
    base = load_baseline(args.baseline)
    this_q = {m.label if m else "stamp": q for m, q in this_prom.queries("")}
    base_q = {m.label if m else "stamp": q for m, q in base.queries("")}
    # a query this tree added is timed against none (0 s): what a poll pays more
    pairs = [(k, q, base_q.get(k)) for k, q in this_q.items() if q != base_q.get(k)]
    hosts = [f"gpu{n:05d}" for n in range(args.nodes)]
    share = -(-len(hosts) // args.targets)
    bodies = [render(hosts[i : i + share], args.gpus, SERVED) for i in range(0, len(hosts), share)]
    servers = [serve_metrics(lambda body=body: body) for body in bodies]
    gpus = args.nodes * args.gpus
    try:
        targets = [f"127.0.0.1:{s.server_address[1]}" for s in servers]
        with prometheus(targets, scrape_interval=args.scrape) as store:
            for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"):
                store.wait_for(f"count({name}) >= {gpus}", 1, timeout=900)
            print(f"{store.url} holds {gpus} GPUs; timing", file=sys.stderr, flush=True)
            times: dict[str, dict[str, list[float]]] = {
                q: {"this": [], "baseline": []} for q, _n, _o in pairs
            }
            for n in range(args.rounds):
                for label, new, old in pairs:
                    for name in ("this", "baseline") if n % 2 else ("baseline", "this"):
                        q = new if name == "this" else old
                        times[label][name].append(ask(store.url, q) if q else 0.0)
    finally:
        for s in servers:
            s.shutdown()
    result = {}
    for label, t in times.items():
        this, old = statistics.median(t["this"]), statistics.median(t["baseline"])
        result[label] = {
            "this_ms": round(this * 1000, 1),
            "baseline_ms": round(old * 1000, 1),
            "this_over_baseline": round(this / old, 2) if old else None,
        }
    print(json.dumps({"gpus": gpus, "rounds": args.rounds, "queries": result}, indent=1))


if __name__ == "__main__":
    main()
