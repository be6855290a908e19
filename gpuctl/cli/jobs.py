"""``gpuctl submit / jobs / logs / cancel / result``: run functions on nodes and inspect them.

Jobs live in the job store (SQLite under the XDG state dir), so every command works after gpuctl
restarted. Each user mistake is one line (``gpuctl: ...``, exit 2), never a traceback.
"""

from __future__ import annotations

import argparse
import codecs
import functools
import importlib.util
import json
import os
import pickle
import shutil
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from gpuctl.cli.base import ExitCode, UserError
from gpuctl.cli.common import emit_json
from gpuctl.core.format import fmt_age

if TYPE_CHECKING:
    from gpuctl.cli.base import Subcommands
    from gpuctl.config import Config
    from gpuctl.jobs import Job, JobRecord, JobStore

T = TypeVar("T")


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "submit",
        help="run FILE.py:FUNC, or a command given after --, on a node (local, a configured "
        "node, or slurm)",
        usage="gpuctl submit [options] FILE.py:FUNC\n"
        "       gpuctl submit [options] -- CMD [ARGS...]",
        after_dashes="argv",  # not "command": the top-level dest of the chosen command
    )
    p.add_argument(
        "spec",
        metavar="FILE.py:FUNC",
        nargs="?",
        help="the file and the function in it; or, after --, a command and its arguments, run "
        "in VENV2's environment (its python first on PATH) in the job's folder or here",
    )
    p.add_argument(
        "--args",
        metavar="JSON",
        help="arguments as JSON: a list (positional) or an object (keywords), e.g. '[1, \"a\"]'",
    )
    p.add_argument(
        "--target",
        default="local",
        help="local (default), slurm, a node name, or debug (in this process: pdb works)",
    )
    p.add_argument("--python", help="VENV2 interpreter on the target (default: the node's)")
    p.add_argument("--supervisor-python", help="VENV1 interpreter on the target (python3)")
    p.add_argument("--mem", help="memory limit, e.g. 4G")
    p.add_argument("--time-limit", type=float, metavar="SECONDS", help="time limit")
    p.add_argument(
        "--nodes", type=int, default=1, metavar="N", help="Slurm nodes (a job of several tasks)"
    )
    p.add_argument(
        "--tasks-per-node",
        type=int,
        default=1,
        metavar="K",
        help="tasks per node (Slurm; each with RANK, WORLD_SIZE, MASTER_ADDR... set)",
    )
    p.add_argument(
        "--partition",
        help="Slurm partition (target slurm; default: [jobs] partition, else the Slurm "
        "cluster's of the config)",
    )
    p.add_argument(
        "--setup",
        action="append",
        default=[],
        metavar="LINE",
        help="a shell line to run before VENV2 starts (repeatable)",
    )
    p.add_argument(
        "--ship-limit",
        metavar="SIZE",
        help="most bytes of your project's modules that travel with the job (default 64M; "
        "0: ship none)",
    )
    p.add_argument(
        "--ship-exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="leave out of what ships the files, folders and modules matching PATTERN "
        "(fnmatch, e.g. 'data*' or 'proj.experiments.*'; repeatable)",
    )
    p.add_argument(
        "--env-pass",
        action="append",
        default=[],
        metavar="PATTERN",
        help="pass this environment's variables matching PATTERN to the job (fnmatch, e.g. "
        "'WANDB_*' or HF_TOKEN; repeatable): a job gets its node's environment, not this one's",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait and print the result or report; a command's output is followed as it comes "
        "and gpuctl exits with the command's exit status",
    )
    p.set_defaults(func=run_submit)

    p = sub.add_parser(
        "jobs", help="list submitted jobs (newest first); `jobs purge --older-than 7d` cleans up"
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=["purge"],
        help="purge: delete ended jobs, their folders and the caches no job used for AGE",
    )
    p.add_argument("--limit", metavar="N", type=int, default=30, help="the newest N jobs (30)")
    p.add_argument("--json", action="store_true", help="JSON for scripts")
    p.add_argument(
        "--older-than",
        metavar="AGE",
        help="purge: jobs that ended longer ago than AGE (30m, 12h, 7d, or seconds)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="purge: list what would go, delete nothing"
    )
    p.set_defaults(func=run_jobs)

    p = sub.add_parser("logs", help="print a job's stdout and stderr")
    p.add_argument("id", help="job id (a unique prefix is enough)")
    p.add_argument("--stdout", action="store_true", help="only stdout")
    p.add_argument("--stderr", action="store_true", help="only stderr")
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing what the job writes until it ends (stdout here, stderr to stderr)",
    )
    p.add_argument(
        "--rank",
        type=int,
        metavar="R",
        help="a job of several tasks: rank R's logs (default: rank 0's)",
    )
    ends = p.add_mutually_exclusive_group()
    ends.add_argument(
        "--tail",
        type=int,
        metavar="N",
        help="only the last N lines (read on the node: a big log is not fetched whole); with "
        "-f, then what comes",
    )
    ends.add_argument("--head", type=int, metavar="N", help="only the first N lines")
    p.add_argument(
        "--raw",
        action="store_true",
        help="the job's bytes as it wrote them, terminal escapes included (by default they "
        "are removed, on a terminal and in a pipe alike)",
    )
    p.set_defaults(func=run_logs)

    p = sub.add_parser("cancel", help="cancel jobs")
    p.add_argument("ids", nargs="+", metavar="ID", help="job ids (a unique prefix is enough)")
    p.set_defaults(func=run_cancel)

    p = sub.add_parser("result", help="print a job's result, or its failure report")
    p.add_argument("id", help="job id (a unique prefix is enough)")
    p.add_argument("--timeout", type=float, default=0.0, help="seconds to wait (default: none)")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the whole result as a pickle to FILE (- for stdout) instead of printing a "
        "shortened repr; works even where the result's classes cannot be imported",
    )
    p.set_defaults(func=run_result)


