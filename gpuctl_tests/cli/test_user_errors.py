"""Every user mistake ends in one line on stderr (``gpuctl: ...``), a sensible exit code and no
traceback: real ``python -m gpuctl`` subprocesses, run in parallel, as a user would type them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuctl_tests.helpers import need_torch, node_env

FILES = {
    "job.py": "def f(x=1):\n    return x + 1\n",
    "syntax.py": "def f(:\n    pass\n",
    "lock.py": "import threading\nLOCK = threading.Lock()\n\ndef f():\n    return LOCK\n",
    "sock.py": "import socket\nS = socket.socket()\n\ndef f():\n    return S\n",
    "raises.py": "raise RuntimeError('boom at import')\n\ndef f():\n    pass\n",
    "notfunc.py": "f = 3\n",
    "exits.py": "import sys\nsys.exit(3)\n\ndef f():\n    pass\n",
    "nul.py": "def f():\n    return 1\n\0\n",
    "missing.toml": None,
    "notoml.toml": "read_only = \n",
    "badval.toml": "read_only = 'maybe'\n",
    "badkey.toml": "colour = 'red'\n",
    "badhostlist.toml": "[clusters.c]\nnodes = 'gpu[01-'\nvia = 'local'\n",
    "sim.toml": "[clusters.c]\nnodes = 'n[1-2]'\nvia = 'local'\nsimulate = '1'\n",
    "empty.password": "\n",
    "user.password": "pw-9d2b71\n",
}
PROM = ["status", "--prometheus", "http://127.0.0.1:9"]  # nothing listens: no mistake gets there


@dataclass
class Case:
    argv: list[str]
    rc: int
    message: str  # a regex the one stderr line must match (after "gpuctl: ")
    env: dict[str, str] = field(default_factory=dict)


CASES = [
    # the config
    Case(["--config", "missing.toml", "status"], 2, r"missing\.toml: no such file"),
    Case(["--config", "notoml.toml", "status"], 2, r"notoml\.toml:1: TOML syntax"),
    Case(["--config", "badval.toml", "status"], 2, r"badval\.toml:1: read_only: expected true"),
    Case(["--config", "badkey.toml", "submit", "job.py:f", "--target", "n1"], 2, r"colour: unkn"),
    Case(["--config", ".", "status"], 2, r"is a directory"),
    Case(["status"], 2, r"missing\.toml: no such file", {"GPUCTL_CONFIG": "missing.toml"}),
    Case(["--config", "badhostlist.toml", "status"], 2, r"bad hostlist 'gpu\[01-'"),
    # --config after the command is understood, not "unrecognized arguments"
    Case(["config", "check", "--config", "badval.toml"], 2, r"badval\.toml:1: read_only"),
    # node names
    Case(["--config", "sim.toml", "stress", "start", "gpu[01-"], 2, r"bad node list"),
    Case(["--config", "sim.toml", "stress", "start", "zz9"], 2, r"not configured: zz9"),
    Case(["--config", "sim.toml", "accept", "--nodes", "gpu[01-"], 2, r"bad hostlist"),
    Case(["--config", "sim.toml", "accept", "--nodes", "zz[1-2]"], 2, r"zz1 is not in the conf"),
    # submit
    Case(["submit", "nofile.py:f"], 2, r"nofile\.py: no such file"),
    Case(["submit", "job.py"], 2, r"expected FILE\.py:FUNC"),
    Case(["submit", "syntax.py:f"], 2, r"syntax\.py:1: syntax error"),
    Case(["submit", "raises.py:f"], 2, r"raises\.py failed to import: RuntimeError: boom"),
    Case(["submit", "exits.py:f"], 2, r"exits\.py called sys\.exit\(3\) when imported: put"),
    Case(["submit", "nul.py:f"], 2, r"^gpuctl: nul\.py: syntax error: .*null bytes"),
    Case(["submit", "job.py:nope"], 2, r"job\.py has no function 'nope' \(it has: f\)"),
    Case(["submit", "notfunc.py:f"], 2, r"notfunc\.py:f is a int, not a function"),
    Case(["submit", "lock.py:f"], 2, r"lock\.py:f cannot be pickled: .*lock"),
    Case(["submit", "sock.py:f"], 2, r"sock\.py:f cannot be pickled: .*socket"),
    Case(["submit", "job.py:f", "--args", "[1,"], 2, r"--args is not valid JSON"),
    Case(["submit", "job.py:f", "--args", "3"], 2, r"--args must be a JSON list"),
    Case(["submit", "job.py:f", "--target", "zork"], 2, r"unknown target 'zork'"),
    Case(["--config", "sim.toml", "submit", "job.py:f", "--target", "zz"], 2, r"unknown targ"),
    Case(["submit", "job.py:f", "--mem", "lots"], 2, r"--mem 'lots': expected a size like 4G"),
    Case(["submit", "job.py:f", "--time-limit", "-5"], 2, r"--time-limit must be positive"),
    Case(
        ["submit", "job.py:f", "--supervisor-python", "/no/py"],
        2,
        r"^gpuctl: local: no python at '/no/py' for the job supervisor: set python",
    ),
    Case(["accept", "--local", "--expect-gpus", "-1"], 2, r"--expect-gpus must be 0 or more"),
    # jobs by id
    Case(["logs", "0000"], 2, r"no job '0000': see gpuctl jobs"),
    Case(["result", "0000"], 2, r"no job '0000'"),
    Case(["cancel", "0000"], 2, r"no job '0000'"),
    # "xy": no job id gpuctl makes (hex) starts so, whatever else the module's cases store
    Case(["logs", "xy"], 2, r"job id 'xy' is ambiguous \(2 jobs: xyz1, xyz2\)"),
    Case(["result", "xyz1", "--timeout", "-1"], 2, r"--timeout must be 0"),
    # --prometheus's TLS and credential options (issue 29), checked as the config's keys
    Case([*PROM, "--prometheus-user", "ops"], 2, r": --prometheus-user: needs --prometheus-pass"),
    Case(
        [*PROM, "--prometheus-password-file", "user.password"],
        2,
        r"^gpuctl: --prometheus-password-file: needs --prometheus-user, whose password it holds$",
    ),
    Case(
        [*PROM, "--prometheus-token-file", "t", "--prometheus-user", "ops"],
        2,
        r"^gpuctl: --prometheus-token-file: and --prometheus-user both set: a store takes a bear",
    ),
    Case(
        [*PROM, "--prometheus-token-file", "no.token"],
        2,
        r"cannot read the Prometheus token file /\S+/no\.token \(--prometheus-token-file\): No s",
    ),
    Case(
        [*PROM, "--prometheus-user", "ops", "--prometheus-password-file", "empty.password"],
        2,
        r"password file /\S+/empty\.password \(--prometheus-password-file\) is empty$",
    ),
    Case(
        ["status", "--prometheus", "https://127.0.0.1:9", "--prometheus-ca", "no.pem"],
        2,
        r"cannot read the Prometheus CA file /\S+/no\.pem \(--prometheus-ca\): No such file",
    ),
    Case(
        ["status", "--prometheus", "https://127.0.0.1:9", "--prometheus-ca", "job.py"],
        2,
        r"CA file /\S+/job\.py \(--prometheus-ca\): .*no certificate",
    ),
    Case(["status", "--prometheus-ca", "no.pem"], 2, r"--prometheus-ca goes with --prometheus URL"),
    Case(["status", "--prometheus", "ftp://x"], 2, r"--prometheus: expected http\(s\)://host:port"),
    # other commands
    Case(["demo", "--nodes", "0"], 2, r"--nodes must be within 1\.\.4096"),
    Case(["agent-bundle", "/proc/gpuctl-nope"], 2, r"cannot write the bundle into /proc/"),
    Case(["agent-bundle", "job.py"], 2, r"cannot write the bundle into job\.py"),
    Case(["status", "--timeout", "-1"], 2, r"--timeout must be within"),
    # argparse mistakes are one line too
    Case(["status", "--timeout", "abc"], 2, r"status: argument --timeout: invalid float"),
    Case(["stress", "status", "--demo", "--timeout", "-1"], 2, r"must be a positive number"),
    Case(["stress", "stop", "--demo", "--timeout", "x"], 2, r"not a number of seconds"),
    Case(["stauts"], 2, r"invalid choice: 'stauts'.*see: gpuctl --help"),
    Case(["submit"], 2, r"give FILE\.py:FUNC, or a command after --"),
    Case(["stress", "start", "--engine", "x"], 2, r"stress start: argument --engine"),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("user-errors")
    for name, text in FILES.items():
        if text is not None:
            (d / name).write_text(text)
            if name.endswith(".password"):  # a secret: readable by its owner alone
                (d / name).chmod(0o600)
    from gpuctl.jobs.store import JobRecord, JobStore

    (d / "state").mkdir()
    store = JobStore(d / "state" / "jobs.sqlite")
    for job_id in ("xyz1", "xyz2"):
        store.add(JobRecord(job_id, "job:f", "local", {"kind": "local"}, "/nowhere", "done", 0.0))
    return d


def gpuctl(
    workdir: Path, argv: list[str], env: dict[str, str] | None = None, **kw: Any
) -> subprocess.CompletedProcess[str]:
    full = node_env({"GPUCTL_STATE_DIR": str(workdir / "state"), **(env or {})})
    full.pop("GPUCTL_CONFIG", None) if "GPUCTL_CONFIG" not in (env or {}) else None
    full.pop("GPUCTL_READ_ONLY", None)
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", *argv],
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        env=full,
        cwd=workdir,
        **kw,
    )


def assert_one_line(r: subprocess.CompletedProcess[str], rc: int, message: str, what: Any) -> None:
    assert "Traceback" not in r.stderr, (what, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, (what, r.stderr)
    assert lines[0].startswith("gpuctl: "), (what, lines[0])
    assert re.search(message, lines[0]), (what, lines[0])
    assert r.returncode == rc, (what, r.returncode, lines[0])


def test_every_mistake_is_one_line(workdir: Path) -> None:
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda c: gpuctl(workdir, c.argv, c.env), CASES))
    failures = []
    for case, r in zip(CASES, results, strict=True):
        try:
            assert_one_line(r, case.rc, case.message, case.argv)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


def test_a_tools_multi_line_error_becomes_one_line() -> None:
    """sbatch without a Slurm config writes three lines; gpuctl keeps the first and the last."""
    from gpuctl.cli.main import one_line

    text = (
        "sbatch refused the job: sbatch: error: resolve_ctls_from_dns_srv: Unknown host\n"
        "sbatch: error: fetch_config: DNS SRV lookup failed\n"
        "sbatch: fatal: Could not establish a configuration source\n"
    )
    assert one_line(text) == (
        "sbatch refused the job: sbatch: error: resolve_ctls_from_dns_srv: Unknown host"
        " ... sbatch: fatal: Could not establish a configuration source"
    )
    assert one_line("  one\n") == "one"


def test_config_given_after_the_command_is_used(workdir: Path) -> None:
    r = gpuctl(workdir, ["config", "check", "--config", "sim.toml"])
    assert r.returncode == 0, r.stderr
    assert "2 node(s)" in r.stderr and r.stdout.split()[:2] == ["NODE", "CLUSTER"]


def test_a_closed_stdout_is_no_traceback(workdir: Path) -> None:
    for argv in (["status", "--demo", "--json"], ["jobs", "--json"], ["jobs"]):
        r = gpuctl(workdir, argv, stdout=None, pass_fds=(), close_fds=True, preexec_fn=_close1)
        assert r.returncode == 0, (argv, r.stderr)
        assert r.stderr == "", (argv, r.stderr)


def _close1() -> None:
    os.close(1)


def test_a_reader_that_went_away_is_no_error(workdir: Path) -> None:
    """``gpuctl status | head -1``: the pipe's reader is gone before gpuctl writes."""
    for argv in (["status", "--demo"], ["status", "--demo", "--json"], ["jobs"]):
        read_end, write_end = os.pipe()
        os.close(read_end)  # every write now fails with EPIPE
        try:
            r = gpuctl(workdir, argv, stdout=write_end)
        finally:
            os.close(write_end)
        assert r.returncode == 0, (argv, r.stderr)
        assert r.stderr == "", (argv, r.stderr)


