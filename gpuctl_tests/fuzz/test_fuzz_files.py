"""Fuzz: the files gpuctl reads that someone else may have written: recordings
(``fleet.recording.reader``), config files (``config.parse_config``, ``load_config``),
hostfiles and NODES (``config.nodes.read_hostfile``, ``parse_nodes``), and a job's files
(``node.jobfiles`` readers, ``jobs.records`` through ``core.wire``, ``jobs.classify``'s status
lines). Each is read or refused with one line (ConfigError, RecordingError); nothing else."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from gpuctl import config
from gpuctl.config import ConfigError
from gpuctl.config.nodes import parse_nodes, read_hostfile
from gpuctl.core import wire
from gpuctl.fleet.recording.format import RecordingError
from gpuctl.fleet.recording.reader import RecordingReader
from gpuctl.fleet.recording.writer import RecordingWriter
from gpuctl.jobs import records
from gpuctl.jobs.classify import parse_status
from gpuctl.node import jobfiles
from gpuctl_tests.fuzz.harness import INSERTS, LANES, bounded, junk_bytes, run

# -- recordings -----------------------------------------------------------------------------------
SAMPLE = {"type": "sample", "t": 100.5, "gpus": [{"index": 0, "util_gpu": 50, "temp": 61}]}


def _recording() -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "r.gpurec")
        w = RecordingWriter(path, [("n1", "ssh"), ("n2", "slurm")], started=100.0)
        for k in range(3):
            lines = [
                {"n": "n1", "t": 100.0 + k, "m": {**SAMPLE, "t": 100.0 + k}},
                {"n": "n2", "t": 100.5 + k, "down": "lost: timeout"},
            ]
            payload = b"".join(json.dumps(r).encode() + b"\n" for r in lines)
            w.write_frame(payload, 100.0 + k, 100.5 + k)
        w.close()
        return Path(path).read_bytes()


RECORDING = _recording()


def _read_recording(data: bytes) -> list[tuple[int, Any]] | RecordingError:
    with tempfile.NamedTemporaryFile(suffix=".gpurec") as f:
        f.write(data)
        f.flush()

        def read() -> list[tuple[int, Any]]:
            reader = RecordingReader(f.name)
            try:
                assert all("\n" not in p for p in reader.problems)
                return list(reader.records())
            finally:
                reader.close()

        got = bounded(read, errors=(RecordingError,))
    assert isinstance(got, (list, RecordingError)), got
    return got


def test_a_valid_recording_reads_back_every_record() -> None:
    got = _read_recording(RECORDING)
    assert isinstance(got, list)
    records_ = [r for _, r in got]
    assert [r["n"] for r in records_] == ["n1", "n2"] * 3
    assert records_[2]["m"] == {**SAMPLE, "t": 101.0}


@pytest.mark.parametrize("examples", LANES)
def test_any_recording_is_read_or_refused_in_one_line(examples: int) -> None:
    run(examples, junk_bytes([RECORDING]), _read_recording)


# -- config files ---------------------------------------------------------------------------------
CONFIG = b"""\
[clusters.lab]
nodes = "gpu[01-04]"
via = "ssh"
interval = 1.0
setup = ["module load cuda/12.1"]

