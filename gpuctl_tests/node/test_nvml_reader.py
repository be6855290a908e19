"""The NVML reader over the real nvidia-ml-py and a stand-in libnvidia-ml.so.1 built with gcc."""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl.node.protocol import SAMPLE_FIELDS, SLOW_EVERY, STATIC_FIELDS
from gpuctl.node.readers import ReaderUnavailable, open_reader
from gpuctl.node.readers.nvml import PCIE_EVERY, NvmlReader
from gpuctl_tests.helpers import AgentProcess
from gpuctl_tests.node.nvml_stub import CONFIG_ENV, NvmlStub

MIB = 1 << 20


@pytest.fixture
def stub(nvml_lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NvmlStub:
    """A stub loaded into this process, scripted by this test's config file."""
    s = NvmlStub(nvml_lib_dir, tmp_path / "nvml.conf")
    s.preload()
    monkeypatch.setenv(CONFIG_ENV, str(s.config))
    return s


@pytest.fixture
def reader(stub: NvmlStub) -> Iterator[Any]:
    """Yields a function that scripts the stub and opens a reader on it (closed afterwards)."""
    opened: list[NvmlReader] = []

    def open_with(text: str) -> NvmlReader:
        stub.configure(text)
        r = NvmlReader.open()
        opened.append(r)
        return r

    yield open_with
    for r in opened:
        r.close()


def by_index(gpus: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {g["index"]: g for g in gpus}


def test_versions_and_static_facts_come_from_the_library(reader: Any) -> None:
    r = reader(
        "count 3\nname 1 NVIDIA A100-SXM4-80GB\nset 2 mig 1\ndriver 535.183.01\ncuda 12020\n"
    )
    assert r.name == "nvml"
    assert r.versions() == {"driver": "535.183.01", "cuda": "12.2", "nvml": "12.550.54.15"}
    static = r.static()
    assert [s["index"] for s in static] == [0, 1, 2]
    for s in static:
        assert set(s) == set(STATIC_FIELDS)
    assert static[0] == {
        "index": 0,
        "uuid": "GPU-5718a1c0-0000-4000-8000-000000000000",
        "name": "NVIDIA H100 80GB HBM3",
        "mem_total": 81559 * MIB,
        "power_limit": 700.0,
        "max_sm_clock": 1980,
        "max_mem_clock": 2619,
        "pcie_gen": 5,
        "pcie_width": 16,
        "mig_mode": False,
        "serial": "1650000000000",
    }
    assert static[1]["name"] == "NVIDIA A100-SXM4-80GB"
    assert static[2]["mig_mode"] is True


def test_sample_reads_every_field(reader: Any) -> None:
    me = os.getpid()
    r = reader(
        f"count 2\nset 0 throttle 0x44\nset 1 pstate 8\nset 0 ecc_agg_unc 2\n"
        f"set 1 retired_dbe 3\nset 1 rows_pending 1\n"
        f"proc 0 {me} 512\nproc 0 {me} 300 graphics\nproc 1 4194000 64 graphics\n"
    )
    gpus = by_index(r.sample(slow=True))
    for g in gpus.values():
        assert set(g) == set(SAMPLE_FIELDS)
    g0, g1 = gpus[0], gpus[1]
    assert g0["state"] == "ok"
    assert (g0["util_gpu"], g0["util_mem"], g1["util_gpu"], g1["util_mem"]) == (50, 20, 51, 21)
    assert (g0["temp"], g1["temp"]) == (40, 41)
    assert (g0["power"], g1["power"]) == (200.0, 201.0)
    assert g0["power_limit"] == 700.0
    assert (g0["mem_used"], g0["mem_total"]) == (10 * 1024 * MIB, 81559 * MIB)
    assert (g0["sm_clock"], g0["mem_clock"], g0["fan"]) == (1755, 2619, 30)
    assert (g0["pstate"], g1["pstate"]) == ("P0", "P8")
    assert g0["throttle"] == ["sw_power_cap", "hw_thermal"]
    assert g1["throttle"] == []
    assert g0["ecc"] == {
        "volatile_corrected": 0,
        "volatile_uncorrected": 0,
        "aggregate_corrected": 10,
        "aggregate_uncorrected": 2,
    }
    assert g1["retired_pages"] == {"single_bit": 0, "double_bit": 3, "pending": False}
    assert g1["remapped_rows"] == {
        "correctable": 1,
        "uncorrectable": 0,
        "pending": True,
        "failure": False,
    }
    # One entry per pid: the compute and graphics figures of this process are not both listed.
    assert len(g0["processes"]) == 1
    proc = g0["processes"][0]
    assert proc["pid"] == me and proc["mem"] == 512 * MIB
    assert proc["user"] == pwd.getpwuid(os.getuid()).pw_name
    assert "pytest" in proc["command"] or "python" in proc["command"]
    # A pid /proc does not show (another namespace, already gone): user and command unknown.
    # Its SM %: GPU 1's utilization (its only process).
    unknown = dict.fromkeys(
        ("user", "command", "uid", "ppid", "cpu", "rss", "started", "slurm_job")
    )
    assert g1["processes"] == [{"pid": 4194000, "mem": 64 * MIB, "sm": 51, **unknown}]


def test_unsupported_fields_are_null_and_hide_nothing_else(reader: Any) -> None:
    r = reader("count 2\nerror 1 3 fan power ecc throttle retired\nerror 1 4 procs\n")
    gpus = by_index(r.sample(slow=True))
    g0, g1 = gpus[0], gpus[1]
    for key in ("fan", "power", "ecc", "throttle", "retired_pages", "processes"):
        assert g1[key] is None, key
        assert g0[key] is not None, key
    # everything else on the partly unsupported GPU is still read
    assert g1["state"] == "ok"
    assert (g1["util_gpu"], g1["temp"], g1["sm_clock"], g1["power_limit"]) == (51, 41, 1755, 700.0)
    assert g1["remapped_rows"] is not None


def test_a_field_a_gpu_does_not_support_is_asked_once(reader: Any, stub: NvmlStub) -> None:
    """NOT_SUPPORTED is remembered per GPU and field (a fan-less SXM part: 0.25 ms a sample on an
    H100); another error (NO_PERMISSION here) is asked again, and other GPUs are still asked."""
    r = reader("count 2\nerror 1 3 fan retired\nerror 1 4 temp\n")
    for _ in range(4):
        g1 = by_index(r.sample(slow=True))[1]
        assert (g1["fan"], g1["retired_pages"], g1["temp"]) == (None, None, None)
        assert g1["power"] == 201.0
    assert stub.calls(1, "nvmlDeviceGetFanSpeed") == 1
    assert stub.calls(1, "nvmlDeviceGetFieldValues") == 4  # the slow readings' one call
    assert stub.calls(1, "nvmlDeviceGetTemperature") == 4
    assert stub.calls(0, "nvmlDeviceGetFanSpeed") == 4
    assert stub.calls(1, "nvmlDeviceGetPowerUsage") == 4


def test_process_utilization_is_read_only_for_gpus_with_processes_and_not_every_sample(
    reader: Any, stub: NvmlStub
) -> None:
    me = os.getpid()
    r = reader(
        f"count 3\nproc 0 {me} 512\nproc 0 4194001 64\nprocutil 0 {me} 37 5\n"
        "proc 2 4194000 64\nproc 2 4194002 64\n"
    )
    util = "nvmlDeviceGetProcessUtilization"
    r.sample(slow=False)
    first = [stub.calls(i, util) for i in range(3)]
    # GPU 2's process has no utilization sample (NOT_FOUND): not an answer to remember for good
    assert first[0] > 0 and first[1] == 0 and first[2] > 0
    for _ in range(4):  # back to back: well within PROC_UTIL_EVERY_S
        gpus = by_index(r.sample(slow=False))
        assert gpus[0]["processes"][0]["sm"] == 37  # the last answer is repeated in between
        assert gpus[0]["processes"][1]["sm"] is None  # no sample of it: ran no kernel
        assert gpus[1]["processes"] == []
    assert [stub.calls(i, util) for i in range(3)] == first
    r.proc_util_every = 0.0  # every sample is now due
    r.sample(slow=False)
    again = [stub.calls(i, util) for i in range(3)]
    assert again == [2 * first[0], 0, 2 * first[2]]


def test_process_lists_and_process_utilization_are_one_library_call_each(
    reader: Any, stub: NvmlStub
) -> None:
    """pynvml asks NVML twice for a list (its size, then the entries); the reader fills a buffer
    it keeps, once (on an H100: 0.13 ms for the compute list, 2.3 ms for the utilization)."""
    me = os.getpid()
    r = reader(f"count 1\nproc 0 {me} 512\nproc 0 4194000 64 graphics\nprocutil 0 {me} 37 5\n")
    r.proc_util_every = r.procs_every = 0.0  # read every sample
    for n in (1, 2, 3):
        procs = r.sample(slow=False)[0]["processes"]
        assert [(p["pid"], p["mem"], p["sm"]) for p in procs] == [
            (me, 512 * MIB, 37),
            (4194000, 64 * MIB, None),
        ]
        assert stub.calls(0, "nvmlDeviceGetComputeRunningProcesses_v3") == n
        assert stub.calls(0, "nvmlDeviceGetGraphicsRunningProcesses_v3") == n
        assert stub.calls(0, "nvmlDeviceGetProcessUtilization") == n


def test_more_processes_than_the_kept_buffer_are_all_listed(reader: Any, stub: NvmlStub) -> None:
    """The first read with more processes than the buffer holds (NVML: INSUFFICIENT_SIZE and
    the count) grows it and asks again; later reads are one call."""
    from gpuctl.node.readers import nvml

    pids = list(range(4194000, 4194012))  # 12: more than the first buffer, and the stub holds 16
    r = reader("count 1\n" + "".join(f"proc 0 {pid} {k + 1}\n" for k, pid in enumerate(pids)))
    r.procs_every = 0.0  # read every sample
    procs = r.sample(slow=False)[0]["processes"]
    assert [(p["pid"], p["mem"]) for p in procs] == [
        (pid, (k + 1) * MIB) for k, pid in enumerate(pids)
    ]
    assert stub.calls(0, "nvmlDeviceGetComputeRunningProcesses_v3") == 2
    assert [p["pid"] for p in r.sample(slow=False)[0]["processes"]] == pids
    assert stub.calls(0, "nvmlDeviceGetComputeRunningProcesses_v3") == 3
    assert len(pids) > nvml.PROC_BUFFER


def test_process_lists_are_read_again_when_the_used_memory_changes_or_after_a_while(
    reader: Any, stub: NvmlStub
) -> None:
    """A process that starts or ends changes the GPU's used memory (its context): while that
    stays the same, the last lists are repeated (0.1-0.2 ms a sample and GPU on an H100), at
    most PROCS_EVERY_S; the processes' host figures are still read every sample."""
    me = os.getpid()
    r = reader(f"count 2\nproc 0 {me} 512\n")
    lists = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3")
    for _ in range(4):
        gpus = by_index(r.sample(slow=False))
        assert [(p["pid"], p["mem"]) for p in gpus[0]["processes"]] == [(me, 512 * MIB)]
        assert gpus[0]["processes"][0]["rss"] and gpus[1]["processes"] == []
    assert [stub.calls(i, fn) for i in (0, 1) for fn in lists] == [1, 1, 1, 1]
    stub.set(1, "mem_used_mib", 2048)  # GPU 1's memory moved: its lists are read again, not GPU 0's
    r.sample(slow=False)
    assert [stub.calls(i, fn) for i in (0, 1) for fn in lists] == [1, 1, 2, 2]
    r.procs_every = 0.0  # the while has passed: read again, whatever the memory
    r.sample(slow=False)
    assert [stub.calls(i, fn) for i in (0, 1) for fn in lists] == [2, 2, 3, 3]


def test_unsupported_process_utilization_is_asked_once(reader: Any, stub: NvmlStub) -> None:
    me = os.getpid()
    r = reader(f"count 1\nproc 0 {me} 512\nproc 0 4194000 64\nerror 0 3 procutil\n")
    r.proc_util_every = 0.0
    for _ in range(3):
        procs = r.sample(slow=False)[0]["processes"]
        assert [(p["pid"], p["sm"]) for p in procs] == [(me, None), (4194000, None)]
    assert stub.calls(0, "nvmlDeviceGetProcessUtilization") == 1


def test_a_lone_process_has_the_gpus_utilization_without_the_per_process_call(
    reader: Any, stub: NvmlStub
) -> None:
    """One process on a GPU (a training job's rank): its SM % is the GPU's utilization of the
    same sample, and the per-process call (1.5 ms on an H100) is not made; a second process
    is asked of NVML (a pid without a sample ran no kernel: null)."""
    me = os.getpid()
    r = reader(f"count 2\nproc 0 {me} 512\nprocutil 0 {me} 37 5\nerror 1 3 procutil\n")
    r.proc_util_every = r.procs_every = 0.0  # every read due every sample
    for util in (50, 93):
        stub.set(0, "util_gpu", util)
        procs = r.sample(slow=False)[0]["processes"]
        assert [(p["pid"], p["sm"]) for p in procs] == [(me, util)]
    assert stub.calls(0, "nvmlDeviceGetProcessUtilization") == 0
    # two processes (another reader: the stub's lists are its config's): the call, its answers
    r2 = reader(f"count 1\nproc 0 {me} 512\nproc 0 4194000 64\nprocutil 0 {me} 37 5\n")
    procs = r2.sample(slow=False)[0]["processes"]
    assert [(p["pid"], p["sm"]) for p in procs] == [(me, 37), (4194000, None)]
    assert stub.calls(0, "nvmlDeviceGetProcessUtilization") == 1


def test_unreadable_static_facts_are_null(reader: Any) -> None:
    r = reader("count 2\nerror 0 3 serial pcie mig\nerror 0 4 max_clock\n")
    s0 = r.static()[0]
    assert (s0["serial"], s0["pcie_gen"], s0["pcie_width"], s0["mig_mode"]) == (None,) * 4
    assert (s0["max_sm_clock"], s0["max_mem_clock"]) == (None, None)
    assert s0["name"] == "NVIDIA H100 80GB HBM3" and s0["power_limit"] == 700.0
    assert r.static()[1]["serial"] == "1650000000001"


def test_video_engines_and_pcie_throughput_come_from_the_library(
    reader: Any, stub: NvmlStub
) -> None:
    """NVENC / NVDEC % every sample; PCIe TX / RX (NVML's KB/s, as bytes/s) spread over
    PCIE_EVERY samples: GPU i is read on the samples i, i + PCIE_EVERY, ... and repeated in
    between (the call waits 20 ms and takes 0.9 ms of CPU on an H100)."""
    r = reader("count 3\nset 1 enc 40\nset 1 dec 60\nset 2 pcie_tx_kb 5000\n")
    gpus = by_index(r.sample(slow=True))
    assert [(g["enc"], g["dec"]) for g in gpus.values()] == [(5, 7), (40, 60), (7, 9)]
    assert (gpus[0]["pcie_tx"], gpus[0]["pcie_rx"]) == (1000 * 1024, 2000 * 1024)
    assert (gpus[2]["pcie_tx"], gpus[2]["pcie_rx"]) == (5000 * 1024, 2002 * 1024)
    tput = "nvmlDeviceGetPcieThroughput"
    assert [stub.calls(i, tput) for i in range(3)] == [2, 2, 2]  # the first sample: all of them
    stub.set(1, "enc", 3)
    stub.set(2, "pcie_rx_kb", 9)
    seen = [by_index(r.sample(slow=False)) for _ in range(PCIE_EVERY)]  # samples 1..60
    assert all(g[1]["enc"] == 3 for g in seen)  # read every sample
    # GPU 2's turn is sample 2 (seen[1]): before it, the first sample's reading repeated
    assert [g[2]["pcie_rx"] for g in seen] == [2002 * 1024] + [9 * 1024] * (PCIE_EVERY - 1)
    # each GPU read once more in these samples: 1 on sample 1, 2 on 2, 0 on 60
    assert [stub.calls(i, tput) for i in range(3)] == [4, 4, 4]


def test_unsupported_video_and_pcie_readings_are_asked_once(reader: Any, stub: NvmlStub) -> None:
    r = reader("count 2\nerror 1 3 codec pcie_tput\n")
    for _ in range(2 * SLOW_EVERY + 1):
        g0, g1 = by_index(r.sample(slow=False)).values()
        assert (g1["enc"], g1["dec"], g1["pcie_tx"], g1["pcie_rx"]) == (None,) * 4
        assert g1["util_gpu"] == 51 and g0["enc"] == 5 and g0["pcie_tx"] == 1000 * 1024
    assert stub.calls(1, "nvmlDeviceGetEncoderUtilization") == 1
    assert stub.calls(1, "nvmlDeviceGetDecoderUtilization") == 1
    assert stub.calls(1, "nvmlDeviceGetPcieThroughput") == 2  # TX and RX: one each
    assert stub.calls(0, "nvmlDeviceGetEncoderUtilization") == 2 * SLOW_EVERY + 1


SLOW_PER_FIELD = (  # what the slow readings cost one call each (the fallback)
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
)


def test_the_slow_readings_are_one_batched_call_with_a_code_per_field(
    reader: Any, stub: NvmlStub
) -> None:
    """ECC, retired pages and remapped rows (11 NVML field ids) are one nvmlDeviceGetFieldValues
    call per GPU and slow sample, where they were 8 calls (10 in the library: pynvml asks the
    retired pages' count first); a field the GPU answers NOT_SUPPORTED within the batch is null
    and hides none of the others."""
    r = reader("count 2\nset 0 ecc_agg_unc 2\nset 1 rows_pending 1\nerror 1 3 retired\n")
    for _ in range(3):
        g0, g1 = by_index(r.sample(slow=True)).values()
    assert g0["ecc"]["aggregate_uncorrected"] == 2 and g0["retired_pages"]["pending"] is False
    assert g1["retired_pages"] is None and g1["ecc"]["volatile_corrected"] == 1
    assert g1["remapped_rows"] == {
        "correctable": 1,
        "uncorrectable": 0,
        "pending": True,
        "failure": False,
    }
    for gpu in (0, 1):
        assert stub.calls(gpu, "nvmlDeviceGetFieldValues") == 3
        assert [stub.calls(gpu, fn) for fn in SLOW_PER_FIELD] == [0] * len(SLOW_PER_FIELD)


@pytest.mark.parametrize("code", [13, 3], ids=["function_not_found", "not_supported"])
def test_without_the_batched_call_the_slow_readings_are_read_one_call_each(
    reader: Any, stub: NvmlStub, code: int
) -> None:
    """A driver whose library lacks nvmlDeviceGetFieldValues (FUNCTION_NOT_FOUND) or refuses it:
    the same readings through the calls of old, and the batched call is not tried again."""
    r = reader(f"count 1\nset 0 ecc_vol_unc 4\nset 0 retired_sbe 2\nerror 0 {code} fields\n")
    for _ in range(3):
        (g,) = r.sample(slow=True)
    assert g["ecc"]["volatile_uncorrected"] == 4
    assert g["retired_pages"] == {"single_bit": 2, "double_bit": 0, "pending": False}
    assert g["remapped_rows"] is not None
    assert stub.calls(0, "nvmlDeviceGetFieldValues") == 1
    assert stub.calls(0, "nvmlDeviceGetRemappedRows") == 3


def test_slow_fields_are_repeated_between_slow_reads(reader: Any, stub: NvmlStub) -> None:
    r = reader("count 1\n")
    assert r.sample(slow=True)[0]["ecc"]["volatile_corrected"] == 0
    stub.set(0, "ecc_vol_corr", 7)
    stub.set(0, "temp", 77)
    fast = r.sample(slow=False)[0]
    assert fast["temp"] == 77  # fast fields are read every time
    assert fast["ecc"]["volatile_corrected"] == 0  # slow ones repeat the last reading
    assert r.sample(slow=True)[0]["ecc"]["volatile_corrected"] == 7


def test_lost_gpu_becomes_lost_state_with_one_event(reader: Any) -> None:
    r = reader("count 3\nlost 1 1\n")
    first = by_index(r.sample(slow=True))
    assert all(g["state"] == "ok" for g in first.values())
    assert r.events() == []
    second = by_index(r.sample(slow=False))
    assert second[1]["state"] == "lost"
    assert second[1]["uuid"] == "GPU-5718a1c0-0000-4000-8000-000000000001"
    assert second[1]["temp"] is None and second[1]["processes"] == []
    assert second[0]["state"] == "ok" and second[0]["temp"] == 40
    assert second[2]["state"] == "ok" and second[2]["temp"] == 42
    events = r.events()
    assert [(e["type"], e["kind"], e["gpu"]) for e in events] == [("event", "gpu_lost", 1)]
    third = by_index(r.sample(slow=True))
    assert third[1]["state"] == "lost"
    assert r.events() == []  # the event is sent once


def test_xid_event_from_the_nvml_event_set(reader: Any) -> None:
    r = reader("count 2\nxid 1 79 1\nxid 0 48 0\n")
    r.sample(slow=True)
    first = r.events()
    assert [(e["kind"], e["gpu"], e["detail"]) for e in first] == [("xid", 0, {"xid": 48})]
    r.sample(slow=False)
    second = r.events()
    assert [(e["kind"], e["gpu"], e["detail"]) for e in second] == [("xid", 1, {"xid": 79})]
    r.sample(slow=False)
    assert r.events() == []


def test_gpu_without_event_support_still_samples(reader: Any) -> None:
    r = reader("count 2\nerror 0 3 events\nxid 0 79 0\nxid 1 43 0\n")
    r.sample(slow=True)
    assert [(e["gpu"], e["detail"]["xid"]) for e in r.events()] == [(1, 43)]


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("init 9\n", "Driver Not Loaded"),
        ("init 999\n", "Unknown Error"),
    ],
)
def test_open_fails_with_one_line_reason(stub: NvmlStub, script: str, reason: str) -> None:
    stub.configure(script)
    with pytest.raises(ReaderUnavailable) as info:
        NvmlReader.open()
    message = str(info.value)
    assert reason in message and "nvmlInit" in message and "\n" not in message


