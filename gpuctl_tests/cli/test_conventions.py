"""The CLI's conventions, held over every command of the real parser: a command added later is
walked as well, since the walk reads argparse's own tree.

- ``--help`` answers (exit 0) for every command and subcommand;
- a usage mistake is one line, exit 2 (``gpuctl.cli.main.ExitCode.USAGE``), said by the command
  the user chose (``gpuctl: status: ...; see: gpuctl status --help``), not the top level;
- a mistyped option or command comes with the one meant (``did you mean``);
- ``--demo`` is the same option (text and meaning) on every command that has it;
- the exit codes are the documented ones (``docs/exit-codes.md``).

The walk runs in this process (argparse alone: fast); a sample runs as ``python -m gpuctl``
subprocesses, as a user types it.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpuctl.cli.main import build_parser
from gpuctl_tests.helpers import REPO, Tmux, node_env, shell_then_report, wait_until

Path_ = tuple[str, ...]


def walk(
    parser: argparse.ArgumentParser, path: Path_ = ()
) -> Iterator[tuple[Path_, argparse.ArgumentParser]]:
    """Every command of ``parser`` (itself first), each once (an alias is not another one)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from walk(sub, (*path, name))


PARSER = build_parser()
COMMANDS = dict(walk(PARSER))
IDS = [" ".join(p) or "gpuctl" for p in COMMANDS]


def typo(word: str, start: int = 0) -> str:
    """``word`` with its last two different adjacent letters swapped (``--hostfile`` ->
    ``--hostfiel``): a slip of the fingers, never an abbreviation argparse would accept."""
    for i in range(len(word) - 2, start - 1, -1):
        a, b = word[i], word[i + 1]
        if a != b and a.isalpha() and b.isalpha():
            return f"{word[:i]}{b}{a}{word[i + 2 :]}"
    raise AssertionError(f"no two different letters to swap in {word!r}")


