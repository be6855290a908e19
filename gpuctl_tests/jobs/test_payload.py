"""Large arguments and results over a real sshd node: the bytes arrive intact both ways, the
upload is pipelined (hashed piece by piece while earlier pieces are on the wire) and the result
is unpickled as it streams in (benchmarks/jobs_payload.py measures the speed)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from gpuctl.config import load_config
from gpuctl.jobs import EnvSpec, Executor, JobStore
from gpuctl.jobs.hosts import HostError
from gpuctl.jobs.pickling import _HashingWriter
from gpuctl_tests.harness.sshd import SshCluster

MIB = 1 << 20


def digest_of(data: bytes | bytearray, extra: dict[str, Any]) -> tuple[str, int, dict[str, Any]]:
    import hashlib

    return hashlib.sha256(data).hexdigest(), len(data), extra


class _Recorder:
    def __init__(self) -> None:
        self.pieces: list[bytes] = []

    def write(self, data: Any) -> int:
        self.pieces.append(bytes(data))
        return len(self.pieces[-1])


def test_a_large_write_is_hashed_and_forwarded_piece_by_piece() -> None:
    # one 20 MiB buffer (what cloudpickle hands over for a large bytes argument) goes on as
    # pieces: the first is on its way while the next is hashed, not after the whole is hashed
    data = os.urandom(20 * MIB + 5)
    rec = _Recorder()
    w = _HashingWriter(rec)  # type: ignore[arg-type]
    assert w.write(b"head") == 4
    assert w.write(memoryview(data)) == len(data)
    assert max(len(p) for p in rec.pieces) <= _HashingWriter.PIECE
    assert len(rec.pieces) == 1 + 3
    assert b"".join(rec.pieces) == b"head" + data
    assert w.hexdigest() == hashlib.sha256(b"head" + data).hexdigest()
    assert w.size == 4 + len(data)


@pytest.fixture
def ssh_executor(
    ssh_cluster: SshCluster,
    venv1: str,
    env_root: str,
    venv2: str,
    env_spec: EnvSpec,
    tmp_path: Path,
) -> Executor:
    ssh_cluster.start_node("gpu1", python=venv1)
    config = load_config(ssh_cluster.write_config(tmp_path / "config.toml"))
    return Executor(
        "gpu1",
        config=config,
        env=env_spec,
        env_root=env_root,
        job_root=str(tmp_path / "remote-jobs"),
        store=JobStore(),
    )


@pytest.mark.sshd
def test_a_large_argument_arrives_intact(ssh_executor: Executor) -> None:
    # larger than the stream's chunks and not a multiple of them, and a bytearray (sent from
    # the caller's own buffer) next to small objects (gathered and copied)
    data = bytearray(os.urandom(37 * MIB + 123))
    extra = {"small": list(range(1000)), "text": "é" * 5000}
    job = ssh_executor.submit(digest_of, data, extra)
    assert job.result(120) == (hashlib.sha256(data).hexdigest(), len(data), extra)
    meta = json.loads(Path(job.jobdir, "meta.json").read_text())
    payload = Path(job.jobdir, "payload.pkl").read_bytes()
    assert meta["payload_sha256"] == hashlib.sha256(payload).hexdigest()
    assert meta["payload_bytes"] == len(payload)
    assert [p.name for p in Path(job.jobdir).iterdir() if ".tmp-" in p.name] == []


def blob_of(n: int) -> bytes:
    import random

    return random.Random(n).randbytes(n)


@pytest.mark.sshd
def test_a_large_result_streams_back_intact_without_local_disk(
    ssh_executor: Executor, small_fs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    # the login node's temporary folder holds 4 MiB: the result is unpickled as it arrives,
    # never copied to a local file first
    monkeypatch.setattr(tempfile, "tempdir", str(small_fs))
    n = 45 * MIB + 7  # more than the reader keeps buffered: the download pauses and resumes
    job = ssh_executor.submit(blob_of, n)
    value = job.result(120)
    assert len(value) == n and value == random.Random(n).randbytes(n)
    assert list(small_fs.iterdir()) == []


@pytest.mark.sshd
def test_a_transfer_cut_midway_raises_and_never_looks_complete(
    ssh_cluster: SshCluster, ssh_executor: Executor, tmp_path: Path
) -> None:
    data = os.urandom(96 * MIB)
    src = tmp_path / "result.bin"
    src.write_bytes(data)
    host = ssh_executor.backend.host
    with host.open_read(str(src)) as f:
        head = f.read(MIB)
        assert head == data[:MIB]
        # the reader holds at most 32 MiB (+ the reads in flight): the rest is still to come
        ssh_cluster["gpu1"].kill()
        with pytest.raises(HostError):
            f.read()
    ssh_cluster["gpu1"].restart()
    with host.open_read(str(src)) as f:  # a new connection after the loss
        assert f.read() == data
