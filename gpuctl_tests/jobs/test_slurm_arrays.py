"""``map`` through a Slurm whose MaxArraySize is smaller than the map: several arrays under one
cap when the chunk size is fixed, bigger chunks when it is not."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl.cli.main import main
from gpuctl.jobs import JobFailed
from gpuctl_tests.helpers import wait_until
from gpuctl_tests.jobs.conftest import executor_on
from gpuctl_tests.jobs.test_map_cap import held, run_capped, started

pytestmark = pytest.mark.slurm

MAX_ARRAY_SIZE = 5  # array indices 0..4: a map of 12 one-item tasks needs three arrays


@pytest.fixture(scope="module")
def small_arrays(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A private one-node Slurm with ``MaxArraySize=5`` (the shared one keeps Slurm's 1001)."""
    from gpuctl_tests.harness.slurm import running_cluster

    folder = tmp_path_factory.mktemp("slurm-arrays")
    with running_cluster(folder, conf={"MaxArraySize": MAX_ARRAY_SIZE}) as cluster:
        yield cluster


@pytest.fixture
def executor(small_arrays: Any, venv1: str, venv2: str, tmp_path: Path) -> Iterator[Any]:
    yield functools.partial(executor_on, small_arrays, venv1, venv2, tmp_path)
    small_arrays.cancel_all()


def plus_one(x: int) -> int:
    return x + 1


def test_a_fixed_chunksize_over_max_array_size_is_several_arrays_under_one_cap(
    executor: Any, small_arrays: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """12 one-item tasks, cap 3, MaxArraySize 5: three arrays of 4, the second and third
    waiting for the one before; never more than 3 items running at once over all of them (the
    items' own clocks say so), every result in order, and ``gpuctl jobs`` says which array."""

    def three_chained_arrays(jobs: list[Any]) -> None:
        arrays = list(dict.fromkeys(j.handle["array"] for j in jobs))
        assert len(arrays) == 3
        assert [sum(j.handle["array"] == a for j in jobs) for a in arrays] == [4, 4, 4]
        for n, array in enumerate(arrays):
            first = next(j for j in jobs if j.handle["array"] == array)
            assert first.handle["split"].startswith(f"array {n + 1} of 3: 3 arrays of <=4 tasks")
            script = Path(first.jobdir, "job.sbatch").read_text()
            assert "#SBATCH --array=0-3%3\n" in script
            waits = f"#SBATCH --dependency=afterany:{arrays[n - 1]}\n"
            assert (waits in script) == (n > 0)
        out = small_arrays.run(["squeue", "-h", "-r", "-t", "PD", "-o", "%i %r"]).stdout
        reasons = dict(line.split() for line in out.splitlines())
        later = [j.handle["slurm_id"] for j in jobs if j.handle["array"] != arrays[0]]
        assert {reasons.get(sid) for sid in later} == {"Dependency"}, out
        rc = main(["jobs", "--json"])
        shown = json.loads(capsys.readouterr().out)["jobs"]
        assert rc == 0
        mine = {r["id"]: r for r in shown}
        assert [mine[j.id]["slurm_id"] for j in jobs] == [j.handle["slurm_id"] for j in jobs]
        assert {mine[j.id]["split"].split(":")[0] for j in jobs} == {
            f"array {n} of 3" for n in (1, 2, 3)
        }

    values = run_capped(executor(), tmp_path, items=12, cap=3, while_held=three_chained_arrays)
    assert len(values) == 12


def test_without_a_chunksize_the_chunks_grow_to_fit_one_array(executor: Any) -> None:
    """40 items with a cap of 20 would be 40 one-item tasks; MaxArraySize 5 makes them 5
    chunks of 8 in one array, and the results are every item's."""
    ex = executor(max_running=20)
    jobs = ex.map_jobs(plus_one, range(40))
    assert len(jobs) == 5 and len({j.handle["array"] for j in jobs}) == 1
    assert "split" not in jobs[0].handle
    assert [v for j in jobs for _, v in j.result(120)] == list(range(1, 41))
    assert list(ex.map(plus_one, range(23))) == list(range(1, 24))


def test_cancel_a_task_of_a_later_array_and_the_rest_still_run(
    executor: Any, tmp_path: Path
) -> None:
    """A task of the third array, still waiting for its turn, is cancelled; every other item
    of the split map still runs and returns its value."""
    gate, marks = tmp_path / "gate", tmp_path / "marks"
    marks.mkdir()
    ex = executor()
    jobs = ex.map_jobs(held, range(11), [str(gate)] * 11, [str(marks)] * 11, chunksize=1)
    assert len({j.handle["array"] for j in jobs}) == 3
    wait_until(lambda: started(marks) >= 1, timeout=120)
    last = jobs[-1]
    assert last.state == "pending"
    assert last.cancel()
    with pytest.raises(JobFailed) as err:
        last.result(60)
    assert err.value.kind == "cancelled"
    gate.touch()
    assert [j.result(120)[0][1][0] for j in jobs[:-1]] == list(range(10))
    assert not (marks / "10.start").exists()


def test_the_chunks_of_a_map_share_one_runner_folder(executor: Any) -> None:
    """A Slurm map writes the runner (supervisor, worker, their package) once, into a folder
    named by its content under the job root; each chunk's folder holds its payload and meta
    only, and the array runs the shared supervisor on it. Once every chunk's result is read,
    the backend has no job left to ask squeue about."""
    ex = executor()
    jobs = ex.map_jobs(plus_one, range(6), chunksize=2)
    runner = Path(json.loads(Path(jobs[0].jobdir, "meta.json").read_text())["runner"])
    assert runner.parent == Path(jobs[0].jobdir).parent and runner.name.startswith("runner-")
    assert (runner / "supervisor.py").is_file() and (runner / "worker.py").is_file()
    for job in jobs:
        assert not Path(job.jobdir, "supervisor.py").exists()
        assert not Path(job.jobdir, "worker.py").exists()
    script = Path(jobs[0].jobdir, "job.sbatch").read_text()
    assert f'{runner}/supervisor.py "$D"' in script
    assert [v for j in jobs for _, v in j.result(120)] == list(range(1, 7))
    again = ex.map_jobs(plus_one, range(2), chunksize=1)  # the same runner, not a second one
    assert json.loads(Path(again[0].jobdir, "meta.json").read_text())["runner"] == str(runner)
    assert [v for j in again for _, v in j.result(120)] == [1, 2]
    assert not ex.backend._watch
