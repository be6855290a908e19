"""Decode benchmark: CPU per agent line on the login side, this checkout against another tree.

Builds a sample line of ``--gpus`` simulated GPUs (the simulated reader of this checkout, a few
samples in, with processes, parents and host: what an agent writes, ~5.4 KB for 8 GPUs) and
decodes it the way each tree's links do, in one process, alternating the two ``--rounds`` times
(on a shared machine the CPU a run takes drifts by several percent within a minute: only
alternated runs compare):

* new: ``gpuctl.fleet.session.decode_line`` (msgspec straight into the model's Structs),
  of the line in protocol 1's shape and (``new, protocol 2``) in protocol 2's (nulls and what
  the hello holds left out; the GPUs filled from the hello's statics as a session does),
* old: ``protocol.decode(line, lenient=True)`` then ``session.decode_sample`` of the tree given
  by ``--old`` (a checkout of an older revision, e.g. ``git worktree add /tmp/old 3285137``);
  that tree's GPU processes were read only when first looked into, so its figure leaves them
  out (the new one reads them all); or, for a tree that has it (1679462 on), its
  ``session.decode_line``: what its links do,

and the same for the same line with one bad field (a string for a GPU's temperature: the first
GPU's, and ``last GPU`` the last one's): the lenient slow path. ``--old`` may be given more than
once: each tree is one more column of "old" cases in the same alternated rounds. Prints the
median microseconds of CPU (``time.process_time``) per line of each, and the ratios.

Usage: python benchmarks/decode.py --old /tmp/old-msgspec [--old /tmp/older] [--gpus 8]
       [--rounds 7] [--n 2000]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


WARM = (
    b'{"type":"sample","t":1,"gpus":[{"index":0,"temp":"x","ecc":{"a":"x"},"processes":'
    b'[{"pid":"x"}]}],"parents":[{"pid":"x"}],"host":{"cpu":"x"}}'
)


def _import_tree(tree: Path, forget: bool) -> dict[str, Any]:
    """The decoders of the gpuctl in ``tree``, imported under the name ``gpuctl``; ``forget``:
    then forgotten by ``sys.modules`` (the functions keep their modules: the old tree's
    dataclasses need nothing more), so that the next tree imports afresh into one process."""
    for name in [m for m in sys.modules if m == "gpuctl" or m.startswith("gpuctl.")]:
        del sys.modules[name]
    sys.path.insert(0, str(tree))
    try:
        session = importlib.import_module("gpuctl.fleet.session")
        protocol = importlib.import_module("gpuctl.node.protocol")
        sim = importlib.import_module("gpuctl.node.readers.sim")
        found = {
            "session": session,
            "model": importlib.import_module("gpuctl.core.model"),
            "msgspec": importlib.import_module("msgspec"),
            "protocol": protocol,
            "sim": sim,
            "file": importlib.import_module("gpuctl").__file__,
        }
        if forget and hasattr(session, "decode_line"):
            # A tree whose model is msgspec Structs: msgspec resolves their annotations when it
            # first reads them, by their module's name, which names the other tree's module
            # once this one is forgotten: resolve them now (a GPU with bad fields everywhere).
            session.decode_line(WARM)
    finally:
        sys.path.remove(str(tree))
        if forget:
            for name in [m for m in sys.modules if m == "gpuctl" or m.startswith("gpuctl.")]:
                del sys.modules[name]
    return found


def sample_lines(new: dict[str, Any], gpus: int) -> tuple[bytes, bytes, Any]:
    """One sample as protocol 1 sent it and as protocol 2 does (``compact_gpus``), and the
    hello's statics that the second is decoded with."""
    reader = new["sim"].SimReader.from_spec(f"{gpus}:H100", seed=3)
    for _ in range(5):
        reader.sample()
    msg = {
        "type": "sample",
        "t": time.time(),
        "seq": 5,
        "gpus": reader.sample(),
        "parents": reader.parents(),
        "host": reader.host(),
    }
    protocol = new["protocol"]
    line: bytes = protocol.encode(msg)
    compact = {
        **msg,
        "gpus": protocol.compact_gpus(msg["gpus"], reader.static()),
        "parents": protocol.compact_records(msg["parents"]),
    }
    info = new["model"].NodeInfo(
        protocol=2,
        gpus=tuple(new["msgspec"].convert(st, new["model"].GpuStatic) for st in reader.static()),
    )
    return line, protocol.encode(compact), new["session"].statics(info)