def test_ctrl_c_while_a_node_is_slow_exits_130_in_one_line(workdir: Path) -> None:
    """A node whose sshd accepts the connection and then says nothing: gpuctl waits; SIGINT."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        port = srv.getsockname()[1]
        cfg = workdir / "slow_ssh_config"
        cfg.write_text(f"Host slow\n  HostName 127.0.0.1\n  Port {port}\n  User nobody\n")
        (workdir / "slow_kh").write_text("")
        toml = workdir / "slow.toml"
        toml.write_text(
            f"[clusters.c]\nnodes = 'slow'\nvia = 'ssh'\nssh_config = '{cfg}'\n"
            f"known_hosts = '{workdir / 'slow_kh'}'\n"
        )
        full = node_env({"GPUCTL_STATE_DIR": str(workdir / "state")})
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuctl", "--config", str(toml), "status", "--timeout", "30"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full,
            cwd=workdir,
        )
        srv.settimeout(20)
        conn, _ = srv.accept()  # gpuctl is now waiting for the server's banner
        with conn:
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert err.strip() == "gpuctl: interrupted"
    assert time.monotonic() - t0 < 5
    assert out == ""


def test_internal_errors_are_one_line_and_say_how_to_see_more(workdir: Path) -> None:
    """A bug (here: a command module raising) is one line naming the log that holds its
    traceback; GPUCTL_DEBUG=1 shows the traceback on the terminal."""
    code = (
        "import sys\n"
        "from gpuctl.cli import jobs, main\n"
        "def boom(args):\n"
        "    raise KeyError('x')\n"
        "jobs.run_jobs = boom\n"
        "sys.exit(main.main(['jobs']))\n"
    )
    env = node_env({"GPUCTL_STATE_DIR": str(workdir / "state")})
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    log = workdir / "state" / "logs" / "gpuctl.log"
    assert_one_line(r, 70, rf"internal error: KeyError: 'x'.*traceback in {log}\)$", "bug")
    assert "Traceback" not in r.stderr and "in boom\nKeyError: 'x'" in log.read_text()
    env["GPUCTL_DEBUG"] = "1"
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert "Traceback" in r.stderr and r.returncode == 1


@pytest.mark.slow
def test_ssh_mistakes_are_one_line_for_status_and_submit(ssh_cluster: Any) -> None:
    """Unreachable port, wrong, missing or junk key, unknown host key, no python: real sshd;
    neither the key file's text nor the environment shows up in what gpuctl prints."""
    from gpuctl_tests.harness.sshd import keygen

    ssh_cluster.start_node("good", simulate="1")
    d = ssh_cluster.dir
    base = ssh_cluster.ssh_config_path.read_text().split("Host good\n", 1)[1]
    other_key = d / "other_key"
    keygen(other_key, "not-authorized")
    (d / "empty_known_hosts").write_text("")

    def host(name: str, **over: str) -> str:
        lines = [f"Host {name}"]
        for line in base.splitlines():
            if line.strip():
                key = line.split()[0]
                lines.append(f"    {key} {over[key]}" if key in over else line)
        return "\n".join(lines) + "\n"

    # a port held bound but not listening: refused, and no other test can start a server there
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    entries = {
        "closed": host("closed", Port=str(closed.getsockname()[1])),
        "wrongkey": host("wrongkey", IdentityFile=str(other_key)),
        "nokey": host("nokey", IdentityFile=str(d / "no_such_key")),
        "newhost": host("newhost", UserKnownHostsFile=str(d / "empty_known_hosts")),
        "nopython": host("nopython"),
        "junkkey": host("junkkey", IdentityFile=str(d / "junk_key")),
    }
    (d / "junk_key").write_text("password = hunter2-in-the-key-file\n")
    (d / "junk_key").chmod(0o600)
    with open(ssh_cluster.ssh_config_path, "a") as f:
        f.write("".join(entries.values()))
    expect = {
        "closed": (r"refused the connection \(is sshd running", r"refused the connection"),
        "wrongkey": (r"refused every key: check IdentityFile", r"refused every key"),
        "nokey": (r"cannot read .*no_such_key: no such file", r"cannot read .*no_such_key"),
        "newhost": (r"unknown host key .* to trust it, run: ssh-keyscan", r"unknown host key"),
        "nopython": (
            r"no python at '/no/python3' on nopython: set python",
            r"nopython: no python at '/no/python3' for the job supervisor: set python",
        ),
        "junkkey": (r"refused every key", r"refused every key"),
    }
    jobs = []
    for name in entries:
        toml = ssh_cluster.cluster_toml("c", [name], interval=0.5)
        if name == "newhost":
            toml = toml.replace(str(ssh_cluster.known_hosts_path), str(d / "empty_known_hosts"))
        if name == "nopython":
            toml += f"python = '/no/python3'\nworkload_python = '{sys.executable}'\n"
        (d / f"{name}.toml").write_text(toml)
        (d / "job.py").write_text(FILES["job.py"])
        jobs.append((name, "status", ["--config", f"{name}.toml", "status", "--timeout", "20"]))
        if expect[name][1] is not None:
            argv = ["--config", f"{name}.toml", "submit", "job.py:f", "--target", name]
            jobs.append((name, "submit", argv))
    with closed, ThreadPoolExecutor(5) as pool:
        results = list(pool.map(lambda j: gpuctl(d, j[2], {"MY_PASSWORD": "hunter3"}), jobs))
    failures = []
    for (name, command, _), r in zip(jobs, results, strict=True):
        status_re, submit_re = expect[name]
        pattern = status_re if command == "status" else submit_re
        rc = 1 if command == "status" else 2
        try:
            assert pattern is not None
            assert_one_line(r, rc, pattern, (name, command))
            # no secret of the key file or of the environment in what gpuctl prints
            assert "hunter" not in r.stdout + r.stderr, (name, command, r.stderr)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


