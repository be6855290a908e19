"""gpuctl against submitit on the same failures: time until each says what went wrong, and what.

    python3 benchmarks/vs_submitit.py [--cases NAME ...] [--timeout 120] [--markdown]

A small user project is written to a temporary folder (``train.py`` whose functions fail in
the ways training code fails, beside its own ``model.py``) and imported from there with that
folder as the working directory, as ``cd project && python run.py`` would. Each case is
submitted to gpuctl's ``Executor("local")`` (VENV1: pyenv's 3.6.15 when present, else this
Python; VENV2: this Python) and to submitit's ``LocalExecutor``; the script waits for each
job's outcome and prints, per case, the seconds from submit to the answer and the answer's
first line (gpuctl's failure kind, submitit's exception). Runs are one after the other (no two
jobs at once), gpuctl first.

Needs submitit (``pip install submitit``; not a dependency of gpuctl). Nothing here is timed
by an assertion: the figures are for the README's table and depend on the machine.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuctl.jobs import Executor, JobFailed, JobStore  # noqa: E402

VENV1 = Path.home() / ".pyenv" / "versions" / "3.6.15" / "bin" / "python"

MODEL = """
class MLP:
    def __init__(self, width):
        self.width = width

    def loss(self, step):
        return 1.0 / (1 + step)
"""

TRAIN = """
import ctypes
import os
import sys
import threading
import time


class InventoryError(Exception):
    pass


def ok():
    return "trained"


def user_exception():
    def deeper():
        raise InventoryError("widgets: only 2 left")
    deeper()


def segfault():
    ctypes.string_at(0)


def os_exit():
    os._exit(3)


def sys_exit():
    sys.exit(2)


def unpicklable_result():
    return threading.Lock()


def stack_overflow():
    sys.setrecursionlimit(10 ** 7)
    def down(n):
        return list(map(down, [n + 1]))  # through C each time: the C stack fills
    down(0)


def own_module_inside():
    from model import MLP
    return MLP(4).loss(3)


def missing_package():
    import nonexistent_package_for_gpuctl_bench
    return nonexistent_package_for_gpuctl_bench


def relative_path():
    with open("data/train.csv") as f:
        return f.read()


def hang():
    time.sleep(3600)


def memory_hog():
    blocks = []
    for _ in range(64):
        blocks.append(bytearray(64 << 20))
    return len(blocks)
"""

# case -> (function name, gpuctl Executor options, submitit parameters)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "returns normally": ("ok", {}, {}),
    "user exception": ("user_exception", {}, {}),
    "segfault": ("segfault", {}, {}),
    "os._exit(3)": ("os_exit", {}, {}),
    "sys.exit(2)": ("sys_exit", {}, {}),
    "unpicklable result": ("unpicklable_result", {}, {}),
    "C stack overflow": ("stack_overflow", {}, {}),
    "own module imported inside": ("own_module_inside", {}, {}),
    "package missing": ("missing_package", {}, {}),
    "relative path missing": ("relative_path", {}, {}),
    "hang past the time limit (60 s)": ("hang", {"time_limit": 60}, {"timeout_min": 1}),
    "memory over mem= (1 GiB)": ("memory_hog", {"mem": "1G"}, {"mem_gb": 1}),
}


def first_line(text: str, limit: int = 110) -> str:
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def run_gpuctl(fn: Any, options: dict[str, Any], folder: Path, timeout: float) -> tuple[float, str]:
    ex = Executor(
        "local",
        supervisor_python=str(VENV1) if VENV1.exists() else sys.executable,
        python=sys.executable,
        job_root=str(folder / "gpuctl-jobs"),
        store=JobStore(folder / "jobs.sqlite"),
        **options,
    )
    ex.venv2()  # probed once per executor: not part of the failure's time
    t0 = time.perf_counter()
    job = ex.submit(fn)
    try:
        value = job.result(timeout)
        said = f"result {value!r}"
    except JobFailed as e:  # the kind and the first piece of evidence
        evidence = e.report.evidence[0] if e.report.evidence else ""
        said = f"[{e.kind}] {first_line(evidence)}"
    except Exception as e:  # the user's own exception, re-raised
        said = f"{type(e).__name__}: {first_line(str(e))}"
    return time.perf_counter() - t0, said


def run_submitit(
    fn: Any, params: dict[str, Any], folder: Path, timeout: float
) -> tuple[float, str]:
    import submitit

    ex = submitit.LocalExecutor(folder=str(folder / "submitit-%j"))
    ex.update_parameters(
        timeout_min=params.get("timeout_min", 5),
        **{k: v for k, v in params.items() if k != "timeout_min"},
    )
    t0 = time.perf_counter()
    job = ex.submit(fn)
    deadline = t0 + timeout
    while not job.done() and time.perf_counter() < deadline:
        time.sleep(0.1)
    if not job.done():
        job.cancel()
        return time.perf_counter() - t0, f"(no answer within {timeout:.0f} s)"
    try:
        value = job.result()
        said = f"result {value!r}"
    except Exception as e:  # the trace's exception line when it holds one, else its first
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        raised = [x for x in lines if re.match(r"[\w.]+(Error|Exception|Exit)\b", x)]
        said = f"{type(e).__name__}: {first_line(raised[-1] if raised else str(e))}"
    return time.perf_counter() - t0, said


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", choices=sorted(CASES), help="default: all")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for a job")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table for the README")
    args = ap.parse_args()
    try:
        import submitit
    except ImportError:
        print("submitit is not installed here: pip install submitit", file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="gpuctl-vs-submitit-"))
    project = folder / "project"
    project.mkdir()
    (project / "model.py").write_text(textwrap.dedent(MODEL))
    (project / "train.py").write_text(textwrap.dedent(TRAIN))
    # as `cd project && python run.py` would: the project first on the path, and the cwd
    sys.path.insert(0, str(project))
    os.chdir(project)  # "data/train.csv" is missing here and on the node alike
    train = importlib.import_module("train")
    rows = []
    print(f"gpuctl vs submitit {submitit.__version__}, Python {sys.version.split()[0]}", flush=True)
    try:
        for case in args.cases or list(CASES):
            name, g_opts, s_params = CASES[case]
            fn = getattr(train, name)
            g_time, g_said = run_gpuctl(fn, g_opts, folder, args.timeout)
            s_time, s_said = run_submitit(fn, s_params, folder, args.timeout)
            rows.append((case, g_time, g_said, s_time, s_said))
            print(
                f"{case}\n  gpuctl   {g_time:6.1f} s  {g_said}\n  submitit {s_time:6.1f} s  "
                f"{s_said}",
                flush=True,
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.markdown:
        print("\n| failure | gpuctl | gpuctl says | submitit | submitit says |")
        print("|---|---|---|---|---|")
        for case, g_time, g_said, s_time, s_said in rows:
            cells = [c.replace("|", "\\|") for c in (case, g_said, s_said)]
            print(f"| {cells[0]} | {g_time:.1f} s | {cells[1]} | {s_time:.1f} s | {cells[2]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