[accept]
timeout = 600
"""


def _parse_config(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    got = bounded(config.parse_config, text, "fuzz.toml", errors=(ConfigError,))
    assert isinstance(got, (config.Config, ConfigError)), type(got)


def test_the_valid_config_parses() -> None:
    assert isinstance(config.parse_config(CONFIG.decode(), "ok.toml"), config.Config)


@pytest.mark.parametrize("examples", LANES)
def test_any_config_is_read_or_one_line(examples: int) -> None:
    toml_bits = st.sampled_from(
        [
            b"[stress]\n",
            b"[accept]\n",
            b"nodes = ",
            b'"gpu[1-99999999]"',
            b"= 1e999\n",
            b"[[x]]\n",
            b'duration = "-5s"\n',
            b"interval = 0\n",
            b"timeout = nan\n",
            b"\x00",
            b"'''",
        ]
    )
    inserts = st.lists(toml_bits, max_size=6).map(b"".join)
    run(examples, st.one_of(junk_bytes([CONFIG, *INSERTS]), inserts), _parse_config)


@pytest.mark.parametrize("examples", LANES)
def test_any_config_file_loads_or_is_one_line(examples: int, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"

    def check(data: bytes) -> None:
        path.write_bytes(data)
        path.chmod(0o600)
        got = bounded(config.load_config, str(path), errors=(ConfigError,))
        assert isinstance(got, (config.Config, ConfigError))

    run(max(4, examples // 4), junk_bytes([CONFIG]), check)


# -- hostfiles and NODES --------------------------------------------------------------------------
HOSTFILE = b"# racks\ngpu[01-03] slots=8\nlogin\n\nnode[7,9]  # two\n"


def test_the_valid_hostfile_reads_its_names(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_bytes(HOSTFILE)
    path.chmod(0o600)
    assert read_hostfile(str(path))[:4] == ["gpu01", "gpu02", "gpu03", "login"]


@pytest.mark.parametrize("examples", LANES)
def test_any_hostfile_is_names_or_one_line(examples: int, tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    ranges = st.sampled_from(
        [
            b"gpu[1-9999999]",
            b"x[0-3,5,7-]",
            b"[",
            b"a[b-c]",
            b"n[9-1]",
            b"x[00-99][00-99][00-99]",
            b"-",
            b"a,b,,c",
        ]
    )

    def check(data: bytes) -> None:
        path.write_bytes(data)
        path.chmod(0o600)
        got = bounded(read_hostfile, str(path), errors=(ConfigError,))
        assert isinstance(got, (list, ConfigError))
        if isinstance(got, list):
            assert got and all(isinstance(n, str) and n for n in got)
        text = data.decode("utf-8", "replace").split("\n", 1)[0]
        nodes = bounded(parse_nodes, text, errors=(ConfigError,))
        assert isinstance(nodes, (list, ConfigError))

    inputs = st.one_of(junk_bytes([HOSTFILE]), st.lists(ranges, max_size=4).map(b"\n".join))
    run(examples, inputs, check)


# -- a job's files --------------------------------------------------------------------------------
META: dict[str, Any] = {
    "id": "j1",
    "name": "train",
    "created_at": 1.0,
    "command": ["python", "x.py"],
    "env_names": ["A"],
    "limits": {},
}
STATUS = b'{"phase": "running", "t": 1.0, "done": 3}\n{"phase": "done", "t": 2.0}\n'
SCHEMAS = (
    [getattr(records, n) for n in records.__all__]
    if hasattr(records, "__all__")
    else [
        records.JobMeta,
        records.Attempt,
        records.StatusLine,
        records.WorkerError,
        records.FailedItems,
        records.ResultInfo,
        records.PidFile,
        records.Heartbeat,
        records.Handle,
        records.BackendInfo,
        records.FinalState,
        records.SchedulerState,
        records.Probe,
        records.BuildResult,
        records.ReportDict,
    ]
)


def _job_files(data: bytes) -> None:
    value = bounded(jobfiles.loads, data)
    text = data.decode("utf-8", "replace")
    lines = bounded(jobfiles.parse_lines, text)
    assert isinstance(lines, list) and all(isinstance(x, dict) for x in lines)
    for schema in SCHEMAS:
        if isinstance(schema, type):
            got = bounded(wire.parse, schema, value)
            assert got is None or isinstance(got, dict)
            assert isinstance(bounded(wire.parse_list, schema, lines), list)
    assert isinstance(bounded(parse_status, text), list)


def test_valid_job_files_read_the_same() -> None:
    assert wire.parse(records.JobMeta, jobfiles.loads(json.dumps(META).encode())) == META
    assert [s["phase"] for s in parse_status(STATUS.decode())] == ["running", "done"]


@pytest.mark.parametrize("examples", LANES)
def test_any_job_file_is_read_or_left_out(examples: int) -> None:
    run(examples, junk_bytes([json.dumps(META).encode(), STATUS]), _job_files)