def load_function(spec: str) -> Any:
    """The function named by ``FILE.py:FUNC``; raises UserError with one line otherwise."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise UserError(f"{spec!r}: expected FILE.py:FUNC, e.g. train.py:main")
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file")
    mod_name = "gpuctl_user_" + "".join(
        c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0]
    )
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise UserError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        loader_spec.loader.exec_module(module)
    except SyntaxError as e:
        where = f"{path}:{e.lineno}" if e.lineno else path
        raise UserError(f"{where}: syntax error: {e.msg}") from None
    except ValueError as e:
        if not (str(e).startswith("source code") and "null bytes" in str(e)):
            raise UserError(f"{path} failed to import: ValueError: {e}") from None
        # Pythons before 3.11.4 say so with a ValueError from compile(), later ones a SyntaxError
        raise UserError(f"{path}: syntax error: {e}") from None
    except SystemExit as e:  # script code at the top level: it must not end gpuctl silently
        raise UserError(
            f"{path} called sys.exit({e.code!r}) when imported: put its script code under "
            "if __name__ == '__main__':"
        ) from None
    except Exception as e:
        raise UserError(f"{path} failed to import: {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if fn is None:
        funcs = sorted(
            k
            for k, v in vars(module).items()
            if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == mod_name
        )
        hint = f" (it has: {', '.join(funcs[:8])})" if funcs else ""
        raise UserError(f"{path} has no function {name!r}{hint}")
    if not callable(fn):
        raise UserError(f"{path}:{name} is a {type(fn).__name__}, not a function")
    from gpuctl.jobs.pickling import check_callable, check_picklable

    try:  # as a submit checks and pickles it: the culprit named
        check_callable(fn)
        check_picklable(f"{path}:{name}", fn)
    except TypeError as e:
        raise UserError(str(e)) from None
    except Exception as e:
        raise UserError(f"{path}:{name} cannot be pickled: {type(e).__name__}: {e}") from None
    return fn


def parse_args_json(text: str) -> tuple[list[Any], dict[str, Any]]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise UserError(f"--args is not valid JSON: {e}") from None
    if isinstance(value, list):
        return value, {}
    if isinstance(value, dict):
        return [], value
    raise UserError("--args must be a JSON list (positional) or object (keywords)")


def _check_limits(args: argparse.Namespace) -> None:
    from gpuctl.jobs.executor import parse_mem

    if args.mem is not None:
        try:
            ok = (parse_mem(args.mem) or 0) > 0
        except ValueError:
            ok = False
        if not ok:
            raise UserError(f"--mem {args.mem!r}: expected a size like 4G, 512M or 1.5GB")
    if getattr(args, "ship_limit", None) is not None:
        try:
            ok = (parse_mem(args.ship_limit) or 0) >= 0
        except ValueError:
            ok = False
        if not ok:
            raise UserError(
                f"--ship-limit {args.ship_limit!r}: expected a size like 64M or 1G (0: ship none)"
            )
    if args.time_limit is not None and not args.time_limit > 0:
        raise UserError(f"--time-limit must be positive seconds, not {args.time_limit:g}")


def _config(args: argparse.Namespace) -> Config:
    """The command's session's config (read once: the read-only decision used it too)."""
    from gpuctl.cli.common import load_user_config

    return load_user_config(args)


def _command_of(args: argparse.Namespace) -> list[str] | None:
    """The command after ``--`` (None: a function job); UserError for a mix-up of the two."""
    command: list[str] | None = args.argv
    if command is None:
        if not args.spec:
            raise UserError("give FILE.py:FUNC, or a command after --: gpuctl submit -- CMD ARGS")
        return None
    if args.spec:
        raise UserError(f"give FILE.py:FUNC or a command after --, not both ({args.spec!r})")
    if not command:
        raise UserError("nothing after --: give the command, e.g. gpuctl submit -- python a.py")
    if args.args is not None:
        raise UserError("--args is for FILE.py:FUNC; a command takes its arguments after --")
    return command


def run_submit(args: argparse.Namespace) -> int:
    from gpuctl.jobs import Executor, HostError, JobFailed
    from gpuctl.jobs.pickling import PayloadTooLarge, Unpicklable
    from gpuctl.reach.slurm import SlurmError

    command = _command_of(args)
    call_args, call_kwargs = parse_args_json(args.args or "[]")
    _check_limits(args)
    fn: Any = load_function(args.spec) if command is None else None
    # target slurm reads the config too: [jobs] slurm_conf / partition, or the Slurm cluster's
    config = None if args.target in ("local", "debug") else _config(args)
    opts: dict[str, Any] = {
        "mem": args.mem,
        "time_limit": args.time_limit,
        "setup": args.setup,
        "nodes": args.nodes,
        "tasks_per_node": args.tasks_per_node,
    }
    if args.python:
        opts["python"] = args.python
    if args.supervisor_python:
        opts["supervisor_python"] = args.supervisor_python
    if args.partition:
        opts["partition"] = args.partition
    if args.ship_limit is not None:
        opts["ship_limit"] = args.ship_limit
    if args.ship_exclude:
        opts["ship_exclude"] = args.ship_exclude
    if args.env_pass:
        opts["env_pass"] = args.env_pass
    if args.target != "debug":  # a debug job is kept nowhere
        from gpuctl.cli.common import job_store

        opts["store"] = job_store(args)  # the session's, not one of the executor's own
    try:  # read-only mode: decided by gpuctl.cli.main before the command ran
        ex = Executor(args.target, config=config, read_only=_decided(args), **opts)
    except ValueError as e:
        raise UserError(str(e)) from None
    try:
        if command is not None:
            job = ex.submit_command(command)
        else:
            job = ex.submit(fn, *call_args, **call_kwargs)
    except JobFailed as e:
        if e.kind == "venv1_wont_start":  # a path the user typed or configured: one line
            raise UserError(
                f"cannot start the job on {args.target}: {e.report.evidence[0]} "
                "(check --supervisor-python, or the node's python in the config)"
            ) from None
        print(str(e), file=sys.stderr)
        return ExitCode.FAILED
    except (HostError, SlurmError, PayloadTooLarge) as e:
        raise UserError(str(e)) from None
    except Unpicklable as e:  # names the culprit
        raise UserError(str(e)) from None
    except (pickle.PicklingError, TypeError) as e:
        raise UserError(f"cannot pickle the call: {e}") from None
    except OSError as e:  # an interpreter or a folder that is not there
        from gpuctl.cli.base import os_error

        raise UserError(
            f"cannot start the job on {args.target}: {os_error(e)} "
            "(check --python / --supervisor-python and the job folder)"
        ) from None
    if command is not None and (args.wait or ex.debug):
        if not ex.debug:  # stdout is the command's own: the id goes to stderr
            print(f"gpuctl: job {job.id}", file=sys.stderr, flush=True)
        return _follow_command(job)
    if ex.debug:  # over already, and kept nowhere: its id would name nothing
        return _print_result(job, None)
    print(job.id, flush=True)
    if not args.wait:
        return 0
    try:
        if sys.stderr.isatty():  # progress for a person; nothing extra for a script
            from gpuctl.jobs.progress import wait_with_progress

            wait_with_progress(job, sys.stderr)
        return _print_result(job, None)
    except KeyboardInterrupt as e:
        return _stopped_waiting(job, e)


def _follow_command(job: Job) -> int:
    """Print a command job's output as it comes until it ends; exit with the command's status
    (128 + N for signal N, 127 when it could not start); another failure of the job prints its
    report and exits 1 (3: its node stopped answering)."""
    rc = follow_logs(job, True, True)
    if rc:
        return rc  # Ctrl-C: following stopped, the job goes on
    report = _on_node(job, job.report)
    if report is None:
        return 0
    if report.kind == "command_failed" and report.exit_status is not None:
        print(f"gpuctl: job {job.id[:12]}: {report.evidence[0]}", file=sys.stderr)
        code = report.exit_status
        return 128 - code if code < 0 else code
    print(report.text(), file=sys.stderr)
    if report.kind == "command_not_found":
        return 127
    return 3 if report.kind == "node_unreachable" else 1


def _stopped_waiting(job: Job, interrupt: KeyboardInterrupt) -> int:
    """Ctrl-C while waiting stops the waiting, not the job: say so and how to go on (the job's
    own wait said it already: ``gpuctl.jobs.interrupt.said``)."""
    from gpuctl.jobs.interrupt import said

    if not said(interrupt):
        short = job.id[:12]
        print(
            f"gpuctl: job {short} keeps running on {job.target}: `gpuctl cancel {short}` stops "
            f"it (`gpuctl result {short}` waits for it again)",
            file=sys.stderr,
        )
    return 130


REPR_CHARS = 4000  # `gpuctl result` prints at most this much of a result's repr


def short_repr(value: Any, limit: int = REPR_CHARS) -> str:
    """``repr(value)``, cut at ``limit`` characters with a line saying how long it was and how to
    get all of it (a 126 MB string must not become 126 MB on a terminal)."""
    try:
        text = repr(value)
    except Exception as e:  # a broken __repr__ of the user's class
        return f"<{type(value).__qualname__}: repr failed: {type(e).__name__}: {e}>"
    if len(text) <= limit:
        return text
    return (
        f"{text[:limit]}...\n(repr shortened to {limit:,} of {len(text):,} characters: "
        "gpuctl result ID -o FILE writes the whole result as a pickle)"
    )


def _print_result(job: Job, timeout: float | None, output: str | None = None) -> int:
    """Print the result (a bounded repr) or write its pickle to ``output``; else the failure."""
    from gpuctl.jobs import JobFailed, RemoteTraceback

    try:
        if output is None:
            value = job.result(timeout)
        elif not job.wait(timeout) or job.report() is not None:
            job.result(0)  # raises: the failure, the timeout, the node that went away
    except TimeoutError:
        print(f"gpuctl: job {job.id} is {job.state}", file=sys.stderr)
        return 3
    except JobFailed as e:
        print(str(e), file=sys.stderr)
        # the node did not answer: not a verdict, the job may still run (exit as "not finished")
        return 3 if e.kind == "node_unreachable" else 1
    except Exception as e:
        report = job.report()
        if report is not None:
            print(report.text(), file=sys.stderr)
        else:
            cause = e.__cause__
            tb = cause.tb.rstrip() + "\n" if isinstance(cause, RemoteTraceback) else ""
            print(f"{tb}{type(e).__name__}: {e}", file=sys.stderr)
        return ExitCode.FAILED
    if output is None:
        print(short_repr(value))
        return 0
    try:
        job.copy_result(output)
    except OSError as e:  # a folder that is not there, a file not ours
        from gpuctl.cli.base import os_error

        raise UserError(f"cannot write the result to {output}: {os_error(e)}") from None
    if output != "-":
        print(f"gpuctl: job {job.id[:12]}'s result written to {output}", file=sys.stderr)
    return 0


def _job(args: argparse.Namespace, job_id: str | None = None) -> Job:
    """The job ``job_id`` (default ``args.id``) names, as its row says."""
    from gpuctl.cli.common import job_store
    from gpuctl.jobs import HostError, attach
    from gpuctl.jobs.store import JobNotFound

    store = job_store(args)
    try:
        rec = store.find(args.id if job_id is None else job_id)
    except JobNotFound as e:
        raise UserError(str(e)) from None
    config = _config(args) if rec.backend.get("kind") == "ssh" else None
    try:
        return attach(rec, store, config=config, watch=False)
    except (HostError, ValueError) as e:  # ValueError: a record naming what Slurm cannot take
        raise UserError(str(e)) from None


def parse_age(text: str) -> float:
    """Seconds from "30m", "12h", "7d", "2w" or a plain number of seconds; UserError otherwise."""
    from gpuctl.node.protocol import parse_seconds

    seconds = parse_seconds(text)
    if seconds is None:
        raise UserError(f"--older-than {text!r}: expected an age such as 30m, 12h, 7d or 3600")
    return seconds


def run_purge(args: argparse.Namespace) -> int:
    """Delete ended jobs older than ``--older-than``: their folders (here or on their node) and
    their rows. Unfinished rows are brought up to date first (a job lost, or never started,
    ends so). A folder is removed only when its last path part is the job's own id; a node
    that does not answer keeps its jobs for a later purge."""
    from gpuctl import service
    from gpuctl.cli.common import job_store
    from gpuctl.jobs import HostError, targets
    from gpuctl.jobs.store import FINAL_STATES

    if not args.older_than:
        raise UserError("jobs purge needs --older-than AGE, e.g. --older-than 7d")
    cutoff = time.time() - parse_age(args.older_than)
    if not args.dry_run:
        service.check("purging jobs", read_only=_decided(args))
    store = job_store(args)
    # a job that looks unfinished may have ended unseen (its supervisor died, the gpuctl that
    # was to start it is gone): looked at first, so that what ended is purged like any end
    _refresh(store, [r for r in store.list(1_000_000) if r.created_at < cutoff], args)
    every = store.list(1_000_000)
    old = [r for r in every if r.state in FINAL_STATES and (r.ended_at or r.created_at) < cutoff]
    config = None
    purged, kept = 0, []
    for rec in old:
        folder = rec.jobdir.split(":", 1)[-1] if rec.backend.get("kind") == "ssh" else rec.jobdir
        if args.dry_run:
            print(f"would purge {rec.id[:12]} {rec.state} {rec.target} {folder}")
            continue
        if os.path.basename(folder.rstrip("/")) != rec.id:
            kept.append(f"{rec.id[:12]} (its folder {folder} is not named by its id)")
            continue
        try:
            if rec.backend.get("kind") == "ssh":
                if config is None:
                    config = _config(args)
                targets.backend_of(rec.backend, rec.id, config).host.remove_tree(folder)
            elif os.path.isdir(folder):
                shutil.rmtree(folder)
        except (HostError, OSError, ValueError) as e:
            kept.append(f"{rec.id[:12]} ({e})")
            continue
        store.delete(rec.id)
        purged += 1
    caches = _purge_caches(every, cutoff, args)
    if args.dry_run:
        print(f"{len(old)} job(s) ended before {time.ctime(cutoff)} would be purged")
        for path in caches:
            print(f"would remove {path}")
        return 0
    print(f"purged {purged} job(s) that ended before {time.ctime(cutoff)}")
    if caches:
        print(
            f"removed {len(caches)} cached item(s) (your code, runners, maps' shared parts)"
            f" no job used since {time.ctime(cutoff)}"
        )
    for line in kept:
        print(f"gpuctl: kept {line}", file=sys.stderr)
    return ExitCode.FAILED if kept else ExitCode.OK


# A job root's content-addressed caches, shared by its jobs: the user's code (``code-<hash>``,
# ``usercode.ship``), the runners Slurm maps share (``runner-<hash>``) and maps' shared parts
# (``shared/<hash>.pkl`` and its ``.sources.json``). Each reuse refreshes the item's time
# (``Host.touch``), so an item older than the purge's age was used by no job since.
_CACHES = (
    'find "$1" -mindepth 1 -maxdepth 1 -type d \\( -name "code-*" -o -name "runner-*" \\) '
    '-mmin "+$2" -print; '
    '[ ! -d "$1/shared" ] || find "$1/shared" -mindepth 1 -maxdepth 1 -type f -mmin "+$2" -print'
)


def _purge_caches(records: list[JobRecord], cutoff: float, args: argparse.Namespace) -> list[str]:
    """Remove (or, with ``--dry-run``, list) the caches of the job roots ``records`` used that
    no job used since ``cutoff``. A root where the store still holds a job that has not ended
    keeps all of its caches (the job may load them yet); a node that does not answer keeps
    them for a later purge (named on stderr)."""
    from gpuctl.jobs import HostError, targets
    from gpuctl.jobs.store import FINAL_STATES

    roots: dict[tuple[str, str], JobRecord] = {}
    busy: set[tuple[str, str]] = set()
    for rec in records:
        kind = rec.backend.get("kind")
        where = str(rec.backend.get("node") or "") if kind == "ssh" else ""
        folder = rec.jobdir.split(":", 1)[-1] if kind == "ssh" else rec.jobdir
        key = (where, os.path.dirname(folder.rstrip("/")))
        roots.setdefault(key, rec)
        if rec.state not in FINAL_STATES:  # never purged: it is in the store still
            busy.add(key)
    minutes = max(1, int((time.time() - cutoff) // 60))
    found: list[str] = []
    config = None
    for key, rec in sorted(roots.items()):
        if key in busy or not key[1]:
            continue
        try:
            if rec.backend.get("kind") == "ssh" and config is None:
                config = _config(args)
            host = targets.backend_of(rec.backend, rec.id, config).host
            rc, out, err = host.run(["sh", "-c", _CACHES, "sh", key[1], str(minutes)], timeout=120)
            paths = [p for p in out.decode("utf-8", "replace").splitlines() if p]
            if not args.dry_run and paths:
                rc, _, err = host.run(["rm", "-rf", "--", *paths], timeout=300)
                if rc != 0:
                    raise OSError(err.decode("utf-8", "replace").strip() or f"rm exited {rc}")
        except (HostError, OSError, ValueError) as e:
            print(
                f"gpuctl: kept the caches of {key[0] or 'this machine'}:{key[1]} ({e})",
                file=sys.stderr,
            )
            continue
        found += [f"{key[0]}:{p}" if key[0] else p for p in paths]
    return found


def run_jobs(args: argparse.Namespace) -> int:
    from gpuctl.cli.common import job_store
    from gpuctl.core.text import printable
    from gpuctl.jobs.store import PARTIAL, shown_state

    if args.action == "purge":
        return run_purge(args)
    if args.older_than or args.dry_run:
        raise UserError("--older-than and --dry-run go with: gpuctl jobs purge")
    store = job_store(args)
    records = store.list(args.limit)
    if _refresh(store, records, args):
        records = store.list(args.limit)
    if args.json:
        jobs = [
            {
                "id": r.id,
                "name": r.name,
                "target": r.target,
                "state": r.state,
                "kind": r.kind,
                "why": r.summary,
                "created_at": r.created_at,
                "duration_s": r.duration,
                "jobdir": r.jobdir,
                "slurm_id": _slurm_id(r),
                "split": (r.backend.get("handle") or {}).get("split"),
                "tasks": r.tasks,
                "threads": r.threads,
                "summary": r.summary,
            }
            for r in records
        ]
        emit_json({"jobs": jobs})
        return 0
    header = ("ID", "STATE", "TARGET", "FUNCTION", "AGE", "DURATION", "WHY")
    rows: list[tuple[str, ...]] = [header]
    now = time.time()
    for r in records:
        dur = r.duration
        split = str((r.backend.get("handle") or {}).get("split") or "").split(":")[0]
        where = [_slurm_id(r) or "", split, f"{r.tasks} tasks" if r.tasks > 1 else ""]
        # a map's chunk that ran to its end with failed items is not plain done: WHY names them
        shown = shown_state(r.state, r.kind)
        partial = shown == PARTIAL
        cells = (
            r.id[:12],
            shown,
            f"{r.target} ({', '.join(w for w in where if w)})" if any(where) else r.target,
            r.name[-40:],
            fmt_age(now - r.created_at),
            "-" if dur is None else f"{dur:.1f}s",
            f"{r.kind}: {r.summary}" if partial else r.kind or (r.summary or "")[:100],
        )
        # one line per job: a command's or a message's line breaks are not the table's
        rows.append(tuple(printable(c) for c in cells))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _slurm_id(rec: JobRecord) -> str | None:
    """The Slurm job id (``123`` or ``123_4`` for an array task) of a job sent through Slurm."""
    handle = rec.backend.get("handle") or {}
    value = handle.get("slurm_id")
    return str(value) if value else None


REFRESH_PARALLEL = 8
REFRESH_TIMEOUT = 15.0  # seconds for all unfinished SSH jobs together; the rest stay as stored


def _refresh(store: JobStore, records: list[JobRecord], args: argparse.Namespace) -> bool:
    """Bring unfinished jobs up to date from their folders: local and Slurm ones (files and one
    squeue), and SSH ones, a few nodes at a time within ``REFRESH_TIMEOUT``; a node that does
    not answer leaves its jobs as stored (``gpuctl result ID`` says more)."""
    import queue
    import threading

    from gpuctl.jobs import HostError, attach
    from gpuctl.jobs.store import FINAL_STATES, StoreError

    config: Config | None = None

    def state(rec: JobRecord) -> bool:
        try:
            return attach(rec, store, config=config, watch=False).state != rec.state
        except (HostError, OSError, ValueError, StoreError):
            return False

    todo = [r for r in records if r.state not in FINAL_STATES]
    local = [r for r in todo if r.backend.get("kind") in ("local", "slurm")]
    remote = [r for r in todo if r not in local]
    changed = any([state(r) for r in local])
    if not remote:
        return changed
    try:
        config = _config(args)  # SSH jobs reach their node as the config says
    except UserError:
        return changed  # a broken config: list what the store holds (`config check` says why)
    # Daemon threads: a node that hangs past the deadline must not hold gpuctl's exit.
    work: queue.Queue[JobRecord] = queue.Queue()
    for r in remote:
        work.put(r)
    results: list[bool] = []

    def worker() -> None:
        while True:
            try:
                rec = work.get_nowait()
            except queue.Empty:
                return
            results.append(state(rec))

    threads = [
        threading.Thread(target=worker, name="gpuctl-refresh", daemon=True)
        for _ in range(min(REFRESH_PARALLEL, len(remote)))
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + REFRESH_TIMEOUT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return changed or any(results)


def _decided(args: argparse.Namespace) -> bool | None:
    """The read-only decision ``gpuctl.cli.main`` made before the command ran (None: none)."""
    value = getattr(args, "read_only", None)
    return value if isinstance(value, bool) else None


def _on_node(job: Job, fn: Callable[[], T]) -> T:
    """``fn()``; a node that does not answer is one line (the job may still run there)."""
    from gpuctl.jobs import HostError

    try:
        return fn()
    except HostError as e:
        raise UserError(
            f"{e}; job {job.id} may still be running there: try again once the node is back"
        ) from None


FOLLOW_EVERY = 0.5  # seconds between two reads of a followed job's files


def follow_logs(
    job: Job, stdout: bool, stderr: bool, tail: int | None = None, *, raw: bool = False
) -> int:
    """Print the job's output as it grows (stdout to stdout, stderr to stderr) until it ends,
    from the start, or from its last ``tail`` lines; Ctrl-C stops following, not the job.
    ``raw``: the bytes as the job wrote them, else text without escapes (``CleanText``)."""
    from gpuctl.node import jobfiles

    files = [(jobfiles.STDOUT, sys.stdout)] if stdout else []
    files += [(jobfiles.STDERR, sys.stderr)] if stderr else []
    offsets = dict.fromkeys((name for name, _ in files), 0)
    # a character split between two reads is decoded once whole, not as two replacement marks
    decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name, _ in files}

    def show(name: str, stream: TextIO, data: bytes) -> None:
        if raw:
            stream.flush()
            stream.buffer.write(data)
            stream.buffer.flush()
        else:
            stream.write(decoders[name].decode(data))
            stream.flush()

    try:
        for name, stream in files if tail is not None else ():
            read = functools.partial(job.read_lines, name, tail=tail, sized=True)
            data, size = _on_node(job, read)
            offsets[name] = size or 0
            show(name, stream, data)
        while True:
            over = _on_node(job, job.done)  # before reading: what it wrote last is then read
            for name, stream in files:
                data = _on_node(job, functools.partial(job.read_from, name, offsets[name]))
                if data:
                    offsets[name] += len(data)
                    show(name, stream, data)
            if over:
                return 0
            time.sleep(FOLLOW_EVERY)
    except KeyboardInterrupt:
        short = job.id[:12]
        print(f"gpuctl: stopped following; job {short} goes on", file=sys.stderr)
        return 130


def _rank(job: Job, rank: int) -> Job:
    """Rank ``rank`` of a job of several tasks; UserError naming the ranks there are."""
    if not job.ranks:
        if rank == 0:
            return job
        raise UserError(f"job {job.id} runs one task: there is no rank {rank}")
    if not 0 <= rank < len(job.ranks):
        raise UserError(f"job {job.id} has ranks 0..{len(job.ranks) - 1}, not {rank}")
    return job.ranks[rank]


def run_logs(args: argparse.Namespace) -> int:
    for opt in ("tail", "head"):
        value = getattr(args, opt)
        if value is not None and value < 0:
            raise UserError(f"--{opt} takes a number of lines, 0 or more, not {value}")
    if args.head is not None and args.follow:
        raise UserError("--head and -f do not go together: -f --tail N follows from the end")
    job = _job(args)
    if args.rank is not None:
        job = _rank(job, args.rank)
    both = not (args.stdout or args.stderr)
    if args.follow:
        return follow_logs(job, args.stdout or both, args.stderr or both, args.tail, raw=args.raw)
    from gpuctl.node import jobfiles

    for name, wanted in ((jobfiles.STDOUT, args.stdout), (jobfiles.STDERR, args.stderr)):
        if not (wanted or both):
            continue
        if both:
            print(f"=== {'stdout' if name == jobfiles.STDOUT else 'stderr'} ===")
        read = functools.partial(job.read_output, name, tail=args.tail, head=args.head)
        data = _on_node(job, read)
        end = b"" if data.endswith(b"\n") or not data else b"\n"
        if args.raw:  # the bytes as written, escapes and all: asked for by name
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.write(end)
            sys.stdout.buffer.flush()
        else:  # text through the CLI's stream, which removes what a terminal acts on
            text = data.decode("utf-8", "replace")
            del data  # a big log is held once as text, not also as bytes
            sys.stdout.write(text)
            sys.stdout.write(end.decode())
    return 0


def run_cancel(args: argparse.Namespace) -> int:
    """Cancel each job named (a map's, as its Ctrl-C line lists them); 1 when one had ended
    already, every other cancelled all the same."""
    jobs = [_job(args, i) for i in args.ids]
    rc = 0
    for job in jobs:
        if _on_node(job, functools.partial(job.cancel, read_only=_decided(args))):
            print(f"cancelling {job.id}")
            continue
        print(f"gpuctl: job {job.id} already ended ({job.state})", file=sys.stderr)
        rc = ExitCode.FAILED
    return rc


def run_result(args: argparse.Namespace) -> int:
    if not args.timeout >= 0:  # also NaN
        raise UserError(f"--timeout must be 0 (do not wait) or more seconds, not {args.timeout:g}")
    job = _job(args)
    try:
        return _print_result(job, args.timeout or 0.0, args.output)
    except KeyboardInterrupt as e:
        return _stopped_waiting(job, e)
