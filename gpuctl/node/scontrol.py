"""The node side's one Slurm command, ``scontrol``, and what the supervisor asks it.

The login side runs Slurm's commands through ``gpuctl.reach.slurm``, which a node's Python 3.6
cannot import; the supervisor needs three answers on the node: ``show hostnames`` (the
rendezvous: ``rendezvous``), ``show job`` (a preemption or a cancel: ``slurm_preemption``) and
``requeue`` (after a checkpoint: ``attempts``). ``gpuctl_tests/reach/test_slurm.py`` checks that
no other node module runs a Slurm command. Standard library only, Python 3.6.
"""

import subprocess
from typing import Dict, List, Optional, Tuple


def _output(argv: List[str], env: Optional[Dict[str, str]] = None,
            timeout: float = 60) -> Tuple[int, str]:
    """Run a node tool: (exit status, its stdout and stderr as text); -1 and why when it cannot
    start or does not answer within ``timeout`` seconds."""
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env)
    except OSError as e:
        return -1, "%s: %s" % (type(e).__name__, e)
    try:
        out = p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return -1, "%s did not answer in %d s" % (argv[0], timeout)
    return p.returncode, out.decode("utf-8", "replace").strip()


def scontrol(*args: str, timeout: float = 60) -> Tuple[int, str]:
    """Run ``scontrol ARGS`` on this node: (exit status, its output). The node side's only Slurm
    command (the login side's go through ``gpuctl.reach.slurm``, which a node's Python 3.6
    cannot import): ``show hostnames`` for the rendezvous, ``requeue`` after a checkpoint,
    ``show job`` to tell a preemption from a cancel."""
    return _output(["scontrol"] + list(args), timeout=timeout)


def slurm_preemption(job_id: str, restarts: int) -> Optional[Dict[str, str]]:
    """Whether Slurm is preempting (or requeuing) job ``job_id``, asked when a SIGTERM came:
    the evidence (``scontrol -o show job`` fields) or None (a cancel, the time limit, or Slurm
    did not answer). A preemption with a grace time sets the job's PreemptTime; once the grace
    is over Slurm requeues the job before it signals it, so its Restarts count is above
    ``restarts`` (this run's ``SLURM_RESTART_COUNT``). A cancel or a time limit does neither."""
    rc, out = scontrol("-o", "show", "job", job_id, timeout=10)
    if rc != 0:
        return None
    fields = {}  # type: Dict[str, str]
    for word in out.split():
        key, sep, value = word.partition("=")
        if sep and key in ("JobState", "Restarts", "PreemptTime"):
            fields.setdefault(key, value)
    if fields.get("PreemptTime", "None") not in ("None", "Unknown", "N/A", ""):
        return fields
    count = fields.get("Restarts", "")
    if count.isdigit() and int(count) > restarts:
        return fields
    return None
