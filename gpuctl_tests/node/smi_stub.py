"""A stand-in ``nvidia-smi`` for the tests, and the recorded output it replays.

``install(bin_dir, data_path, data)`` writes an executable ``nvidia-smi`` into ``bin_dir`` that
answers ``--query-gpu``, ``--query-compute-apps``, ``--version`` and the plain banner from the
JSON ``data`` the way the real tool does with ``--format=csv,noheader,nounits``: one line per
GPU, values joined by ", ", the bracketed forms ([N/A], [Not Supported], ...) as recorded, and
``Field "x" is not a valid field to query.`` with exit status 2 for a field this "driver" does
not know. The recorded values below were taken from an H100 SXM node (driver 550) and an RTX
4090 workstation; serials and UUIDs are made up.

Data keys: ``gpus`` (list of {field: raw text}), ``apps`` (list of [gpu_uuid, pid, used MiB]),
``valid`` (the fields this driver accepts; default: every recorded one), ``version`` (text of
``--version``, or None for a driver too old to have it), ``banner`` (plain ``nvidia-smi``),
``lost`` (indices of GPUs whose every value but the index reads "[GPU is lost]"), ``fail`` (every
call prints this and exits 9, like a node whose driver is not loaded).
"""

from __future__ import annotations

import copy
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

DATA_ENV = "GPUCTL_SMI_STUB"

H100: dict[str, str] = {
    "index": "0",
    "uuid": "GPU-3b5f2a10-8c1e-4f7a-9d2b-6e0c1a7f4b21",
    "name": "NVIDIA H100 80GB HBM3",
    "serial": "1654023018827",
    "driver_version": "550.54.15",
    "memory.total": "81559",
    "memory.used": "73911",
    "utilization.gpu": "97",
    "utilization.memory": "61",
    "utilization.encoder": "0",
    "utilization.decoder": "23",
    "temperature.gpu": "71",
    "power.draw": "688.42",
    "power.limit": "700.00",
    "clocks.sm": "1755",
    "clocks.current.sm": "1755",
    "clocks.mem": "2619",
    "clocks.current.memory": "2619",
    "clocks.max.sm": "1980",
    "clocks.max.memory": "2619",
    "fan.speed": "[N/A]",
    "pstate": "P0",
    "clocks_event_reasons.active": "0x0000000000000004",
    "clocks_throttle_reasons.active": "0x0000000000000004",
    "pcie.link.gen.max": "5",
    "pcie.link.width.max": "16",
    "mig.mode.current": "Disabled",
    "ecc.errors.corrected.volatile.total": "0",
    "ecc.errors.uncorrected.volatile.total": "0",
    "ecc.errors.corrected.aggregate.total": "12",
    "ecc.errors.uncorrected.aggregate.total": "0",
    "retired_pages.single_bit_ecc.count": "[N/A]",
    "retired_pages.double_bit.count": "[N/A]",
    "retired_pages.pending": "[N/A]",
    "remapped_rows.correctable": "0",
    "remapped_rows.uncorrectable": "0",
    "remapped_rows.pending": "No",
    "remapped_rows.failure": "No",
}

RTX4090: dict[str, str] = {
    **H100,
    "index": "1",
    "uuid": "GPU-9a0e7c44-12d3-4b8e-a5f6-0b7d3c2e1f90",
    "name": "NVIDIA GeForce RTX 4090",
    "serial": "[N/A]",
    "memory.total": "24564",
    "memory.used": "[Unknown Error]",
    "utilization.gpu": "3",
    "utilization.memory": "1",
    "utilization.encoder": "[Not Supported]",
    "utilization.decoder": "4",
    "temperature.gpu": "38",
    "power.draw": "[Not Supported]",
    "power.limit": "450.00",
    "clocks.sm": "210",
    "clocks.current.sm": "210",
    "clocks.mem": "405",
    "clocks.current.memory": "405",
    "clocks.max.sm": "3120",
    "clocks.max.memory": "10501",
    "fan.speed": "30",
    "pstate": "P8",
    "clocks_event_reasons.active": "0x0000000000000001",
    "clocks_throttle_reasons.active": "0x0000000000000001",
    "pcie.link.gen.max": "4",
    "mig.mode.current": "[N/A]",
    "ecc.errors.corrected.volatile.total": "[N/A]",
    "ecc.errors.uncorrected.volatile.total": "[N/A]",
    "ecc.errors.corrected.aggregate.total": "[N/A]",
    "ecc.errors.uncorrected.aggregate.total": "[N/A]",
    "remapped_rows.correctable": "[N/A]",
    "remapped_rows.uncorrectable": "[N/A]",
    "remapped_rows.pending": "[N/A]",
    "remapped_rows.failure": "[N/A]",
}

VERSION = """NVIDIA-SMI version  : 550.54.15
NVML version        : 550.54
DRIVER version      : 550.54.15
CUDA Version        : 12.4
"""

BANNER = """Thu Nov 19 10:02:11 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
"""

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running."
)


def default_data() -> dict[str, Any]:
    """Two recorded GPUs (H100, RTX 4090), no processes, a driver-550 nvidia-smi."""
    return {
        "gpus": [copy.deepcopy(H100), copy.deepcopy(RTX4090)],
        "apps": [],
        "version": VERSION,
        "banner": BANNER,
    }


SCRIPT = r"""
import json, os, sys

def main(argv):
    data_path = os.environ["GPUCTL_SMI_STUB"]
    with open(data_path) as f:
        data = json.load(f)
    if data.get("fail"):
        print(data["fail"])
        return 9
    gpus = data["gpus"]
    valid = set(data.get("valid") or [k for g in gpus for k in g])
    query = [a for a in argv if a.startswith("--query-")]
    if not argv:
        sys.stdout.write(data.get("banner") or "")
        return 0
    if argv == ["--version"]:
        if data.get("version") is None:
            print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
            return 2
        sys.stdout.write(data["version"])
        return 0
    if len(query) != 1 or "--format=csv,noheader,nounits" not in argv:
        print("stub nvidia-smi: unexpected arguments %r" % (argv,))
        return 2
    kind, _, fields = query[0][len("--query-"):].partition("=")
    fields = fields.split(",")
    if kind == "compute-apps":
        for f in fields:
            if f not in ("gpu_uuid", "pid", "used_memory"):
                print('Field "%s" is not a valid field to query.' % f)
                return 2
        for uuid, pid, mem in data.get("apps", []):
            row = {"gpu_uuid": uuid, "pid": str(pid), "used_memory": str(mem)}
            print(", ".join(row[f] for f in fields))
        return 0
    if kind != "gpu":
        print("stub nvidia-smi: unknown query %r" % (kind,))
        return 2
    for f in fields:
        if f not in valid:
            print('Field "%s" is not a valid field to query.' % f)
            print("")
            return 2
    lost = set(data.get("lost") or ())
    for i, g in enumerate(gpus):
        gone = i in lost
        print(", ".join(
            g.get(f, "[N/A]") if not gone or f == "index" else "[GPU is lost]" for f in fields))
    return 0

sys.exit(main(sys.argv[1:]))
"""


def install(bin_dir: Path, data_path: Path, data: dict[str, Any]) -> Path:
    """Write the stand-in ``nvidia-smi`` into ``bin_dir`` and its data; returns the script."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    write_data(data_path, data)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!{sys.executable} -S\n{SCRIPT}")  # -S: no site, quick start
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def write_data(data_path: Path, data: dict[str, Any]) -> None:
    """Replace the recorded data; the next nvidia-smi run replays it."""
    tmp = data_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, data_path)  # atomic: a run in flight never reads half a file
