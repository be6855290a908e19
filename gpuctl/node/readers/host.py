"""The node's host beside its GPUs: CPU busy %, memory, load average and network rate.

Read from /proc/stat, /proc/meminfo, /proc/loadavg and /proc/net/dev: four small files per
sample, each opened once and read again from its start with ``pread`` (opening the four for
every sample, each into a 1 MiB buffer, cost 0.12 ms of the agent's CPU per sample). CPU % and the network rates are differences between two samples, so the first sample
has none (null). The loopback interface is left out of the network rate: it is not traffic to
other nodes. Python 3.6, standard library only; a file that cannot be read makes its fields
null, never an error.

A file is read with one ``pread`` when it fits (a short read is its end): asking again for the
end of a /proc file makes the kernel generate it a second time (/proc/stat walks every CPU
and interrupt). The CPU count (``os.cpu_count()`` reads /sys/devices/system/cpu/online each
time: 9 us of the 59 us ``sample`` cost here, 0.06 ms on an H100's VM) is read again every
``CPUS_EVERY_S``, and /proc/loadavg every ``LOAD_EVERY_S``: the kernel computes the load
averages every 5 s, so a read in between mostly repeats the last one. Under /proc a file kept open is never checked for removal (an ``fstat``
each: 0.015 ms on that VM, where any system call costs 0.01-0.03 ms at 1 Hz).
"""

import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..proc import KeptOpen

CPUS_EVERY_S = 60.0  # the CPU count is read again this often (CPUs going on- or offline)
LOAD_EVERY_S = 5.0  # /proc/loadavg is read again this often (the kernel's own period)
HOST_FIELDS = ("cpu", "cpus", "mem_total", "mem_available", "load", "net_rx", "net_tx")


class HostStats(object):
    """``sample()`` returns the sample's ``host`` dict (``HOST_FIELDS``): ``cpu`` (% of all
    CPUs busy since the last sample), ``cpus`` (count), ``mem_total`` and ``mem_available``
    (bytes), ``load`` ([1, 5, 15] minute load averages), ``net_rx`` and ``net_tx`` (bytes/s
    since the last sample, every interface but loopback)."""

    def __init__(self, root: str = "/proc",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._root = root
        self._clock = clock
        self._cpu = None  # type: Optional[Tuple[int, int]]  # busy, total jiffies
        self._net = None  # type: Optional[Tuple[int, int, float]]  # rx, tx bytes, when
        # a test's tree has its files replaced; /proc's are never
        self._files = KeptOpen(replaceable=os.path.abspath(root) != "/proc")
        self._cpus = None  # type: Optional[Tuple[Optional[int], float]]  # count, when read
        self._load = None  # type: Optional[Tuple[Optional[List[float]], float]]  # ..., when

    def _read(self, name: str) -> Optional[str]:
        """The file's text (at most 1 MiB), read through a descriptor kept open."""
        data = self._files.read(os.path.join(self._root, name))
        return None if data is None else data.decode("ascii", "replace")

    def close(self) -> None:
        """Close the files kept open."""
        self._files.close()

    def __del__(self) -> None:
        self.close()

    def sample(self) -> Dict[str, Any]:
        out = dict.fromkeys(HOST_FIELDS)  # type: Dict[str, Any]
        out["cpus"] = self._cpu_count()
        out["cpu"] = self._cpu_percent(self._read("stat"))
        out.update(_meminfo(self._read("meminfo")))
        out["load"] = self._load_averages()
        out["net_rx"], out["net_tx"] = self._net_rates(self._read("net/dev"))
        return out

    def _cpu_count(self) -> Optional[int]:
        now = self._clock()
        if self._cpus is None or not 0 <= now - self._cpus[1] < CPUS_EVERY_S:
            self._cpus = (os.cpu_count(), now)
        return self._cpus[0]

    def _load_averages(self) -> Optional[List[float]]:
        now = self._clock()
        if self._load is None or not 0 <= now - self._load[1] < LOAD_EVERY_S:
            self._load = (_loadavg(self._read("loadavg")), now)
        load = self._load[0]
        return list(load) if load is not None else None

    def _cpu_percent(self, text: Optional[str]) -> Optional[float]:
        if not text:
            return None
        start = 0 if text.startswith("cpu ") else text.find("\ncpu ") + 1
        if not start and not text.startswith("cpu "):
            return None
        end = text.find("\n", start)
        try:
            ticks = [int(x) for x in text[start:end if end >= 0 else None].split()[1:9]]
        except ValueError:
            return None
        total = sum(ticks)
        busy = total - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)  # idle, iowait
        before, self._cpu = self._cpu, (busy, total)
        if before is None or total <= before[1]:
            return None
        return round(100.0 * max(0, busy - before[0]) / (total - before[1]), 1)

    def _net_rates(self, text: Optional[str]) -> Tuple[Optional[float], Optional[float]]:
        if not text:
            return None, None
        rx = tx = 0
        for line in text.splitlines()[2:]:
            name, _, rest = line.partition(":")
            fields = rest.split()
            if name.strip() == "lo" or len(fields) < 9:
                continue
            try:
                rx += int(fields[0])
                tx += int(fields[8])
            except ValueError:
                continue
        now = self._clock()
        before, self._net = self._net, (rx, tx, now)
        if before is None or now <= before[2]:
            return None, None
        dt = now - before[2]
        # a counter that went back (an interface gone, a wrap) is no rate
        return (round((rx - before[0]) / dt, 1) if rx >= before[0] else None,
                round((tx - before[1]) / dt, 1) if tx >= before[1] else None)


def _meminfo(text: Optional[str]) -> Dict[str, Optional[int]]:
    return {"mem_total": _meminfo_kb(text or "", "MemTotal"),
            "mem_available": _meminfo_kb(text or "", "MemAvailable")}


def _meminfo_kb(text: str, key: str) -> Optional[int]:
    """Bytes of one ``Key:   123 kB`` line of /proc/meminfo, None when absent or malformed."""
    at = 0 if text.startswith(key + ":") else text.find("\n" + key + ":") + 1
    if not at and not text.startswith(key + ":"):
        return None
    end = text.find("\n", at)
    try:
        return int(text[at + len(key) + 1:end if end >= 0 else None].split()[0]) * 1024
    except (ValueError, IndexError):
        return None


def _loadavg(text: Optional[str]) -> Optional[List[float]]:
    try:
        return [float(x) for x in (text or "").split()[:3]] or None
    except ValueError:
        return None
