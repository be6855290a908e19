"""The nvidia-smi reader against a stand-in nvidia-smi replaying recorded CSV."""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuctl.node.protocol import SAMPLE_FIELDS, STATIC_FIELDS
from gpuctl.node.readers import ReaderUnavailable, open_reader
from gpuctl.node.readers.smi import SmiReader
from gpuctl_tests.helpers import AgentProcess, node_env, old_python
from gpuctl_tests.node import smi_stub

MIB = 1 << 20


class FakeSmi:
    """A stand-in nvidia-smi in its own bin folder, with the data it replays."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.data_path = root / "smi.json"
        self.data = smi_stub.default_data()
        smi_stub.install(self.bin, self.data_path, self.data)

    def update(self, **changes: Any) -> None:
        self.data.update(changes)
        smi_stub.write_data(self.data_path, self.data)

    def env(self, path: str | None = None) -> dict[str, str]:
        """A subprocess environment: this nvidia-smi on PATH, no NVML library to be found."""
        env = node_env({smi_stub.DATA_ENV: str(self.data_path)})
        env["PATH"] = path if path is not None else f"{self.bin}{os.pathsep}/usr/bin:/bin"
        env.pop("LD_LIBRARY_PATH", None)
        env.pop("GPUCTL_NVML_STUB", None)
        return env


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSmi:
    fake = FakeSmi(tmp_path)
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv(smi_stub.DATA_ENV, str(fake.data_path))
    return fake


@pytest.fixture
def open_smi(smi: FakeSmi) -> Callable[..., SmiReader]:
    def opener(**changes: Any) -> SmiReader:
        if changes:
            smi.update(**changes)
        return SmiReader.open()

    return opener


def test_static_facts_and_versions(open_smi: Callable[..., SmiReader]) -> None:
    r = open_smi()
    assert r.name == "nvidia-smi"
    assert r.versions() == {"driver": "550.54.15", "cuda": "12.4", "nvml": "550.54"}
    h100, rtx = r.static()
    assert set(h100) == set(STATIC_FIELDS)
    assert h100 == {
        "index": 0,
        "uuid": "GPU-3b5f2a10-8c1e-4f7a-9d2b-6e0c1a7f4b21",
        "name": "NVIDIA H100 80GB HBM3",
        "mem_total": 81559 * MIB,
        "power_limit": 700.0,
        "max_sm_clock": 1980,
        "max_mem_clock": 2619,
        "pcie_gen": 5,
        "pcie_width": 16,
        "mig_mode": False,
        "serial": "1654023018827",
    }
    assert (rtx["name"], rtx["serial"], rtx["mig_mode"]) == ("NVIDIA GeForce RTX 4090", None, None)


def test_versions_from_the_banner_on_old_drivers(open_smi: Callable[..., SmiReader]) -> None:
    r = open_smi(version=None)
    assert r.versions() == {"driver": "550.54.15", "cuda": "12.4", "nvml": None}


def test_sample_parses_values_and_bracketed_forms(
    smi: FakeSmi, open_smi: Callable[..., SmiReader]
) -> None:
    me = os.getpid()
    h100_uuid = smi_stub.H100["uuid"]
    r = open_smi(apps=[[h100_uuid, me, 70000], [h100_uuid, 4194001, "[N/A]"]])
    h100, rtx = r.sample(slow=True)
    for g in (h100, rtx):
        assert set(g) == set(SAMPLE_FIELDS)
        assert g["state"] == "ok"
    assert (h100["util_gpu"], h100["util_mem"], h100["temp"]) == (97, 61, 71)
    assert (h100["mem_used"], h100["mem_total"]) == (73911 * MIB, 81559 * MIB)
    assert (h100["power"], h100["power_limit"]) == (688.4, 700.0)
    assert (h100["sm_clock"], h100["mem_clock"], h100["fan"], h100["pstate"]) == (
        1755,
        2619,
        None,
        "P0",
    )
    assert h100["throttle"] == ["sw_power_cap"]
    assert h100["ecc"] == {
        "volatile_corrected": 0,
        "volatile_uncorrected": 0,
        "aggregate_corrected": 12,
        "aggregate_uncorrected": 0,
    }
    assert h100["retired_pages"] is None  # all [N/A] on a GPU that remaps rows instead
    assert h100["remapped_rows"] == {
        "correctable": 0,
        "uncorrectable": 0,
        "pending": False,
        "failure": False,
    }
    me_entry, other = h100["processes"]
    assert (me_entry["pid"], me_entry["mem"]) == (me, 70000 * MIB)
    assert me_entry["user"] == pwd.getpwuid(os.getuid()).pw_name
    assert "python" in me_entry["command"] or "pytest" in me_entry["command"]
    unknown = ("user", "command", "mem", "uid", "sm", "ppid", "cpu", "rss", "started", "slurm_job")
    assert other == {"pid": 4194001, **dict.fromkeys(unknown)}
    # [Unknown Error], [Not Supported], [N/A]: null, and the rest of the GPU still reads
    assert (rtx["mem_used"], rtx["power"], rtx["ecc"], rtx["remapped_rows"]) == (None,) * 4
    assert (rtx["mem_total"], rtx["temp"], rtx["fan"], rtx["pstate"]) == (24564 * MIB, 38, 30, "P8")
    assert rtx["throttle"] == ["gpu_idle"]
    assert rtx["processes"] == []
    # the video engines come through the registry's nvidia-smi fields; PCIe throughput has none
    assert (h100["enc"], h100["dec"], rtx["enc"], rtx["dec"]) == (0, 23, None, 4)
    assert (h100["pcie_tx"], h100["pcie_rx"]) == (None, None)


def test_slow_fields_repeat_between_slow_samples(
    smi: FakeSmi, open_smi: Callable[..., SmiReader]
) -> None:
    r = open_smi()
    assert r.sample(slow=True)[0]["ecc"]["aggregate_corrected"] == 12
    gpus = [dict(g) for g in smi.data["gpus"]]
    gpus[0]["ecc.errors.corrected.aggregate.total"] = "13"
    gpus[0]["temperature.gpu"] = "80"
    smi.update(gpus=gpus)
    fast = r.sample(slow=False)[0]
    assert fast["temp"] == 80 and fast["ecc"]["aggregate_corrected"] == 12
    assert r.sample(slow=True)[0]["ecc"]["aggregate_corrected"] == 13


@pytest.mark.parametrize("known", ["clocks_event_reasons.active", "clocks_throttle_reasons.active"])
def test_throttle_field_of_either_name(
    smi: FakeSmi, open_smi: Callable[..., SmiReader], known: str
) -> None:
    other = {"clocks_event_reasons.active", "clocks_throttle_reasons.active"} - {known}
    valid = [k for k in smi_stub.H100 if k not in other]
    r = open_smi(valid=valid)
    assert r.sample()[0]["throttle"] == ["sw_power_cap"]


def test_driver_without_remapped_rows(smi: FakeSmi, open_smi: Callable[..., SmiReader]) -> None:
    valid = [k for k in smi_stub.H100 if not k.startswith("remapped_rows")]
    r = open_smi(valid=valid)
    g = r.sample(slow=True)[0]
    assert g["remapped_rows"] is None
    assert g["ecc"]["aggregate_corrected"] == 12 and g["temp"] == 71


def test_lost_gpu_becomes_lost_state_with_one_event(
    smi: FakeSmi, open_smi: Callable[..., SmiReader]
) -> None:
    r = open_smi()
    first = r.sample(slow=True)
    assert [g["state"] for g in first] == ["ok", "ok"]
    assert r.events() == []
    smi.update(lost=[1])
    second = r.sample(slow=False)
    assert [g["state"] for g in second] == ["ok", "lost"]
    assert second[1]["uuid"] == smi_stub.RTX4090["uuid"] and second[1]["temp"] is None
    assert second[0]["temp"] == 71
    assert [(e["kind"], e["gpu"]) for e in r.events()] == [("gpu_lost", 1)]
    assert [g["state"] for g in r.sample(slow=True)] == ["ok", "lost"]
    assert r.events() == []


def test_failing_nvidia_smi_is_unavailable_with_its_own_words(smi: FakeSmi) -> None:
    smi.update(fail=smi_stub.NO_DRIVER)
    with pytest.raises(ReaderUnavailable) as info:
        SmiReader.open()
    assert "couldn't communicate with the NVIDIA driver" in str(info.value)
    assert "\n" not in str(info.value)


def test_not_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ReaderUnavailable, match="nvidia-smi is not on PATH"):
        SmiReader.open()


def test_open_reader_falls_back_to_smi(smi: FakeSmi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUCTL_NVML_STUB", raising=False)
    reader, reason = open_reader()
    assert reader is not None and reader.name == "nvidia-smi"
    assert reason is not None and reason.startswith("NVML: ")  # why it is not on NVML


def test_agent_picks_nvidia_smi_when_nvml_is_unavailable(
    smi: FakeSmi, agents: list[AgentProcess]
) -> None:
    agent = AgentProcess(
        [sys.executable, "-m", "gpuctl.node", "agent", "--interval", "0.2"], env=smi.env()
    )
    agents.append(agent)
    hello = agent.read()
    assert (hello["type"], hello["reader"]) == ("hello", "nvidia-smi")
    # why it is not on NVML, for the screen, status and doctor to show
    assert hello["reader_error"] == "NVML: nvmlInit failed: NVML Shared Library Not Found"
    assert (hello["driver"], hello["cuda"]) == ("550.54.15", "12.4")
    assert [g["name"] for g in hello["gpus"]] == [
        "NVIDIA H100 80GB HBM3",
        "NVIDIA GeForce RTX 4090",
    ]
    sample = agent.read_until(lambda m: m["type"] == "sample")
    assert [g["temp"] for g in sample["gpus"]] == [71, 38]
    assert sample["gpus"][1].get("power") is None  # null: left out


def test_agent_under_python36_reads_nvidia_smi(smi: FakeSmi, agents: list[AgentProcess]) -> None:
    python = old_python("3.6.15")
    agent = AgentProcess([python, "-m", "gpuctl.node", "agent", "--interval", "0.2"], env=smi.env())
    agents.append(agent)
    hello = agent.read()
    assert (hello["python"], hello["reader"]) == ("3.6.15", "nvidia-smi")
    sample = agent.read_until(lambda m: m["type"] == "sample")
    assert sample["gpus"][0]["throttle"] == ["sw_power_cap"]


def test_agent_without_any_reader_says_why(smi: FakeSmi, agents: list[AgentProcess]) -> None:
    agent = AgentProcess(
        [sys.executable, "-m", "gpuctl.node", "agent"], env=smi.env(path="/nonexistent")
    )
    agents.append(agent)
    hello = agent.read()
    assert hello["reader"] is None and hello["gpus"] == []
    reason = hello["reader_error"]
    assert "NVML" in reason and "nvidia-smi is not on PATH" in reason and "\n" not in reason
    error = agent.read()
    assert (error["type"], error["code"]) == ("error", "no_reader")
    assert error["message"] == reason
    agent.send({"type": "ping", "id": 1})  # still answering
    assert agent.read_until(lambda m: m["type"] == "pong")["id"] == 1
