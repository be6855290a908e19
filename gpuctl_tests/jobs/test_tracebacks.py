"""Tracebacks a user can read: a job's traceback names the user's file and shows its lines,
also where the node has no such file (the payload ships the source text of the code it carries
by value); an uncaught job exception ends with the job id and the command for its logs; a
script's function is called ``train.py:main``."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl.cli.jobs import load_function
from gpuctl.jobs import RemoteTraceback

SOURCE = textwrap.dedent(
    """\
    import os
    import time


    def main(go, item):
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.02)
        deeper(item)


    def deeper(item):
        raise ValueError(f"{item}: only 2 left")
    """
)


@contextlib.contextmanager
def users_module(tmp_path: Path, name: str, text: str) -> Iterator[tuple[Path, Any]]:
    """``proj/NAME.py`` holding ``text``, imported from its file as a user's script imports
    it: (its path, the module); out of sys.modules again afterwards."""
    src = tmp_path / "proj" / f"{name}.py"
    src.parent.mkdir(exist_ok=True)
    src.write_text(text)
    spec = importlib.util.spec_from_file_location(f"{name}_{tmp_path.name}", src)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield src, module
    finally:
        del sys.modules[spec.name]


def as_on_another_node(src: Path, go: Path) -> None:
    """The job's source file gone (only the shipped text can show its lines), then the job,
    which waits for ``go``, goes on."""
    src.unlink()
    go.write_text("")


def test_the_traceback_names_the_users_file_and_lines_where_the_node_has_no_such_file(
    make_executor: Any, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    with users_module(tmp_path, "inventory_job", SOURCE) as (src, module):
        job = make_executor().submit(module.main, str(go), "widgets")
    as_on_another_node(src, go)
    with pytest.raises(ValueError, match="widgets: only 2 left") as info:
        job.result(60)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "<dynamic-code>" not in cause.tb
    assert f'File "{src}", line 9, in main\n    deeper(item)' in cause.tb
    assert f'File "{src}", line 13, in deeper\n    raise ValueError(f"{{item}}: only 2 left")' in (
        cause.tb
    )
    if sys.version_info >= (3, 11):  # the last lines a terminal shows of it, uncaught
        assert info.value.__notes__ == [
            f"(job {job.id} on local: `gpuctl logs {job.id}` shows its output)"
        ]


CELL = textwrap.dedent(
    """\
    def count_widgets(n):
        stock = {"widgets": 2}
        return stock["widgets"] - n // stock["gears"]
    """
)


@contextlib.contextmanager
def notebook_cell(source: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``source`` run as IPython runs a cell, without IPython: compiled under a file name like
    its ``/tmp/ipykernel_PID/HASH.py`` that is on no disk, its lines in ``linecache.cache``
    (no modification time: never checked against a file). Yields (that name, the namespace)."""
    import linecache
    import uuid

    name = f"/tmp/ipykernel_999/{uuid.uuid4().hex[:10]}.py"
    assert not Path(name).exists()
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    try:
        exec(compile(source, name, "exec"), namespace)
        yield name, namespace
    finally:
        linecache.cache.pop(name, None)


def test_a_notebook_cells_function_shows_the_cells_lines(make_executor: Any) -> None:
    with notebook_cell(CELL) as (name, namespace):
        job = make_executor().submit(namespace["count_widgets"], 4)
        with pytest.raises(KeyError) as info:
            job.result(60)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    line = 'return stock["widgets"] - n // stock["gears"]'
    assert f'File "{name}", line 3, in count_widgets\n    {line}' in cause.tb, cause.tb
    report = job.report()
    assert report is not None and line in report.text(), report and report.text()


def test_a_cell_that_ipython_ran_is_named_as_ipython_names_it(make_executor: Any) -> None:
    """Where IPython is installed (it is no test dependency): a real shell runs the cell."""
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        number = shell.execution_count
        assert shell.run_cell(CELL, store_history=True).success
        job = make_executor().submit(shell.user_ns["count_widgets"], 4)
        with pytest.raises(KeyError) as info:
            job.result(60)
    finally:
        InteractiveShell.clear_instance()
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    line = 'return stock["widgets"] - n // stock["gears"]'
    assert f"Cell In[{number}], line 3, in count_widgets\n    {line}" in cause.tb, cause.tb
    report = job.report()
    assert report is not None and f"Cell In[{number}], line 3" in report.text()


def test_a_scripts_function_is_named_by_its_file(make_executor: Any, tmp_path: Path) -> None:
    src = tmp_path / "train.py"
    src.write_text("def main():\n    return 'trained'\n")
    fn = load_function(f"{src}:main")
    job = make_executor().submit(fn)
    assert job.name == "train.py:main"
    assert job.result(60) == "trained"


MAP_SOURCE = textwrap.dedent(
    """\
    import os
    import time


    def make(go):
        blob = bytes(2 << 20)  # the function goes once per map, in the job root's shared/

        def work(x):
            deadline = time.monotonic() + 60
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.02)
            if x == 1:
                raise ValueError(f"item {x} of {len(blob)}")
            return x

        return work
    """
)


def test_a_maps_shared_function_shows_the_users_lines_too(
    make_executor: Any, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    ex = make_executor()
    with users_module(tmp_path, "mapped_job", MAP_SOURCE) as (src, module):
        results = ex.map(module.make(str(go)), [0, 1], chunksize=2)
    assert list(Path(ex.backend.host.expand(ex.backend.job_root), "shared").glob("*.pkl"))
    as_on_another_node(src, go)
    with pytest.raises(ValueError, match="item 1 of 2097152") as info:
        list(results)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert (
        f'File "{src}", line 13, in work\n    raise ValueError(f"item {{x}} of {{len(blob)}}")'
        in (cause.tb)
    )
