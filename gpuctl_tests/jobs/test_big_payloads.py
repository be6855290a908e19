"""Big payloads: a map's function (with what it closes over) goes to the node once, not once
per chunk, and a payload over ``max_payload`` is refused before anything is written, with what
is big in it and how to go on. Real local jobs (VENV1 3.6, the session VENV2)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gpuctl.config import load_config
from gpuctl.jobs import JobStore
from gpuctl.jobs.pickling import PayloadTooLarge

MIB = 1 << 20


def _written(root: str) -> dict[str, int]:
    """Every payload file under the job root (chunks' and shared ones): path -> bytes."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".pkl") and "result" not in name and "exception" not in name:
                path = os.path.join(folder, name)
                found[path] = os.path.getsize(path)
    return found


def _closing_over(blob: bytes) -> Any:
    def scaled(i: int) -> int:
        return blob[i] + len(blob)

    return scaled


def test_a_map_writes_the_function_and_what_it_closes_over_once(
    make_executor: Any, job_root: str
) -> None:
    blob = os.urandom(8 * MIB)
    fn = _closing_over(blob)
    ex = make_executor()
    jobs = ex.map_jobs(fn, range(16), chunksize=1)
    assert len(jobs) == 16
    assert [job.result(120) for job in jobs] == [[("ok", blob[i] + len(blob))] for i in range(16)]
    written = _written(job_root)
    total = sum(written.values())
    # one copy of the 8 MiB for the map, not 16 (the chunks' payloads are small)
    assert 8 * MIB < total < 9 * MIB, written
    shared = [p for p in written if os.sep + "shared" + os.sep in p]
    assert len(shared) == 1 and written[shared[0]] > 8 * MIB
    # the same function again: the file is there already, nothing of it is written again
    again = ex.map_jobs(fn, range(4, 6), chunksize=1)
    assert [job.result(120) for job in again] == [[("ok", blob[i] + len(blob))] for i in (4, 5)]
    assert sum(_written(job_root).values()) - total < 64 * 1024


def _nothing_written(job_root: str) -> None:
    assert not os.path.exists(job_root) or not os.listdir(job_root)
    assert JobStore().list() == []


def test_a_call_over_the_limit_is_refused_before_anything_is_written(
    make_executor: Any, job_root: str
) -> None:
    weights = os.urandom(6 * MIB)

    def train(steps: int, data: bytes) -> int:
        return steps + len(weights) + len(data)

    ex = make_executor(max_payload="4M")
    with pytest.raises(PayloadTooLarge) as caught:
        ex.submit(train, 3, b"x" * MIB)
    text = str(caught.value)
    assert "the call of" in text and "train" in text
    assert "pickles to 7.0 MiB, over the payload limit of 4.0 MiB (max_payload)" in text
    # what is big: the variable it closes over first (6 MiB), then the 1 MiB argument
    assert "the biggest parts: variable `weights` that" in text
    assert text.index("`weights`") < text.index("argument 1 (bytes): 1.0 MiB")
    assert "Pass big data by path" in text and 'max_payload="4G"' in text
    assert 7 * MIB < caught.value.size < 7 * MIB + 4096 and caught.value.limit == 4 * MIB
    _nothing_written(job_root)
    # under the limit it runs
    assert make_executor(max_payload="16M").submit(train, 3, b"x").result(120) == 6 * MIB + 4


def test_a_map_item_over_the_limit_is_named_and_nothing_is_written(
    make_executor: Any, job_root: str
) -> None:
    ex = make_executor(max_payload=2 * MIB)
    items = [b"a", b"b", os.urandom(3 * MIB), b"d"]
    with pytest.raises(PayloadTooLarge) as caught:
        ex.map_jobs(len, items, chunksize=2)
    text = str(caught.value)
    assert "chunk 1 of map:" in text and "(items 2 to 3)" in text
    assert "the biggest parts: item 2 (bytes): 3.0 MiB" in text
    _nothing_written(job_root)
    # the map's shared part over the limit: named as what the function closes over
    with pytest.raises(PayloadTooLarge, match=r"the function of map:.*variable `blob`"):
        ex.map_jobs(_closing_over(os.urandom(3 * MIB)), range(2))
    _nothing_written(job_root)


def test_the_limit_comes_from_the_config(
    make_executor: Any, job_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "config.toml"
    conf.write_text('[jobs]\nmax_payload = "1M"\n')
    monkeypatch.setenv("GPUCTL_CONFIG", str(conf))
    assert load_config(None).jobs.max_payload == "1M"
    with pytest.raises(
        PayloadTooLarge, match=r"pickles to 2\.0 MiB, over the payload limit of 1\.0 MiB"
    ):
        make_executor().submit(len, os.urandom(2 * MIB))
    _nothing_written(job_root)
    conf.write_text("[jobs]\nmax_payload = 0\n")
    with pytest.raises(Exception, match="max_payload"):
        load_config(None)
    with pytest.raises(ValueError, match='max_payload must be a size such as 1073741824 or "4G"'):
        make_executor(max_payload="lots")


def test_a_slurm_array_s_chunks_share_the_one_copy(slurm_executor: Any, tmp_path: Path) -> None:
    blob = os.urandom(2 * MIB)
    fn = _closing_over(blob)
    jobs = slurm_executor().map_jobs(fn, range(4), chunksize=1)
    assert [job.result(120) for job in jobs] == [[("ok", blob[i] + len(blob))] for i in range(4)]
    written = _written(str(tmp_path / "shared-jobs"))
    assert 2 * MIB < sum(written.values()) < 3 * MIB, written


def test_gpuctl_submit_refuses_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "big.py").write_text(
        "import os\nBLOB = os.urandom(3 << 20)\n\ndef f():\n    return len(BLOB)\n"
    )
    (tmp_path / "c.toml").write_text('[jobs]\nmax_payload = "1M"\n')
    env = {
        **os.environ,
        "GPUCTL_CONFIG": str(tmp_path / "c.toml"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "gpuctl", "submit", "big.py:f"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("gpuctl: the call of ") and "global `BLOB` that f uses" in line
    assert JobStore().list() == []


PICKLED: list[str] = []


class _Counted:
    """An argument that notes each time it is pickled (unpickled on the node as a plain
    number: its reducer runs here only)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        PICKLED.append(self.tag)
        return int, (len(self.tag),)


def test_a_payload_is_pickled_once_and_a_map_chunk_twice(make_executor: Any) -> None:
    """Measured against max_payload, scanned for the modules VENV2 must have, and written: one
    pickling pass for a submit's small payload (its bytes kept from the measure), two for a
    map's chunk (measured with the others, then written). It took three and three."""
    ex = make_executor()
    PICKLED.clear()
    assert ex.submit(abs, _Counted("call")).result(120) == 4
    assert PICKLED == ["call"]
    PICKLED.clear()
    jobs = ex.map_jobs(abs, [_Counted("a"), _Counted("bb")], chunksize=1)
    assert [job.result(120) for job in jobs] == [[("ok", 1)], [("ok", 2)]]
    assert sorted(PICKLED) == ["a", "a", "bb", "bb"]
