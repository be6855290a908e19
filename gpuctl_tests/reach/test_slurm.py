"""The Slurm client: parsers fed what a real Slurm 22.05.8 printed (``slurm_22.05/``, captured
from the test cluster), the checks on every value that goes into a batch script, the rule that
picks the cluster, and one rule that keeps every Slurm command in ``gpuctl/reach/slurm.py``."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

from gpuctl.config import parse_config
from gpuctl.fleet.slurm import MAX_INTERVAL, next_delay
from gpuctl.reach.slurm import (
    COMMANDS,
    SlurmClient,
    SlurmError,
    SlurmValueError,
    check_hostlist,
    check_name,
    job_name,
    nodelist,
    parse_config_value,
    parse_sacct_state,
    parse_sbatch,
    parse_scontrol_job,
    parse_scontrol_state,
    parse_sinfo,
    parse_squeue,
    sbatch_arg,
    sbatch_path,
    slurm_target,
)
from gpuctl_tests.helpers import REPO

DATA = Path(__file__).parent / "slurm_22.05"


def captured(name: str) -> str:
    return (DATA / name).read_text()


# -- parsers, on real output ------------------------------------------------------------------
def test_squeue_text_of_running_pending_array_and_held_jobs() -> None:
    jobs = {j.job_id: j for j in parse_squeue(captured("squeue-r-O.txt"))}
    assert sorted(jobs) == ["14", "15", "16_0", "16_1", "16_2", "16_3", "17"]
    run = jobs["14"]
    assert (run.unique_id, run.state, run.user, run.nodes, run.gpus, run.reason) == (
        "14",
        "RUNNING",
        "root",
        "localhost",
        True,
        None,
    )
    assert run.node_names() == ["localhost"]
    task = jobs["16_2"]  # a pending array task: the array's number, no nodes yet
    assert (task.unique_id, task.state, task.nodes, task.gpus) == ("16", "PENDING", "", True)
    assert task.reason == "Resources" and task.node_names() == []
    held = jobs["17"]  # submitted as -J 'held|pipe': names are never asked for
    assert (held.gpus, held.reason) == (False, "JobHeldUser")


def test_squeue_lines_that_are_no_record_are_skipped() -> None:
    text = (
        "evil\n"  # the tail of a job name with a newline, were names ever asked for
        "7|RUNNING\n"
        "x|7|RUNNING|root|n1|N/A|N/A|N/A|N/A|None\n"  # not a job number
        "8|8|running|root|n1|N/A|N/A|N/A|N/A|None\n"  # not a state word
        "9|9|RUNNING|root|n1|N/A|gres:gpu:2|N/A|N/A|None\n"
    )
    (job,) = parse_squeue(text)
    assert (job.job_id, job.gpus) == ("9", True)


def test_sinfo_and_config_and_final_states() -> None:
    (node,) = parse_sinfo(captured("sinfo-N-o.txt"))
    assert (node.name, node.partitions, node.gpus, node.gpu_type, node.state) == (
        "localhost",
        ("debug",),
        2,
        "h100",
        "mixed",
    )
    assert node.reason is None and not node.down and not node.drained
    config = captured("scontrol-show-config.txt")
    assert parse_config_value(config, "JobAcctGatherType") == "jobacct_gather/none"
    assert parse_config_value(config, "JobAcctGatherParams") is None  # "(null)"
    assert parse_config_value(config, "NoSuchKey") is None
    assert parse_scontrol_state(captured("scontrol-o-show-job-cancelled.txt")) == "CANCELLED"
    # sacct -n -P -X -o JobID,State (the documented layout; the test cluster has no slurmdbd)
    sacct = "41|COMPLETED\n42_3|CANCELLED by 0\n42_30|FAILED\n"
    assert parse_sacct_state(sacct, "42_3") == "CANCELLED"
    assert parse_sacct_state(sacct, "41") == "COMPLETED"
    assert parse_sacct_state(sacct, "43") is None


def test_sbatch_parsable() -> None:
    assert parse_sbatch("18\n") == "18"
    assert parse_sbatch("18;gpuctltest\n") == "18"  # with a cluster name (-M, federation)
    with pytest.raises(SlurmError, match=r"^sbatch answered 'Submitted batch job 18', not"):
        parse_sbatch("Submitted batch job 18\n")


def test_gpu_indices_from_scontrol_detail() -> None:
    assert parse_scontrol_job(captured("scontrol-d-show-job-gpu.txt")) == {"localhost": [0]}


def test_a_job_whose_name_carries_slurm_lines_claims_no_gpu() -> None:
    """``sbatch -J $'evil\\n   NumNodes=1\\n     Nodes=localhost ... GRES=gpu:h100:2(IDX:0-1)...'``
    on the test cluster: scontrol prints the name raw, so the job seemed to hold both GPUs (the
    text before this change gave {"localhost": [0, 1]}). Which lines are Slurm's cannot be told
    then: no GPU is claimed at all."""
    text = captured("scontrol-d-show-job-name-with-lines.txt")
    assert "GRES=gpu:h100:2(IDX:0-1)" in text and "GRES=gpu:h100:1(IDX:1)" in text
    assert parse_scontrol_job(text) == {}


# -- what goes into a batch script ------------------------------------------------------------
def test_a_hostlist_with_a_newline_is_refused_in_one_line() -> None:
    with pytest.raises(SlurmValueError) as err:
        check_hostlist("gpu1\n#SBATCH --wrap=touch /tmp/x", "--nodes")
    msg = str(err.value)
    assert msg.startswith("--nodes: bad hostlist 'gpu1\\n#SBATCH")
    assert "\n" not in msg
    assert isinstance(err.value, ValueError) and isinstance(err.value, SlurmError)
    for bad in ("gpu[1-3", "a b", "", "a,-x", "n$(id)", "n;reboot", "n\tm", ".hidden"):
        with pytest.raises(SlurmValueError, match=r"^--nodes: "):
            check_hostlist(bad, "--nodes")
    assert check_hostlist("gpu[01-03],dgx-a", "--nodes") == ["gpu01", "gpu02", "gpu03", "dgx-a"]
    assert nodelist(["gpu01", "gpu02", "gpu03", "dgx-a"]) == "dgx-a,gpu[01-03]"


def test_partition_and_account_names() -> None:
    assert check_name("gpu-h100.long_1", "--partition") == "gpu-h100.long_1"
    for bad in ("gpu\n#SBATCH --wrap=x", "a b", "-p", "a,b", "", "x=1", "a'b"):
        with pytest.raises(SlurmValueError, match=r"^--partition: bad name .*: use letters"):
            check_name(bad, "--partition")


def test_job_names_keep_only_safe_characters() -> None:
    name = job_name("x$(touch /tmp/pwned)\n#SBATCH --wrap=id \"q\" 'r' `id`")
    assert name.startswith("gpuctl-x_touch_tmp_pwned_SBATCH_--wrap_id_q_r_id")
    assert set(name) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
    assert len(job_name("f" * 500)) == 64
    assert job_name("map:train.<lambda>") == "gpuctl-map_train._lambda"
    assert job_name("\n\n") == "gpuctl-job"


def test_paths_in_sbatch_lines_are_quoted_or_refused() -> None:
    assert sbatch_path("/shared/a b/$HOME#x'y", "job folder") == '"/shared/a b/$HOME#x\'y"'
    assert sbatch_path("/j/slurm-%A_%a.out", "job folder", pattern=True) == '"/j/slurm-%A_%a.out"'
    for bad, why in (
        ("/j/x\n#SBATCH --wrap=id", "holds '\\n'"),
        ('/j/a"b', "holds '\"'"),
        ("/j/a\\b", "holds '\\\\'"),
        ("relative/dir", "is not an absolute path"),
    ):
        with pytest.raises(SlurmValueError, match=r"^job folder: ") as err:
            sbatch_path(bad, "job folder")
        assert why in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(SlurmValueError, match="holds '%', which Slurm reads as a file name"):
        sbatch_path("/j/100%/slurm-%j.out", "--job-dir", pattern=True)


def test_extra_sbatch_options_are_one_option_each() -> None:
    assert sbatch_arg("--begin=now+3600") == "--begin=now+3600"
    assert sbatch_arg("--comment=two words") == '--comment="two words"'
    assert sbatch_arg("-x") == "-x"
    for bad in ("--qos=a\n#SBATCH --wrap=id", "hello", '--comment="x"', "--a=b\\c", "-"):
        with pytest.raises(SlurmValueError, match="is not one sbatch option"):
            sbatch_arg(bad)


# -- the watcher's pace -----------------------------------------------------------------------
def test_the_watcher_backs_off_when_slurm_fails_or_is_slow() -> None:
    assert next_delay(10, 10, True, 0.05) == 10  # quick answer: the interval
    assert next_delay(10, 10, True, 5.0) == 50  # 5 s squeue: wait ten times as long
    assert next_delay(10, 10, False, 0.0) == 20  # failures double the wait...
    assert next_delay(10, 20, False, 0.0) == 40
    assert next_delay(10, 160, False, 0.0) == MAX_INTERVAL == 300  # ...up to five minutes
    assert next_delay(10, 300, False, 0.0) == MAX_INTERVAL
    assert next_delay(10, 300, True, 0.05) == 10  # and recover at once
    assert next_delay(0.3, 0.3, True, 0.05) == 0.3


# -- which cluster a command submits to ---------------------------------------------------------
def test_slurm_target_rule(tmp_path: Path) -> None:
    def cfg(text: str):  # type: ignore[no-untyped-def]
        return parse_config(text, str(tmp_path / "config.toml"))

    empty = slurm_target(cfg(""), "accept")
    assert (empty.slurm_conf, empty.partition) == (None, None)
    one = cfg('[clusters.hpc]\nvia = "srun"\nslurm_conf = "hpc.conf"\npartition = "gpu"\n')
    t = slurm_target(one, "accept")
    assert (t.slurm_conf, t.partition) == (str(tmp_path / "hpc.conf"), "gpu")
    assert t.origin == "[clusters.hpc] slurm_conf"
    assert slurm_target(one, "jobs", partition="debug").partition == "debug"  # the option wins
    own = cfg(
        '[accept]\nslurm_conf = "~/acc.conf"\npartition = "acc"\n'
        '[clusters.hpc]\nvia = "srun"\nslurm_conf = "/x/hpc.conf"\n'
    )
    t = slurm_target(own, "accept")
    assert (t.slurm_conf, t.partition) == (str(Path("~/acc.conf").expanduser()), "acc")
    assert slurm_target(own, "jobs").slurm_conf == "/x/hpc.conf"  # [accept] is accept's only
    two = cfg(
        '[clusters.a]\nnodes = "a[1-2]"\nslurm_conf = "/a.conf"\n'
        '[clusters.b]\nnodes = "b1"\nslurm_conf = "/b.conf"\npartition = "pb"\n'
        '[clusters.lab]\nnodes = "lab1"\n'  # plain SSH nodes: not a Slurm cluster
    )
    with pytest.raises(SlurmValueError, match=r"^clusters a, b name different slurm_conf files"):
        slurm_target(two, "accept")
    t = slurm_target(two, "accept", nodes=["b1"])  # the cluster holding --nodes
    assert (t.slurm_conf, t.partition) == ("/b.conf", "pb")
    with pytest.raises(SlurmValueError, match=r"^\[jobs\] partition: bad name"):
        slurm_target(cfg('[jobs]\npartition = "a\\n#SBATCH --wrap=id"\n'), "jobs")


# -- the client's errors ----------------------------------------------------------------------
def test_a_missing_slurm_conf_is_said_at_once(tmp_path: Path) -> None:
    """Without this check squeue retries for 60 s before it says the file is missing."""
    client = SlurmClient(tmp_path / "nope.conf", origin="[clusters.hpc] slurm_conf")
    t0 = time.monotonic()
    with pytest.raises(SlurmError) as err:
        client.jobs(user="root")
    assert time.monotonic() - t0 < 2
    assert str(err.value) == (
        f"squeue: {tmp_path / 'nope.conf'} does not exist: fix [clusters.hpc] slurm_conf"
        " (the cluster's slurm.conf)"
    )


def test_a_controller_that_does_not_answer_meets_the_deadline(
    tmp_path: Path, closed_port: int
) -> None:
    """A slurm.conf whose controller port refuses: Slurm's clients retry for ~10 s; the client
    gives up at its deadline with one line."""
    from gpuctl_tests.harness.slurm import missing_parts

    if missing_parts():
        pytest.skip(str(missing_parts()))
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=dead\nSlurmctldHost=localhost(127.0.0.1)\n"
        f"SlurmctldPort={closed_port}\nAuthType=auth/none\nCredType=cred/none\n"
        "NodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n"
    )
    client = SlurmClient(conf, timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(SlurmError) as err:
        client.nodes()
    assert time.monotonic() - t0 < 5
    assert str(err.value).startswith("sinfo ")
    assert "\n" not in str(err.value)


# -- one home for Slurm commands --------------------------------------------------------------
def _slurm_command_lines(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a file builds a Slurm command line: a list or tuple whose first item is a Slurm
    command name, or a string handed to a process-starting call that begins with one."""
    found = []
    starters = {"run", "Popen", "check_output", "check_call", "call", "system", "popen"}
    starters |= {"create_subprocess_exec", "create_subprocess_shell", "execvp", "execv"}
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple) and node.elts:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and first.value in COMMANDS:
                found.append((node.lineno, str(first.value)))
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if (
                name in starters
                and isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
                and arg.value.split()[:1] in ([c] for c in COMMANDS)
            ):
                found.append((node.lineno, arg.value.split()[0]))
    return sorted(found)


