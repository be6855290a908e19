"""``gpuctl submit / jobs / logs / cancel / result`` end to end, in-process, real jobs."""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl.cli.main import main
from gpuctl_tests.helpers import wait_until

USER_FILE = """
import sys, threading

GREETING = "hello"

def add(a, b):
    print(GREETING, a, b)
    return a + b

def greet(name="x"):
    return f"{GREETING} {name}"

def boom():
    raise ValueError("bad value")

def slow():
    import time
    print("started", flush=True)
    time.sleep(120)

def huge():
    return "x" * 1_000_000

def interrupted():
    raise KeyboardInterrupt("raised by the function")

LOCK = threading.Lock()

def haslock():
    return LOCK


async def fetch():
    return 1
"""


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    p = tmp_path / "user_jobs.py"
    p.write_text(USER_FILE)
    return p


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_submit_wait_jobs_logs_result(
    user_file: Path, venv1: str, venv2: str, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ("--supervisor-python", venv1, "--python", venv2)
    rc, out, _ = run(capsys, "submit", f"{user_file}:add", "--args", "[2, 3]", "--wait", *common)
    assert rc == 0
    job_id, value = out.split()
    assert value == "5"
    rc, out, _ = run(capsys, "submit", f"{user_file}:greet", "--args", '{"name": "kw"}', *common)
    kw_id = out.strip()
    rc, out, _ = run(capsys, "result", kw_id, "--timeout", "60")
    assert (rc, out.strip()) == (0, "'hello kw'")
    rc, out, err = run(capsys, "submit", f"{user_file}:boom", "--wait", *common)
    assert rc == 1 and "[user_exception]" in err and "ValueError: bad value" in err
    rc, out, _ = run(capsys, "jobs")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["ID", "STATE", "TARGET"]
    assert any(job_id[:12] in line and " done " in line for line in lines)
    assert any("boom" in line and "user_exception" in line for line in lines)
    rc, out, _ = run(capsys, "logs", job_id[:8], "--stdout")
    assert (rc, out.strip()) == (0, "hello 2 3")


def test_a_huge_result_prints_shortened_and_writes_whole_with_o(
    user_file: Path, venv1: str, venv2: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    common = ("--supervisor-python", venv1, "--python", venv2)
    rc, out, _ = run(capsys, "submit", f"{user_file}:huge", "--wait", *common)
    assert rc == 0
    job_id, printed = out.split("\n", 1)
    assert len(printed) < 5000
    assert printed.startswith("'xxx") and "4,000 of 1,000,002 characters" in printed
    assert "gpuctl result ID -o FILE" in printed
    rc, out, err = run(capsys, "result", job_id, "-o", str(tmp_path / "r.pkl"))
    assert (rc, out) == (0, "") and "r.pkl" in err
    with open(tmp_path / "r.pkl", "rb") as f:
        assert pickle.load(f) == "x" * 1_000_000
    rc, _, err = run(capsys, "result", job_id, "-o", str(tmp_path / "no" / "such" / "r.pkl"))
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("gpuctl: cannot write the result to ") and "Traceback" not in err


def test_a_keyboard_interrupt_raised_on_the_node_is_a_failure_not_a_ctrl_c(
    user_file: Path, venv1: str, venv2: str, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ("--supervisor-python", venv1, "--python", venv2)
    rc, _, err = run(capsys, "submit", f"{user_file}:interrupted", "--wait", *common)
    assert rc == 1, err  # not 130: nobody pressed Ctrl-C here
    assert "[user_exception]" in err and "KeyboardInterrupt: raised by the function" in err
    assert "not a Ctrl-C of yours" in err


def test_cancel_through_the_cli(
    user_file: Path, venv1: str, venv2: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run(
        capsys, "submit", f"{user_file}:slow", "--supervisor-python", venv1, "--python", venv2
    )
    job_id = out.strip()

    def started() -> bool:
        return "started" in run(capsys, "logs", job_id, "--stdout")[1]

    wait_until(started, 30, "the job to print")
    rc, out, _ = run(capsys, "jobs")  # nobody polled the job: `jobs` refreshes its state
    assert any(line.startswith(job_id[:12]) and " running " in line for line in out.splitlines())
    rc, out, _ = run(capsys, "cancel", job_id)
    assert rc == 0 and "cancelling" in out
    rc, _, err = run(capsys, "result", job_id, "--timeout", "30")
    assert rc == 1 and "[cancelled]" in err
    rc, _, err = run(capsys, "cancel", job_id)
    assert rc == 1 and "already ended" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["submit", "missing.py:f"], "missing.py: no such file"),
        (["submit", "{file}:nope"], "has no function 'nope' (it has: add, boom"),
        (["submit", "{file}"], "expected FILE.py:FUNC"),
        (["submit", "{file}:add", "--args", "[2,"], "--args is not valid JSON"),
        (["submit", "{file}:add", "--args", "3"], "--args must be a JSON list"),
        (
            ["submit", "{file}:haslock"],
            "haslock cannot be pickled: global `LOCK` that haslock uses",
        ),
        (["submit", "{file}:fetch"], "`fetch` is an async def function"),
        (["submit", "{file}:add", "--target", "nowhere"], "unknown target 'nowhere'"),
        (["submit", "{file}:add", "--nodes", "2"], "run through Slurm only"),
        (["submit", "{file}:add", "--tasks-per-node", "0"], "give a whole number, 1 or more"),
        (["result", "0000000"], "no job '0000000'"),
        (["logs", "0000000"], "no job '0000000'"),
        (["cancel", "0000000"], "no job '0000000'"),
        (["submit", "{file}:add", "--ship-limit", "lots"], "--ship-limit 'lots': expected a size"),
        (["submit", "{file}:add", "--ship-limit=-1M"], "--ship-limit '-1M': expected a size"),
    ],
)
def test_user_mistakes_are_one_line(
    user_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    rc, _out, err = run(capsys, *(a.replace("{file}", str(user_file)) for a in argv))
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("gpuctl: ")
    assert message in err
    assert "Traceback" not in err


def test_ship_exclude_and_ship_limit_from_the_command_line(
    tmp_path: Path, venv1: str, venv2: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--ship-exclude`` leaves a module of the project out (the report names it and the
    option), ``--ship-limit`` caps what ships; without them the module travels."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "helper.py").write_text("VALUE = 41\n")
    (proj / "main.py").write_text("def f():\n    import helper\n    return helper.VALUE + 1\n")
    common = ("--supervisor-python", venv1, "--python", venv2, "--wait")
    rc, out, err = run(capsys, "submit", f"{proj / 'main.py'}:f", *common)
    assert (rc, out.split()[-1]) == (0, "42"), (out, err)
    for extra in (("--ship-exclude", "help*"), ("--ship-limit", "0")):
        rc, out, err = run(capsys, "submit", f"{proj / 'main.py'}:f", *common, *extra)
        assert rc == 1, (out, err)
        assert f"your module `helper` (`{proj / 'helper.py'}`) was not shipped" in err, err
        assert extra[0] in err, err


def test_node_of_the_config_via_local_with_jobs_table(
    tmp_path: Path, venv1: str, venv2: str
) -> None:
    from gpuctl.config import load_config
    from gpuctl.jobs import Executor

    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(
        "[clusters.here]\n"
        'nodes = "box[1-2]"\n'
        'via = "local"\n'
        f'python = "{venv1}"\n'
        f'workload_python = "{venv2}"\n'
        'setup = ["export GPUCTL_FROM_CLUSTER=c"]\n'
        "[jobs]\n"
        f'dir = "{tmp_path / "cfg-jobs"}"\n'
        'setup = ["export GPUCTL_FROM_JOBS_TABLE=j"]\n'
    )
    ex = Executor("box2", config=load_config(cfg_path), store=False)

    def env() -> tuple[str, str, str]:
        import os
        import sys

        return (
            os.environ["GPUCTL_FROM_CLUSTER"],
            os.environ["GPUCTL_FROM_JOBS_TABLE"],
            sys.executable,
        )

    job = ex.submit(env)
    assert job.result(60) == ("c", "j", venv2)
    assert job.jobdir.startswith(str(tmp_path / "cfg-jobs"))


PROGRESS_FILE = """
import time

def nap(seconds):
    time.sleep(seconds)
    return "rested"
"""


def _submit_wait(tmp_path: Path, venv1: str, venv2: str, stderr_tty: bool) -> tuple[str, str]:
    """``gpuctl submit --wait`` in a real process, stderr on a terminal (a pty) or a pipe."""
    import os
    import pty
    import subprocess
    import sys

    user = tmp_path / "napper.py"
    user.write_text(PROGRESS_FILE)
    argv = [sys.executable, "-m", "gpuctl", "submit", f"{user}:nap", "--args", "[1.5]", "--wait"]
    argv += ["--supervisor-python", venv1, "--python", venv2]
    if not stderr_tty:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout, r.stderr
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, text=True)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the process closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        out, _ = proc.communicate(timeout=120)
    finally:
        os.close(master)
    assert proc.returncode == 0
    return out, b"".join(chunks).decode()


@pytest.mark.slow
def test_submit_wait_progress_only_on_a_terminal(tmp_path: Path, venv1: str, venv2: str) -> None:
    out, err = _submit_wait(tmp_path, venv1, venv2, stderr_tty=True)
    job_id, value = out.split()
    assert value == "'rested'"
    short = job_id[:12]
    assert "\r\x1b[K" in err  # the live line is redrawn in place
    states = [line.rsplit("\r\x1b[K", 1)[-1] for line in err.replace("\r\n", "\n").split("\n")]
    states = [s for s in states if s.strip()]
    # one line per state change, each with the elapsed time: ... running, then done
    tail = [s.split()[1:] for s in states][-2:]
    assert tail == [["job", short, "running"], ["job", short, "done"]]
    assert all(s.split()[0].count(":") == 1 for s in states)
    last_elapsed = states[-1].split()[0]
    assert int(last_elapsed.split(":")[1]) >= 1  # it took the 1.5 s nap
    out, err = _submit_wait(tmp_path, venv1, venv2, stderr_tty=False)
    assert out.split()[1] == "'rested'" and err == ""


def test_jobs_purge_deletes_ended_jobs_older_than_the_age_and_nothing_else(
    user_file: Path,
    venv1: str,
    venv2: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuctl.jobs import JobStore

    common = ("--supervisor-python", venv1, "--python", venv2)
    ids = []
    for args in ("[1, 2]", "[3, 4]"):
        rc, out, _ = run(capsys, "submit", f"{user_file}:add", "--args", args, "--wait", *common)
        assert rc == 0
        ids.append(out.split()[0])
    rc, out, _ = run(capsys, "submit", f"{user_file}:slow", *common)
    running = out.strip()
    store = JobStore()
    old, recent = (store.get(i) for i in ids)
    assert old is not None and recent is not None
    store.update(old.id, ended_at=time.time() - 8 * 86400)  # ended 8 days ago

    rc, out, _ = run(capsys, "jobs", "purge", "--older-than", "7d", "--dry-run")
    assert rc == 0 and f"would purge {old.id[:12]}" in out and "1 job(s)" in out
    assert Path(old.jobdir).is_dir()  # a dry run deletes nothing

    rc, out, err = run(capsys, "jobs", "purge", "--older-than", "7d")
    assert (rc, err) == (0, "") and out.startswith("purged 1 job(s)")
    assert not Path(old.jobdir).exists() and store.get(old.id) is None
    assert Path(recent.jobdir).is_dir() and store.get(recent.id) is not None
    assert store.get(running) is not None  # never a job that has not ended

    monkeypatch.setenv("GPUCTL_READ_ONLY", "1")
    rc, _, err = run(capsys, "jobs", "purge", "--older-than", "1s")
    assert rc == 2 and "read-only" in err and store.get(recent.id) is not None
    monkeypatch.delenv("GPUCTL_READ_ONLY")
    for bad in (["purge"], ["purge", "--older-than", "soon"], ["--older-than", "7d"]):
        rc, _, err = run(capsys, "jobs", *bad)
        assert rc == 2 and err.count("\n") == 1 and err.startswith("gpuctl: "), err
    run(capsys, "cancel", running)


def test_jobs_purge_removes_the_caches_no_job_used_for_the_age_and_keeps_a_running_jobs(
    user_file: Path, venv1: str, venv2: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job root's content-addressed caches (the user's code, maps' shared parts) go with
    ``purge`` once no job used them for the age: reuse marks them used, a job not ended keeps
    its root's caches whatever their age."""
    import os

    from gpuctl.jobs import JobStore

    common = ("--supervisor-python", venv1, "--python", venv2)
    rc, out, _ = run(capsys, "submit", f"{user_file}:add", "--args", "[1, 2]", "--wait", *common)
    assert rc == 0
    first = JobStore().get(out.split()[0])
    assert first is not None
    root = Path(first.jobdir).parent
    (code,) = root.glob("code-*")  # user_jobs.py shipped with the job
    week_ago = time.time() - 8 * 86400
    os.utime(code, (week_ago, week_ago))
    rc, out, _ = run(capsys, "submit", f"{user_file}:add", "--args", "[3, 4]", "--wait", *common)
    assert rc == 0 and code.stat().st_mtime > time.time() - 600  # reused: marked used now
    (root / "shared").mkdir(mode=0o700, exist_ok=True)
    stale = root / "shared" / "0123abcd.pkl"
    stale.write_bytes(b"x")
    os.utime(stale, (week_ago, week_ago))
    fresh = root / "code-fresh"
    fresh.mkdir()

    rc, out, _ = run(capsys, "submit", f"{user_file}:slow", *common)
    running = out.strip()
    os.utime(code, (week_ago, week_ago))  # as if the running job were a week old
    rc, out, err = run(capsys, "jobs", "purge", "--older-than", "7d")
    assert rc == 0 and "removed" not in out, (out, err)
    assert code.is_dir() and stale.exists()  # a job not ended may load them yet
    rc, _, _ = run(capsys, "cancel", running)
    rc, _, err = run(capsys, "result", running, "--timeout", "30")
    assert "[cancelled]" in err

    rc, out, err = run(capsys, "jobs", "purge", "--older-than", "7d", "--dry-run")
    assert rc == 0 and f"would remove {code}" in out and f"would remove {stale}" in out, out
    assert code.is_dir() and str(fresh) not in out
    rc, out, err = run(capsys, "jobs", "purge", "--older-than", "7d")
    assert (rc, err) == (0, "") and "removed 2 cached item(s)" in out, (out, err)
    assert not code.exists() and not stale.exists() and fresh.is_dir()


def test_logs_follow_prints_what_the_job_writes_as_it_runs_and_ends_with_it(
    tmp_path: Path, venv1: str, venv2: str
) -> None:
    import subprocess
    import sys

    from gpuctl_tests.helpers import node_env

    (tmp_path / "ticks.py").write_text(
        "import os, sys, time\n\n"
        "def ticks(gate):\n"
        "    print('tick 1', flush=True)\n"
        "    while not os.path.exists(gate):\n"  # the second line only once the test saw the first
        "        time.sleep(0.05)\n"
        "    print('tick 2', flush=True)\n"
        "    print('warned', file=sys.stderr, flush=True)\n"
        "    return 2\n"
    )
    gate = tmp_path / "gate"
    env = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state")})
    env.pop("GPUCTL_CONFIG", None)

    def gpuctl(*argv: str, **kw: Any) -> Any:
        cmd = [sys.executable, "-m", "gpuctl", *argv]
        return subprocess.Popen(cmd, env=env, cwd=tmp_path, text=True, **kw)

    submit = gpuctl(
        "submit", "ticks.py:ticks", "--args", json.dumps([str(gate)]),
        "--supervisor-python", venv1, "--python", venv2, stdout=subprocess.PIPE,
    )  # fmt: skip
    out, _ = submit.communicate(timeout=60)
    job_id = out.strip()
    follow = gpuctl("logs", job_id, "-f", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == "tick 1\n"  # while the job still runs
        assert follow.poll() is None
        gate.touch()
        rest, err = follow.communicate(timeout=60)  # it ends when the job does
    finally:
        if follow.poll() is None:
            follow.kill()
        gate.touch()  # whatever failed above, the job ends
    assert follow.returncode == 0
    assert rest == "tick 2\n" and err == "warned\n"
