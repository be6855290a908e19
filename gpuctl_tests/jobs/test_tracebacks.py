"""Tracebacks a user can read: a job's traceback names the user's file and shows its lines,
also where the node has no such file (the payload ships the source text of the code it carries
by value); an uncaught job exception ends with the job id and the command for its logs; a
script's function is called ``train.py:main``."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
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


def _import(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_traceback_names_the_users_file_and_lines_where_the_node_has_no_such_file(
    make_executor: Any, tmp_path: Path
) -> None:
    src = tmp_path / "proj" / "inventory_job.py"
    src.parent.mkdir()
    src.write_text(SOURCE)
    module = _import(src, f"inventory_job_{tmp_path.name}")
    go = tmp_path / "go"
    try:
        job = make_executor().submit(module.main, str(go), "widgets")
    finally:
        del sys.modules[module.__name__]
    src.unlink()  # as on a node that never had the file: only the shipped text can show it
    go.write_text("")
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
    src = tmp_path / "proj" / "mapped_job.py"
    src.parent.mkdir()
    src.write_text(MAP_SOURCE)
    module = _import(src, f"mapped_job_{tmp_path.name}")
    go = tmp_path / "go"
    ex = make_executor()
    try:
        results = ex.map(module.make(str(go)), [0, 1], chunksize=2)
    finally:
        del sys.modules[module.__name__]
    assert list(Path(ex.backend.host.expand(ex.backend.job_root), "shared").glob("*.pkl"))
    src.unlink()
    go.write_text("")
    with pytest.raises(ValueError, match="item 1 of 2097152") as info:
        list(results)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert (
        f'File "{src}", line 13, in work\n    raise ValueError(f"item {{x}} of {{len(blob)}}")'
        in (cause.tb)
    )
