"""The job folder's contract (``gpuctl.node.jobfiles``): its names live there and nowhere else,
its helpers behave, and the runner it lists works as copied scripts under Python 3.6."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

from gpuctl.node import jobfiles
from gpuctl_tests.helpers import REPO, old_python

# Files of other engineers' areas that still spell a name; each entry must keep matching (a
# stale one fails), and goes when its file imports jobfiles.
PENDING: dict[str, tuple[str, ...]] = {}  # files allowed to spell names (none left)


def job_file_names() -> list[str]:
    names = {
        v
        for k, v in vars(jobfiles).items()
        if k.isupper() and isinstance(v, str) and ("." in v or "-" in v or "_" in v)
    }
    names.add(jobfiles.RUNNER_PACKAGE)
    return sorted(names)


def name_pattern() -> re.Pattern[str]:
    """A job file's name, whole (``my-outcome.json`` is another name)."""
    names = job_file_names()
    return re.compile("|".join(r"(?<![\w.-])" + re.escape(n) + r"(?![\w.-])" for n in names))


def literals(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants of a module that are not docstrings (f-string parts included)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_job_file_names_are_spelled_in_the_contract_only() -> None:
    names = job_file_names()
    assert {"outcome.json", "cancel-requested", "status.jsonl", "result.pkl"} <= set(names)
    pattern = re.compile("|".join(r"(?<![\w.-])" + re.escape(n) + r"(?![\w.-])" for n in names))
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / "gpuctl").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "gpuctl/node/jobfiles.py":
            continue
        for line, text in literals(ast.parse(path.read_text(), rel)):
            for m in pattern.finditer(text):
                found.setdefault(rel, set()).add(m.group(0))
                if rel not in PENDING:
                    print(f"{rel}:{line}: {text!r}")
    offenders = {k: v for k, v in found.items() if k not in PENDING}
    assert offenders == {}, "use gpuctl.node.jobfiles"
    for rel, spelled in PENDING.items():
        assert set(spelled) <= found.get(rel, set()), f"{rel} is clean now: drop it from PENDING"


def test_the_check_sees_a_name_in_code_and_not_in_a_docstring() -> None:
    tree = ast.parse('"""About outcome.json."""\nx = f"{d}/outcome.json"\ny = "my-outcome.json"\n')
    texts = sorted(t for _, t in literals(tree))
    assert texts == ["/outcome.json", "my-outcome.json"]
    assert [bool(name_pattern().search(t)) for t in texts] == [True, False]


def test_helpers(tmp_path: Path) -> None:
    p = str(tmp_path / jobfiles.OUTCOME)
    assert jobfiles.read_json(p, "missing") == "missing"
    jobfiles.write_json(p, {"a": 1})
    assert jobfiles.read_json(p) == {"a": 1}
    assert [f.name for f in tmp_path.iterdir()] == [jobfiles.OUTCOME]  # no temporary left
    e = str(tmp_path / jobfiles.ERROR)
    assert jobfiles.write_json_once(e, {"first": True})
    assert not jobfiles.write_json_once(e, {"first": False})
    assert jobfiles.read_json(e) == {"first": True}
    s = str(tmp_path / jobfiles.STATUS)
    jobfiles.append_line(s, {"phase": "start"})
    jobfiles.append_line(s, {"phase": "running"})
    with open(s, "a") as f:
        f.write('{"phase": "sav')  # torn by a crash
    assert jobfiles.parse_lines(Path(s).read_text()) == [{"phase": "start"}, {"phase": "running"}]
    assert jobfiles.tail(s, 4) == '"sav'
    assert jobfiles.loads(b'{"x": 1}') == {"x": 1} and jobfiles.loads(b"{") is None
    paths = jobfiles.JobPaths("/node/jobs/abc/")
    assert paths.outcome == "/node/jobs/abc/outcome.json" and paths(jobfiles.META).endswith(
        "/abc/meta.json"
    )


def test_the_copied_runner_runs_as_scripts_under_python36(tmp_path: Path) -> None:
    """The job folder as the login side writes it: the scripts import the contract from the
    ``gpuctl_runner`` copy beside them, not from an installed gpuctl."""
    folder = tmp_path / "job"
    for name, src in jobfiles.RUNNER.items():
        dest = folder / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / src, dest)
    (folder / jobfiles.META).write_text("not json")
    env = {"PATH": "/usr/bin:/bin"}  # no PYTHONPATH: gpuctl itself is not importable
    run = subprocess.run(
        [old_python("3.6.15"), str(folder / jobfiles.SUPERVISOR_SCRIPT), str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    outcome = json.loads((folder / jobfiles.OUTCOME).read_text())
    assert run.returncode == 1, run.stderr
    assert outcome["supervisor_error"].startswith("meta.json missing or unreadable")
    assert outcome["subreaper"] is True
    pid = json.loads((folder / jobfiles.PIDFILE).read_text())["pid"]
    assert pid == outcome["supervisor_pid"]


def test_every_copied_runner_module_imports_from_the_copy(tmp_path: Path) -> None:
    """Each module of ``RUNNER_MODULES`` imports from the copy alone under Python 3.6: a node
    module a copied one needs (the metric registry that ``protocol`` reads) is copied too.
    The supervisor imports the readers late, so a missing one showed only as a lost job."""
    folder = tmp_path / "job"
    for name, src in jobfiles.RUNNER.items():
        dest = folder / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / src, dest)
    names = [
        f"{jobfiles.RUNNER_PACKAGE}.{m.replace('/', '.')}".removesuffix(".__init__")
        for m in jobfiles.RUNNER_MODULES
    ]
    run = subprocess.run(
        [old_python("3.6.15"), "-c", "import " + ", ".join(names)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=folder,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