# -- no orphans, private folders, no secrets ---------------------------------------------------
def _marked(marker: str) -> set[int]:
    from gpuctl_tests.harness import pids_with_env

    return pids_with_env(marker) - {os.getpid()}


def _start_until(
    argv: list[str], env: dict[str, str], cwd: Path, line: str
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuctl", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    )
    assert proc.stdout is not None
    for out in proc.stdout:  # ends at EOF if gpuctl fails: then the assert below says why
        if line in out:
            return proc
    proc.wait(10)
    raise AssertionError(
        f"gpuctl never printed {line!r}: {proc.stderr.read() if proc.stderr else ''}"
    )


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_local_agents_end_with_gpuctl(tmp_path: Path, sig: int) -> None:
    from gpuctl_tests.helpers import wait_until

    marker = f"GPUCTL_QA_MARK={os.urandom(6).hex()}"
    env = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state"), marker.split("=")[0]: marker[15:]})
    (tmp_path / "c.toml").write_text(
        "[clusters.c]\nnodes = 'n[1-2]'\nvia = 'local'\nsimulate = '1'\ninterval = 0.3\n"
    )
    argv = ["--config", "c.toml", "stress", "start", "--all", "--force", "--duration", "60"]
    proc = _start_until(argv, env, tmp_path, "burning")
    agents = _marked(marker) - {proc.pid}
    assert len(agents) == 2, agents  # one agent per node, nothing else
    proc.send_signal(sig)
    proc.wait(20)
    wait_until(lambda: not _marked(marker), 10, "the agents to exit after gpuctl")


def test_ssh_agents_end_when_gpuctl_dies_and_the_bundle_folder_is_private(
    ssh_cluster: Any, tmp_path: Path
) -> None:
    from gpuctl_tests.helpers import wait_until

    node = ssh_cluster.start_node("n1", simulate="1")
    bundles = tmp_path / "bundles"
    bundles.mkdir(mode=0o755)  # there already, too open (as the job root's parent made it)
    bundles.chmod(0o755)
    cfg = ssh_cluster.write_config(
        tmp_path / "c.toml", simulate=1, interval=0.3, bundle_dir=str(bundles)
    )
    env = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state")})
    base = node.processes()
    proc = _start_until(
        ["--config", str(cfg), "stress", "start", "--all", "--force", "--duration", "60"],
        env,
        tmp_path,
        "burning",
    )
    assert node.processes() - base  # the session and its agent
    assert (bundles.stat().st_mode & 0o777) == 0o700
    proc.kill()
    proc.wait(10)
    wait_until(lambda: node.processes() <= base, 10, "the node's agent to exit")


def test_ssh_bundle_folder_writable_by_everyone_is_refused(
    ssh_cluster: Any, tmp_path: Path
) -> None:
    ssh_cluster.start_node("n1", simulate="1")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    cfg = ssh_cluster.write_config(tmp_path / "c.toml", simulate=1, bundle_dir=str(shared))
    r = gpuctl(tmp_path, ["--config", str(cfg), "status", "--timeout", "20"])
    refused = r"n1:.*shared is writable by others \(drwxrwxrwt, .*\): set bundle_dir"
    assert_one_line(r, 1, refused, "shared")
    assert not list(shared.iterdir())


def test_job_processes_end_and_job_folders_are_private(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(FILES["job.py"])
    from gpuctl_tests.helpers import wait_until

    # a job gets its node's environment and a small base (HOME among it): this test's own HOME
    # marks the supervisor and the job's process
    marker = f"HOME={tmp_path / 'home'}"
    env = {"HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    (tmp_path / "slow.py").write_text("import time\n\ndef f():\n    time.sleep(120)\n")
    r = gpuctl(tmp_path, ["submit", "slow.py:f"], env)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    wait_until(lambda: len(_marked(marker)) >= 2, 20, "the supervisor and the job's process")
    r = gpuctl(tmp_path, ["cancel", job_id[:8]], env)
    assert r.returncode == 0, r.stderr
    wait_until(lambda: not _marked(marker), 20, "the cancelled job's processes to exit")
    # a job that ends by itself leaves nothing either
    r = gpuctl(tmp_path, ["submit", "job.py:f", "--args", "[41]", "--wait"], env)
    assert r.returncode == 0 and r.stdout.split()[-1] == "42", r.stderr
    wait_until(lambda: not _marked(marker), 20, "the finished job's supervisor to exit")
    # every folder gpuctl made for jobs is private
    r = gpuctl(tmp_path, ["jobs", "--json"], env)
    import json

    for job in json.loads(r.stdout)["jobs"]:
        folder = Path(job["jobdir"])
        while folder != tmp_path:  # up to the folder the test made
            assert folder.stat().st_mode & 0o777 == 0o700, folder
            folder = folder.parent


@pytest.mark.slow
def test_an_acceptance_run_ends_with_gpuctl(tmp_path: Path) -> None:
    """SIGKILL gpuctl mid-suite: its agent and the suite's workload process go too."""
    need_torch()
    from gpuctl_tests.helpers import wait_until

    mark = os.urandom(6).hex()
    env = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state"), "GPUCTL_QA_MARK": mark})
    argv = ["accept", "--local", "--device", "cpu", "--quick", "--no-history"]
    proc = _start_until(argv, env, tmp_path, "COMPUTE")
    running = _marked(f"GPUCTL_QA_MARK={mark}") - {proc.pid}
    assert len(running) >= 2, running  # the agent and the suite
    proc.kill()
    proc.wait(10)
    wait_until(lambda: not _marked(f"GPUCTL_QA_MARK={mark}"), 15, "the suite to end")


def test_srun_bundle_folder_is_made_private_and_a_shared_one_refused(tmp_path: Path) -> None:
    from gpuctl.config import load_config
    from gpuctl.fleet.session import LinkError
    from gpuctl.fleet.slurm import SrunLink

    def link(folder: Path) -> SrunLink:
        cfg = tmp_path / "c.toml"
        cfg.write_text(
            f"[clusters.c]\nnodes = 'n1'\nvia = 'srun'\njobid = 1\nbundle_dir = '{folder}'\n"
        )
        (node,) = load_config(str(cfg)).nodes()
        return SrunLink(node)

    wide = tmp_path / "wide"
    wide.mkdir()
    wide.chmod(0o755)
    bundle = link(wide)._bundle_path()
    assert bundle.parent == wide and wide.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(LinkError, match="writable by others: set bundle_dir"):
        link(shared)._bundle_path()
    assert not list(shared.iterdir())


def test_ctrl_c_while_waiting_for_a_job_leaves_the_job_running(tmp_path: Path) -> None:
    import json

    from gpuctl_tests.helpers import wait_until

    mark = os.urandom(6).hex()
    env = {"HOME": str(tmp_path / "home"), "GPUCTL_QA_MARK": mark}
    (tmp_path / "home").mkdir()
    (tmp_path / "slow.py").write_text(
        "import time\n\ndef f():\n    print('started', flush=True)\n    time.sleep(120)\n"
    )
    full = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state"), **env})
    proc = _start_until(["submit", "slow.py:f", "--wait"], full, tmp_path, "")  # the job id

    def running() -> bool:
        r = gpuctl(tmp_path, ["jobs", "--json"], env)
        return bool(
            r.returncode == 0
            and [j for j in json.loads(r.stdout)["jobs"] if j["state"] == "running"]
        )

    try:
        wait_until(running, 20, "the job to run")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 130
        line = err.strip()
        assert re.fullmatch(
            r"gpuctl: job (\w{12}) keeps running on local: `gpuctl cancel \1` stops it "
            r"\(`gpuctl result \1` waits for it again\)",
            line,
        )
        job_id = line.split()[2]
        assert running()  # the job goes on
        r = gpuctl(tmp_path, ["cancel", job_id], env)
        assert r.returncode == 0, r.stderr
        wait_until(lambda: not _marked(f"GPUCTL_QA_MARK={mark}"), 20, "the cancelled job to end")
    finally:  # a failure above must not leave gpuctl or the 120 s job behind
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for pid in _marked(f"GPUCTL_QA_MARK={mark}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_job_folders_over_ssh_are_private_parents_included(
    ssh_cluster: Any, tmp_path: Path
) -> None:
    import json

    ssh_cluster.start_node("j1", simulate="1", python=sys.executable)
    root = tmp_path / "made" / "by" / "gpuctl"
    cfg = ssh_cluster.write_config(
        tmp_path / "c.toml", workload_python=sys.executable, extra=f"[jobs]\ndir = '{root}'\n"
    )
    (tmp_path / "job.py").write_text(FILES["job.py"])
    r = gpuctl(tmp_path, ["--config", str(cfg), "submit", "job.py:f", "--target", "j1", "--wait"])
    assert r.returncode == 0 and r.stdout.split()[-1] == "2", r.stderr
    (job,) = json.loads(gpuctl(tmp_path, ["jobs", "--json"]).stdout)["jobs"]
    folder = Path(job["jobdir"].split(":", 1)[-1])
    import pwd

    assert folder.parent == root / pwd.getpwuid(os.getuid()).pw_name  # one folder per user
    while folder != tmp_path:
        assert folder.stat().st_mode & 0o777 == 0o700, folder
        folder = folder.parent


@pytest.mark.slow
def test_ctrl_c_during_an_acceptance_run_says_cancelled(tmp_path: Path) -> None:
    need_torch()
    env = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state")})
    argv = ["accept", "--local", "--device", "cpu", "--quick", "--no-history"]
    proc = _start_until(argv, env, tmp_path, "[ENV] PASS")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "ERROR: cancelled (Ctrl-C" in out + err and "ended without it" not in out + err
    assert err.strip().splitlines()[-1] == "gpuctl: interrupted"
    assert "Traceback" not in err


@pytest.mark.slurm
@pytest.mark.slow
def test_srun_agents_end_when_gpuctl_is_killed(slurm_cluster: Any, tmp_path: Path) -> None:
    """SIGKILL gpuctl while it streams through ``srun``: the agent's job step ends, the job
    that holds the node stays."""
    from gpuctl_tests.helpers import wait_until

    out = slurm_cluster.run(["sbatch", "--parsable", "-J", "holder", "--wrap", "sleep 300"])
    job = out.stdout.strip().split(";")[0]

    def job_state() -> str:
        return slurm_cluster.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()

    try:
        wait_until(lambda: job_state() == "RUNNING", 30, "the holding job to run")
        (tmp_path / "c.toml").write_text(
            f"[clusters.hpc]\nvia = 'srun'\nnodes = '{slurm_cluster.node}'\njobid = {job}\n"
            f"slurm_conf = '{slurm_cluster.conf_path}'\nbundle_dir = '{tmp_path / 'b'}'\n"
            "simulate = '1'\ninterval = 0.3\n"
        )
        env = node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state"), **slurm_cluster.env})
        argv = ["--config", "c.toml", "stress", "start", "--all", "--force", "--duration", "60"]
        proc = _start_until(argv, env, tmp_path, "burning")

        def steps() -> list[str]:
            r = slurm_cluster.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"])
            return [s for s in r.stdout.split() if not s.endswith((".batch", ".extern"))]

        assert steps()  # the agent runs as a step of the job
        proc.kill()
        proc.wait(10)
        wait_until(lambda: not steps(), 20, "the agent's step to end with gpuctl")
        assert job_state() == "RUNNING"
    finally:
        slurm_cluster.run(["scancel", job])