def test_slurm_commands_run_only_in_the_slurm_client() -> None:
    """squeue, sinfo, scontrol, sbatch, sacct and scancel are run by gpuctl/reach/slurm.py and
    nowhere else in the package (srun is a launcher: the srun link and batch scripts own it).
    The node side, which cannot import it (Python 3.6), has one function of its own:
    ``gpuctl.node.scontrol.scontrol``."""
    home = REPO / "gpuctl" / "reach" / "slurm.py"
    node = REPO / "gpuctl" / "node" / "scontrol.py"
    offenders = []
    for path in sorted((REPO / "gpuctl").rglob("*.py")):
        if path == home:
            continue
        tree = ast.parse(path.read_text(), str(path))
        if path == node:  # only inside its scontrol()
            (fn,) = [
                f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "scontrol"
            ]
            tree.body.remove(fn)
            assert _slurm_command_lines(ast.Module(body=[fn], type_ignores=[]))  # seen there
        offenders += [
            f"{path.relative_to(REPO)}:{n}: {cmd}" for n, cmd in _slurm_command_lines(tree)
        ]
    assert offenders == [], "run Slurm commands through gpuctl.reach.slurm.SlurmClient"
    assert _slurm_command_lines(ast.parse(home.read_text()))  # the rule sees the real ones


def test_the_rule_catches_the_shapes_of_a_slurm_call() -> None:
    caught = _slurm_command_lines(
        ast.parse(
            "subprocess.run(['squeue', '--json'])\n"
            "x = ('sbatch', '--parsable', path)\n"
            "os.system('scancel 12')\n"
            "asyncio.create_subprocess_shell('sinfo -h')\n"
            "subprocess.run(['srun', 'hostname'])\n"  # a launcher, not a query
            "print('scontrol show hostnames')\n"  # text, not a command
        )
    )
    assert [c for _, c in caught] == ["squeue", "sbatch", "scancel", "sinfo"]