def per_line_us(decode: Callable[[bytes], object], line: bytes, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        decode(line)
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--old", type=Path, action="append", required=True, help="an older tree to compare"
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--n", type=int, default=2000, help="lines decoded per timed run")
    args = parser.parse_args()

    olds = [_import_tree(tree.resolve(), forget=True) for tree in args.old]
    new = _import_tree(REPO, forget=False)  # msgspec reads a Struct's module for its types
    line, line2, hello = sample_lines(new, args.gpus)
    bad = line.replace(b'"temp":', b'"temp":"hot","was":', 1)
    at = line.rfind(b'"temp":')
    bad_last = line[:at] + b'"temp":"hot","was":' + line[at + len(b'"temp":') :]
    bad2 = line2.replace(b'"temp":', b'"temp":"hot","was":', 1)
    processes = sum(len(g.processes) for g in new["session"].decode_line(line).gpus)

    def old_decoder(old: dict[str, Any]) -> Callable[[bytes], object]:
        if hasattr(old["session"], "decode_line"):  # a tree whose links decode with msgspec
            return old["session"].decode_line  # type: ignore[no-any-return]

        def old_decode(text: bytes) -> object:
            return old["session"].decode_sample(old["protocol"].decode(text, lenient=True))

        return old_decode

    def new_decode2(text: bytes) -> object:
        return new["session"].decode_line(text, hello)

    cases: dict[str, tuple[Callable[[bytes], object], bytes]] = {
        "new": (new["session"].decode_line, line),
        "new, protocol 2": (new_decode2, line2),
        "new, one bad field": (new["session"].decode_line, bad),
        "new, p2, bad field": (new_decode2, bad2),
        "new, bad in last GPU": (new["session"].decode_line, bad_last),
    }
    for k, old in enumerate(olds, 1):
        cases[f"old {k}"] = (old_decoder(old), line)
        cases[f"old {k}, one bad field"] = (old_decoder(old), bad)
        cases[f"old {k}, bad in last GPU"] = (old_decoder(old), bad_last)
    for decode, text in cases.values():  # both decode the same line to the same readings
        got = decode(text)
        assert getattr(got, "gpus", None), (text[:80], got)
    assert new_decode2(line2) == new["session"].decode_line(line)
    # the readings both trees know are the same (a later tree may know more: the registry's)
    for k in range(1, len(olds) + 1):
        for text in (line, bad, bad_last):
            old_gpus = cases[f"old {k}"][0](text).gpus  # type: ignore[attr-defined]
            new_gpus = new["session"].decode_line(text).gpus
            for og, ng in zip(old_gpus, new_gpus, strict=True):
                shared = [f for f in ng.__struct_fields__ if hasattr(og, f)]
                assert [repr(getattr(og, f)) for f in shared] == [
                    repr(getattr(ng, f)) for f in shared
                ]
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (decode, text) in cases.items():
            times[name].append(per_line_us(decode, text, args.n))
    print(f"new: {new['file']}")
    for k, old in enumerate(olds, 1):
        print(f"old {k}: {old['file']}")
    print(
        f"one sample line: {args.gpus} GPUs, {len(line)} bytes in protocol 1, {len(line2)} in "
        f"protocol 2 (the same readings), {processes} GPU processes; "
        f"{args.rounds} alternated rounds of {args.n} lines, us of CPU per line (median)"
    )
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, us in med.items():
        print(f"  {name:24s} {us:8.1f} us   (rounds: {', '.join(f'{t:.1f}' for t in times[name])})")
    for k in range(1, len(olds) + 1):
        for what, case in (
            ("valid line", ""),
            ("one bad field", ", one bad field"),
            ("bad in last GPU", ", bad in last GPU"),
        ):
            ratio = med[f"old {k}{case}"] / med[f"new{case}"]
            print(f"  old {k} / new, {what}: {ratio:.2f}x")
    print(f"  new protocol 2 / protocol 1: {med['new, protocol 2'] / med['new']:.2f}x")


if __name__ == "__main__":
    main()
