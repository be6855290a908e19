"""How long resolving SSH options takes for K nodes out of a big ssh config.

gpuctl asks OpenSSH (``ssh -G``) once per host and caches the answer; it used to let asyncssh
parse the whole file per host, and filtered big files to the host's blocks to make that
bearable. This measures, for a config of N ``Host`` blocks:

- cold: ``resolve_many`` of K hosts (``ssh -G`` each, a few at a time);
- warm: the same again (cache hits: a stat of the config files per host);
- asyncssh: ``SSHClientConnectionOptions(config=[file])`` per host, what gpuctl did before
  without its filter (for comparison).

    python3 benchmarks/ssh_resolve.py            # N = 100, 1000, 5000; K = 64
    python3 benchmarks/ssh_resolve.py --blocks 2000 --hosts 256
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl.reach import options  # noqa: E402
from gpuctl.reach.options import SshSettings, resolve_many  # noqa: E402


def write_config(path: Path, blocks: int) -> None:
    lines = ["# generated", "ConnectTimeout 7", ""]
    for i in range(blocks):
        lines += [f"Host n{i:05d}", f"    HostName 10.{i // 65536}.{i // 256 % 256}.{i % 256}"]
        lines += [f"    Port {2000 + i % 1000}", "    User u"]
    lines += ["Host *", "    ServerAliveInterval 9"]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, nargs="*", default=[100, 1000, 5000])
    ap.add_argument("--hosts", type=int, default=64)
    args = ap.parse_args()
    import asyncssh

    with tempfile.TemporaryDirectory(prefix="gpuctl-bench-") as tmp:
        empty = Path(tmp) / "empty"
        empty.write_text("")
        os.environ[options.SYSTEM_CONFIG_ENV] = str(empty)
        print("blocks | hosts | ssh -G cold | warm (cached) | asyncssh parse per host")
        for n in args.blocks:
            cfg = Path(tmp) / f"config-{n}"
            write_config(cfg, n)
            hosts = [f"n{i * max(1, n // args.hosts):05d}" for i in range(min(n, args.hosts))]
            s = SshSettings(ssh_config=str(cfg))
            options.clear_cache()
            t0 = time.perf_counter()
            got = resolve_many(hosts, s)
            cold = time.perf_counter() - t0
            assert all(isinstance(v, options.SshTarget) for v in got.values()), got
            t0 = time.perf_counter()
            resolve_many(hosts, s)
            warm = time.perf_counter() - t0
            t0 = time.perf_counter()
            for h in hosts:
                asyncssh.SSHClientConnectionOptions(config=[str(cfg)], host=h)
            parse = time.perf_counter() - t0
            print(
                f"{n:>6} | {len(hosts):>5} | {cold:.3f} s | {warm:.4f} s | {parse:.3f} s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