def parse(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """What ``gpuctl ARGV``'s parsing does: its exit code (0 when it parses), stdout, stderr."""
    try:
        PARSER.parse_args(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def positionals(parser: argparse.ArgumentParser) -> list[str]:
    """Values for the positionals a command requires, so that the parse reaches its options."""
    out = []
    for a in parser._actions:
        if a.option_strings or isinstance(a, argparse._SubParsersAction):
            continue
        if a.nargs in (None, 1, "+"):
            out.append(str(next(iter(a.choices))) if a.choices else "x")
    return out


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpuctl: "), err
    return lines[0]


@pytest.mark.parametrize("path", list(COMMANDS), ids=IDS)
def test_help_and_an_unknown_option_name_the_command(
    path: Path_, capsys: pytest.CaptureFixture[str]
) -> None:
    command = " ".join(("gpuctl", *path))
    code, out, _ = parse([*path, "--help"], capsys)
    assert code == 0 and out.startswith(f"usage: {command}"), (code, out[:200])
    parser = COMMANDS[path]
    code, _, err = parse([*path, *positionals(parser), "--no-such-option"], capsys)
    line = one_line(err)
    assert code == 2, line
    said_by = f"{' '.join(path)}: " if path else ""
    assert line.startswith(f"gpuctl: {said_by}unrecognized arguments: --no-such-option"), line
    assert line.endswith(f"; see: {command} --help"), line


OPTIONS = [
    (path, option)
    for path, parser in COMMANDS.items()
    for a in parser._actions
    if a.help is not argparse.SUPPRESS
    for option in a.option_strings
    if option.startswith("--") and option not in ("--help", "--version")
]


def test_every_option_says_what_it_does_in_help() -> None:
    """``--help`` lists no bare option: each has its line (accept --device, stress start
    --dtype/--engine, jobs --limit had none)."""
    bare = [
        f"{' '.join(('gpuctl', *path))} {a.option_strings[-1]}"
        for path, parser in COMMANDS.items()
        for a in parser._actions
        if a.option_strings and not a.help
    ]
    assert not bare, bare


@pytest.mark.parametrize(("path", "option"), OPTIONS, ids=[" ".join((*p, o)) for p, o in OPTIONS])
def test_a_mistyped_option_is_named(
    path: Path_, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    mistyped = typo(option, 2)
    code, _, err = parse([*path, *positionals(COMMANDS[path]), mistyped], capsys)
    line = one_line(err)
    assert code == 2, line
    assert f"unrecognized arguments: {mistyped} (did you mean {option}?)" in line, line


GROUPS = {
    p: a
    for p, parser in COMMANDS.items()
    for a in parser._actions
    if isinstance(a, argparse._SubParsersAction)
}


@pytest.mark.parametrize("path", list(GROUPS), ids=[" ".join(p) or "gpuctl" for p in GROUPS])
def test_a_mistyped_subcommand_is_named(path: Path_, capsys: pytest.CaptureFixture[str]) -> None:
    command = " ".join(("gpuctl", *path))
    wrong = []
    for name in GROUPS[path].choices:
        mistyped = typo(name)
        code, _, err = parse([*path, mistyped], capsys)
        line = one_line(err)
        meant = f"invalid choice: {mistyped!r} (did you mean '{command} {name}'?)"
        if code != 2 or meant not in line or not line.endswith(f"; see: {command} --help"):
            wrong.append((name, code, line))
    assert not wrong, wrong


def test_demo_is_the_same_option_wherever_it_is() -> None:
    from gpuctl.cli.common import DEMO_HELP

    found = {}
    for path, parser in COMMANDS.items():
        for a in parser._actions:
            if "--demo" in a.option_strings:
                found[" ".join(path)] = (a.help, a.nargs, a.const, a.default, a.dest)
    assert found, "no command has --demo"
    assert set(found.values()) == {(DEMO_HELP, 0, True, False, "demo")}, found
    # the list docs/commands.md gives (its "Conventions")
    page = (REPO / "docs" / "commands.md").read_text()
    listed = re.search(r"<!-- demo -->(.*?)<!-- /demo -->", page, re.S)
    assert listed is not None
    assert sorted(re.findall(r"`gpuctl ([a-z -]+) --demo`", listed.group(1))) == sorted(found)


def test_demo_takes_the_nodes_named_as_the_configured_cluster_does(tmp_path: Path) -> None:
    """``status --demo sim-02`` shows sim-02 as ``stress start --demo sim-02`` burns it (it
    showed every node); a name the simulated cluster lacks, or a missing --hostfile, is a
    mistake (both were ignored)."""
    from gpuctl.cli.common import build_fleet
    from gpuctl.cli.main import UserError

    def nodes(*argv: str) -> list[str]:
        return list(build_fleet(PARSER.parse_args(["status", "--demo", *argv])).names)

    assert nodes("sim-0[2-3]") == ["sim-02", "sim-03"]
    (tmp_path / "hosts").write_text("sim-04  # one\nsim-01\n")
    assert nodes("--hostfile", str(tmp_path / "hosts")) == ["sim-04", "sim-01"]
    assert len(nodes()) == 6
    with pytest.raises(UserError, match=r"^nosuch is not a node of the simulated cluster"):
        nodes("nosuch")
    with pytest.raises(UserError, match=r"--hostfile \S+/missing: no such file"):
        nodes("--hostfile", str(tmp_path / "missing"))


def test_exit_codes_are_the_documented_ones() -> None:
    from gpuctl.cli.main import ExitCode

    doc = (REPO / "docs" / "exit-codes.md").read_text()
    rows = dict(re.findall(r"^\| *(\d+) *\| *`(\w+)` *\|", doc, re.M))
    assert rows == {str(int(c)): c.name for c in ExitCode}, rows
    from gpuctl.accept.results import EXIT_CODES  # gpuctl accept's verdicts, its own statuses

    for verdict, code in EXIT_CODES.items():
        assert re.search(rf"^\| *{code} *\| *{verdict}:", doc, re.M), verdict


# -- as a user runs them ---------------------------------------------------------------------
SAMPLE = [
    (
        ["status", "--hostfle", "x"],
        r"^gpuctl: status: unrecognized arguments: --hostfle \(did you mean --hostfile\?\); "
        r"see: gpuctl status --help$",
    ),
    (
        ["stauts"],
        r"invalid choice: 'stauts' \(did you mean 'gpuctl status'\?\); see: gpuctl --help$",
    ),
    (["jobs", "lgs"], r"^gpuctl: jobs: .*'lgs' \(did you mean 'gpuctl logs'\?\); see: gpuctl jobs"),
    (["stress", "--demo", "start"], r"stress start: .*--demo goes after gpuctl stress start"),
    (
        ["stress"],
        r"^gpuctl: stress: say what to do: start, stop, status or run; see: gpuctl stress",
    ),
    # a file the user named that cannot be read or written: 2, as every other one
    (["replay", "missing.rec"], r"^gpuctl: cannot read the recording missing\.rec: No such file"),
    (["replay", "."], r"^gpuctl: cannot read the recording \.: Is a directory"),
    (["--config", "/proc/gpuctl-no/c.toml", "config", "init"], r"cannot write the config: /proc"),
    (["accept", "--local", "--report-dir", "/proc/gpuctl-no"], r"--report-dir /proc/gpuctl-no: "),
]


def gpuctl(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=node_env({"GPUCTL_STATE_DIR": str(tmp_path / "state")}),
    )


def test_a_sample_as_a_user_types_it(tmp_path: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: gpuctl(tmp_path, *c[0]), SAMPLE))
    wrong = []
    for (argv, message), r in zip(SAMPLE, results, strict=True):
        lines = r.stderr.strip().splitlines()
        if r.returncode != 2 or len(lines) != 1 or not re.search(message, lines[0]):
            wrong.append((argv, r.returncode, r.stderr))
    assert not wrong, wrong
    r = gpuctl(tmp_path, "stress", "start", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: gpuctl stress start"), r.stderr


def test_doctor_hints_give_the_command(tmp_path: Path) -> None:
    """A node whose host key is not known and whose login fails before the key is compared
    (nothing listens on its port): the host key line's fix is the command itself. A node
    reached without ssh: the jobs' Python is not checked, and the line says which command
    checks it (run here as it is given)."""
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        (tmp_path / "ssh_config").write_text(
            f"Host down1\n    HostName 127.0.0.1\n    Port {port}\n"
        )
        (tmp_path / "known_hosts").write_text("")
        (tmp_path / "c.toml").write_text(
            f'[clusters.c]\nnodes = "down1"\nvia = "ssh"\nssh_config = "{tmp_path}/ssh_config"\n'
            f'known_hosts = "{tmp_path}/known_hosts"\nhost_key_policy = "strict"\n'
            '[clusters.here]\nnodes = "here1"\nvia = "local"\nsimulate = "1"\n'
            f'workload_python = "{sys.executable}"\n'
        )
        r = gpuctl(tmp_path, "--config", "c.toml", "doctor", "--json")
    assert r.returncode == 1, r.stderr
    checks = {(c["node"], c["check"]): c for c in json.loads(r.stdout)["checks"]}
    key = checks["down1", "host key"]
    assert key["state"] == "fail", key
    assert key["fix"].endswith(f"run: ssh-keyscan -p {port} 127.0.0.1 >> {tmp_path}/known_hosts")
    venv2 = checks["here1", "jobs VENV2"]
    assert venv2["state"] == "skip", venv2
    hint = re.search(r"gpuctl (submit --target here1 .*)$", venv2["detail"])
    assert hint is not None, venv2
    r = gpuctl(tmp_path, "--config", "c.toml", *hint.group(1).split())
    assert r.returncode == 0 and r.stdout.startswith("Python 3."), (r.stdout, r.stderr)


def _colours(t: Tmux) -> set[tuple[str, ...]]:
    """The RGB colours (foreground and background) of the pane's cells, as tmux holds them."""
    shown = t.run("capture-pane", "-p", "-e", "-t", "t")
    return set(re.findall(r"[34]8;2;(\d+);(\d+);(\d+)", shown))


@pytest.mark.parametrize(("no_color", "colourful"), [("", True), ("1", False)])
def test_no_color_set_and_not_empty_turns_the_colours_off(
    tmp_path: Path, no_color: str, colourful: bool
) -> None:
    """NO_COLOR as no-color.org says: set and not empty, the screen is grey; empty, as unset
    (Textual itself takes an empty one for set). A real terminal: tmux, truecolor."""
    demo = [sys.executable, "-m", "gpuctl", "demo", "--nodes", "2", "--gpus", "2", "--no-story"]
    env = node_env({"NO_COLOR": no_color, "COLORTERM": "truecolor", "TERM": "xterm-256color"})
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["GPUCTL_STATE_DIR"] = str(tmp_path / "state")
    t = Tmux(tmp_path, shell_then_report(shlex.join(demo)), env)
    try:
        wait_until(lambda: "sim-02" in t.screen(), timeout=30, what="the demo's screen")
        colours = _colours(t)
        hued = {c for c in colours if len(set(c)) > 1}  # grey is r = g = b
        assert colours, "no RGB colour in the pane: was it drawn in truecolor?"
        assert bool(hued) is colourful, sorted(hued)[:5]
        t.keys("q")
        wait_until(lambda: "gpuctl-exited=0" in t.screen(), what="the demo to quit")
    finally:
        t.close()
