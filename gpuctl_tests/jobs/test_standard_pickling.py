"""Inside a job, the user's shipped modules are the modules their names import: a function of a
sibling module (``mathx.square``) pickles by reference under the standard pickle, as in plain
Python, so a ``multiprocessing`` Pool (fork and spawn) and a ``ProcessPoolExecutor`` run it; and
the submitting process is left as it was (no by-value registration of ``mathx`` stays behind for
a later cloudpickle user, such as submitit, in the same process).

The submitter is a real ``run.py`` run as a script from another folder, as a user runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuctl_tests.jobs.test_user_modules import run_python

MATHX = """\
def square(x):
    return x * x
"""

RUN = """\
import json
import pickle
import sys

import mathx


def pooled(method):
    import concurrent.futures
    import multiprocessing

    ctx = multiprocessing.get_context(method)
    with ctx.Pool(2) as pool:
        squares = pool.map(mathx.square, [1, 2, 3])
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as ex:
        more = list(ex.map(mathx.square, [4, 5]))
    same = mathx.square is sys.modules["mathx"].square
    return [squares, more, same, len(pickle.dumps(mathx.square))]


def plain(method):
    return mathx.square(3)


if __name__ == "__main__":
    import cloudpickle

    from gpuctl.config import load_config
    from gpuctl.jobs import Executor, JobFailed

    opts = json.loads(sys.argv[1])
    config = opts.pop("config", None)
    method = opts.pop("method")
    fn = globals()[opts.pop("fn", "pooled")]
    before = sorted(cloudpickle.list_registry_pickle_by_value())
    ex = Executor(opts.pop("target"), config=load_config(config) if config else None, **opts)
    try:
        out = {"result": ex.submit(fn, method).result(240)}
    except JobFailed as e:
        out = {"kind": e.kind, "text": str(e)}
    except Exception as e:  # the function's own exception, raised again here
        out = {"kind": type(e).__name__, "text": str(e)}
    out["registry_before"] = before
    out["registry_after"] = sorted(cloudpickle.list_registry_pickle_by_value())
    # what a later cloudpickle user of this process (submitit) pickles: mathx by name
    out["by_reference"] = len(cloudpickle.dumps(mathx.square)) < 100
    print(json.dumps(out))
"""


def project(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "mathx.py").write_text(MATHX)
    (root / "run.py").write_text(RUN)
    return root / "run.py"


def check(out: dict[str, Any]) -> None:
    assert "result" in out, out.get("text")
    squares, more, same, _ = out["result"]
    assert (squares, more, same) == ([1, 4, 9], [16, 25], True)
    assert out["registry_after"] == out["registry_before"]
    assert out["by_reference"]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_pool_over_a_sibling_modules_function_runs_in_a_local_job(
    method: str, venv1: str, venv2: str, tmp_path: Path
) -> None:
    run = project(tmp_path / "proj")
    opts = {
        "target": "local",
        "method": method,
        "python": venv2,
        "supervisor_python": venv1,
        "job_root": str(tmp_path / "jobs"),
    }
    check(run_python([str(run)], tmp_path / "elsewhere", opts))


@pytest.mark.sshd
def test_a_pool_over_a_sibling_modules_function_runs_in_an_ssh_job(
    ssh_cluster: Any, venv1: str, venv2: str, tmp_path: Path
) -> None:
    ssh_cluster.start_node("m1", simulate="1", python=venv1)
    config = ssh_cluster.write_config(tmp_path / "c.toml")
    run = project(tmp_path / "proj")
    opts = {
        "target": "m1",
        "method": "spawn",
        "config": str(config),
        "python": venv2,
        "job_root": str(tmp_path / "remote-jobs"),
    }
    check(run_python([str(run)], tmp_path / "elsewhere", opts))


def test_a_module_that_does_not_ship_still_travels_by_value(
    venv1: str, venv2: str, tmp_path: Path
) -> None:
    """With shipping off (``ship_limit=0``) ``mathx`` is not on VENV2's path: it travels inside
    the payload, as before, and the registration is undone after the payload is written."""
    run = project(tmp_path / "proj")
    opts = {
        "target": "local",
        "method": "fork",
        "python": venv2,
        "supervisor_python": venv1,
        "job_root": str(tmp_path / "jobs"),
        "ship_limit": 0,
        "fn": "plain",
    }
    out = run_python([str(run)], tmp_path / "elsewhere", opts)
    assert out.get("result") == 9, out
    assert out["registry_after"] == out["registry_before"]
    assert out["by_reference"]