def test_open_reader_prefers_nvml(reader: Any, stub: NvmlStub) -> None:
    stub.configure("count 4\n")
    r, reason = open_reader()
    try:
        assert reason is None
        assert r.name == "nvml" and len(r.static()) == 4
    finally:
        r.close()


def test_without_the_driver_open_reader_says_why(
    stub: NvmlStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CONFIG_ENV)
    monkeypatch.setenv("PATH", "/nonexistent")
    r, reason = open_reader()
    assert r is None
    assert "NVML: nvmlInit failed: Driver Not Loaded" in reason and "nvidia-smi" in reason


def test_real_agent_over_the_stub(nvml_lib_dir: Path, tmp_path: Path, agents: list[Any]) -> None:
    """The agent subprocess finds the stub through LD_LIBRARY_PATH, exactly as on a node."""
    stub = NvmlStub(
        nvml_lib_dir, tmp_path / "nvml.conf", "count 3\nerror 2 3 fan power\nlost 1 2\nxid 0 79 1\n"
    )
    agent = AgentProcess(
        [sys.executable, "-m", "gpuctl.node", "agent", "--interval", "0.1"], env=stub.env()
    )
    agents.append(agent)
    hello = agent.read()
    assert hello["type"] == "hello"
    assert (hello["reader"], hello["reader_error"]) == ("nvml", None)
    assert (hello["driver"], hello["cuda"], hello["nvml"]) == ("550.54.15", "12.4", "12.550.54.15")
    assert [g["name"] for g in hello["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 3

    first = agent.read_until(lambda m: m["type"] == "sample")
    gpus = by_index(first["gpus"])
    assert [gpus[i]["temp"] for i in range(3)] == [40, 41, 42]
    assert gpus[2].get("fan") is None and gpus[2].get("power") is None  # null: left out
    assert gpus[2]["util_gpu"] == 52 and gpus[2]["mem_used"] == 12 * 1024 * MIB
    assert gpus[0]["ecc"] is not None

    xid = agent.read_until(lambda m: m["type"] == "event" and m["kind"] == "xid")
    assert (xid["gpu"], xid["detail"]) == (0, {"xid": 79})
    lost = agent.read_until(lambda m: m["type"] == "event" and m["kind"] == "gpu_lost")
    assert lost["gpu"] == 1
    after = agent.read_until(lambda m: m["type"] == "sample")
    states = [g.get("state", "ok") for g in sorted(after["gpus"], key=lambda g: g["index"])]
    assert states == ["ok", "lost", "ok"]

    agent.send({"type": "snapshot", "id": 5})
    snap = agent.read_until(lambda m: m.get("id") == 5)
    assert snap["type"] == "sample" and len(snap["gpus"]) == 3
    agent.send({"type": "shutdown"})
    agent.read_until(lambda m: m["type"] == "bye")
    assert agent.proc.wait(5) == 0
