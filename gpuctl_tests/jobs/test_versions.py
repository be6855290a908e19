"""A payload whose objects come from a distribution VENV2 has at another major version (numpy 2
here, numpy 1.26 in VENV2, a numpy array as an argument) is named as a version mismatch, with
both versions and the fix: before anything is sent when VENV2 is probed, and when the worker
fails to unpickle it (the probe skipped).

Two real venvs built once per session: numpy 2.x (the submitter) and numpy 1.26.4 (VENV2), each
from the wheels of the machine's configured package index, each seeing this interpreter's
site-packages after its own (cloudpickle, gpuctl's dependencies). The test skips where the index
lacks the wheels, and fails in CI."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from gpuctl_tests.helpers import node_env, unavailable

NUMPY1 = "numpy==1.26.4"
NUMPY2 = "numpy>=2,<3"


def _numpy_venv(root: Path, requirement: str | None, wheels: Path) -> str:
    """A venv at ``root`` with numpy ``requirement`` (None: no numpy) from ``wheels``; its
    python."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(root)], check=True, timeout=300)
    python = root / "bin" / "python"
    if requirement is not None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--find-links",
                str(wheels),
                requirement,
            ],
            check=True,
            timeout=600,
        )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # this interpreter's packages after the venv's own: cloudpickle, gpuctl's dependencies
    mine = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "zz-gpuctl-tests.pth").write_text("\n".join(sorted(mine)) + "\n")
    return str(python)


@pytest.fixture(scope="session")
def numpy_venvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """{"1": python of a venv with numpy 1.26.4, "2": one with numpy 2.x, "none": one
    without}, built once."""
    root = tmp_path_factory.mktemp("numpy-venvs")
    wheels = root / "wheels"
    for requirement in (NUMPY1, NUMPY2):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                str(wheels),
                requirement,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if r.returncode != 0:
            unavailable(f"the package index has no wheel for {requirement}: {r.stderr[-300:]}")
    return {
        "1": _numpy_venv(root / "np1", NUMPY1, wheels),
        "2": _numpy_venv(root / "np2", NUMPY2, wheels),
        "none": _numpy_venv(root / "none", None, wheels),
    }


SUBMIT = """\
import json, sys
import numpy as np
from gpuctl.jobs import Executor, JobFailed

opts = json.loads(sys.argv[1])
ex = Executor("local", store=False, **opts)
try:
    out = {"result": ex.submit(np.sum, np.arange(4)).result(120).item()}
except JobFailed as e:
    out = {"kind": e.kind, "phase": e.report.phase, "text": str(e), "remedy": e.report.remedy}
print(json.dumps(out))
"""


def submit_from(submitter: str, **options: Any) -> dict[str, Any]:
    """Submit ``np.sum(np.arange(4))`` from the interpreter ``submitter``; its JSON answer."""
    r = subprocess.run(
        [submitter, "-c", SUBMIT, json.dumps(options)],
        capture_output=True,
        text=True,
        env=node_env(),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def numpy_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import numpy; print(numpy.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_numpy_2_here_and_1_in_venv2_is_refused_before_submitting_1_and_2_is_not(
    numpy_venvs: dict[str, str], venv1: str, tmp_path: Path
) -> None:
    here = numpy_version(numpy_venvs["2"])
    jobs = tmp_path / "jobs"
    out = submit_from(
        numpy_venvs["2"], python=numpy_venvs["1"], supervisor_python=venv1, job_root=str(jobs)
    )
    assert out.get("kind") == "version_mismatch", out
    assert out["phase"] == "provision"
    first = out["text"].splitlines()[1].strip()
    assert first.startswith(f"the payload holds numpy objects: numpy {here} here, 1.26.4 in VENV2")
    assert "they refer to 'numpy._core." in first and "which numpy 1.26.4 does not have" in first
    assert out["remedy"].startswith("use numpy 2.x in VENV2 or 1.x here")
    assert f"'numpy=={here}'" in out["remedy"]
    # nothing went out: no job folder, no code folder
    assert not jobs.exists() or list(jobs.iterdir()) == []

    # the same submitter against a VENV2 of its own major version runs the job
    out = submit_from(
        numpy_venvs["2"], python=numpy_venvs["2"], supervisor_python=venv1, job_root=str(jobs)
    )
    assert out == {"result": 6}
    # another major version that still loads the payload is no mismatch: numpy 2 loads numpy
    # 1's pickles (its numpy.core is still there)
    out = submit_from(
        numpy_venvs["1"], python=numpy_venvs["2"], supervisor_python=venv1, job_root=str(jobs)
    )
    assert out == {"result": 6}


def test_numpy_mismatch_met_while_unpickling_is_named_too(
    numpy_venvs: dict[str, str], venv1: str, tmp_path: Path
) -> None:
    here = numpy_version(numpy_venvs["2"])
    out = submit_from(
        numpy_venvs["2"],
        python=numpy_venvs["1"],
        supervisor_python=venv1,
        job_root=str(tmp_path / "jobs"),
        verify=False,  # no probe: the worker meets the mismatch
    )
    assert out.get("kind") == "version_mismatch", out
    assert out["phase"] == "loading"
    assert "the payload refers to 'numpy._core" in out["text"]
    assert f"which numpy 1.26.4 in VENV2 ({numpy_venvs['1']}) does not have" in out["text"]
    assert f"it was pickled with numpy {here}" in out["text"]
    assert out["remedy"].startswith("use numpy 2.x in VENV2 or 1.x here")
    assert "module_missing" not in out["text"]


def test_a_distribution_missing_in_venv2_is_named_with_the_version_here(
    numpy_venvs: dict[str, str], venv1: str, tmp_path: Path
) -> None:
    """VENV2 without numpy at all: module_missing, and the remedy names the distribution at
    this side's version, never a submodule as a package."""
    here = numpy_version(numpy_venvs["2"])
    out = submit_from(
        numpy_venvs["2"],
        python=numpy_venvs["none"],
        supervisor_python=venv1,
        job_root=str(tmp_path / "jobs"),
    )
    assert out.get("kind") == "module_missing", out
    assert out["remedy"] == (
        f"add 'numpy=={here}' to the environment's packages, or install it into VENV2"
    )
