"""Commands launched the same way whatever the login shell: bash, bash printing a banner, tcsh
printing a banner; the banner kept aside by the start marker, never parsed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl.core.deadline import wait_for
from gpuctl.fleet.session import LineFeed
from gpuctl.reach import launch
from gpuctl.reach.errors import RemoteError
from gpuctl.reach.options import SshSettings, resolve
from gpuctl.reach.pool import Holder, pool
from gpuctl_tests.harness.sshd import SshCluster
from gpuctl_tests.helpers import require_binary

pytestmark = pytest.mark.sshd

# Looks like what the readers parse: a JSON hello, a deploy reply, a start marker without nonce.
BANNER = 'Welcome! {"type":"hello","protocol":99} gpuctl-deploy: missing /x gpuctl-start:0'
SHELLS = {
    "bash": {},
    "bash-banner": {"banner": BANNER},
    "tcsh-banner": {"login_shell": "tcsh", "banner": BANNER},
}
# newlines in quotes, both quotes, tcsh's history "!", $ and backquotes, unicode, a long line
NASTY = (
    "printf '%s\\n' 'one\nline with \"double\" and !bang and $HOME and `date`'\n"
    'echo "it\'s $((6 * 7)) ünïcødé"\n'
    "echo " + "x" * 20000 + " | wc -c\n"
    "echo to-stderr >&2\n"
    "exit 3\n"
)


@pytest.fixture(params=sorted(SHELLS))
async def node(request: Any, ssh_cluster: SshCluster) -> AsyncIterator[tuple[str, Any]]:
    kind = request.param
    if "login_shell" in SHELLS[kind]:
        require_binary(SHELLS[kind]["login_shell"])  # scripts/test.sh installs it
    await asyncio.to_thread(ssh_cluster.start_node, kind, **SHELLS[kind])
    target = resolve(kind, SshSettings(ssh_config=str(ssh_cluster.ssh_config_path)))
    owner = Holder()
    conn = await pool().connect(target, owner)
    yield kind, conn
    pool().release(target, owner)


async def test_run_is_the_same_whatever_the_login_shell(node: tuple[str, Any]) -> None:
    kind, conn = node
    r = await launch.run(conn, NASTY, node=kind)
    assert r.status == 3
    assert r.stdout.decode() == (
        'one\nline with "double" and !bang and $HOME and `date`\nit\'s 42 ünïcødé\n20001\n'
    )
    assert r.stderr == b"to-stderr\n"
    expected = (BANNER + "\n").encode() if "banner" in kind else b""
    assert (r.banner, r.stderr_banner) == (expected, expected)


async def test_stdin_and_a_long_running_process(node: tuple[str, Any]) -> None:
    kind, conn = node
    data = bytes(range(256)) * 1000
    r = await launch.run(conn, "cat", node=kind, stdin=data)
    assert (r.status, r.stdout) == (0, data)
    proc = await launch.start(conn, 'read line; echo "got $line"; echo err >&2; cat', node=kind)
    try:
        assert proc.banner == ((BANNER + "\n").encode() if "banner" in kind else b"")
        proc.stdin.write(b"hello\n")
        assert await wait_for(proc.stdout.readline(), 10) == b"got hello\n"
        assert await wait_for(proc.stderr.readline(), 10) == b"err\n"
        proc.stdin.write(b"tail")
        proc.stdin.write_eof()
        assert await wait_for(proc.stdout.read(), 10) == b"tail"
    finally:
        proc.close()


async def test_a_fed_process_hands_its_output_on_from_the_channel(
    node: tuple[str, Any],
) -> None:
    """``start_fed``: stdout and stderr after the marker go to their feeds from the channel's
    callback (lines pushed as they come: no reader task), stdin is written, and the end is
    named once the channel closed, with the exit status there."""
    kind, conn = node
    out, err = LineFeed(limit=1024), LineFeed(limit=1024)
    ends: list[tuple[int | None, Exception | None]] = []
    ended = asyncio.Event()

    def end(proc: launch.FedProcess, exc: Exception | None) -> None:
        ends.append((proc.exit_status, exc))
        err.feed_eof()
        out.feed_eof()
        ended.set()

    script = 'read line; echo "got $line"; echo err >&2; read more; echo "and $more"; exit 4'
    proc = await launch.start_fed(conn, script, node=kind, out=out, err=err, ended=end)
    try:
        expected = (BANNER + "\n").encode() if "banner" in kind else b""
        assert proc.banner == expected
        proc.write(b"hello\n")
        assert await wait_for(out.readline(), 10) == b"got hello\n"
        lines: list[bytes] = []
        out.push_to(lines.append, lambda _e: None)
        err_lines: list[bytes] = []
        err.push_to(err_lines.append, lambda _e: None)
        proc.write(b"there\n")
        await proc.drain()
        await wait_for(ended.wait(), 10)
        assert lines == [b"and there\n"] and err_lines == [b"err\n"]
        assert ends == [(4, None)] and proc.stderr_banner == expected
        with pytest.raises(ConnectionError):
            proc.write(b"late\n")
    finally:
        proc.close()


async def test_a_login_shell_that_runs_nothing_is_one_line(ssh_cluster: SshCluster) -> None:
    await asyncio.to_thread(ssh_cluster.start_node, "broken", login_shell="false", banner="hi")
    target = resolve("broken", SshSettings(ssh_config=str(ssh_cluster.ssh_config_path)))
    owner = Holder()
    conn = await pool().connect(target, owner)
    try:
        feeds = {"out": LineFeed(), "err": LineFeed()}
        for attempt in (
            launch.run(conn, "true", node="broken"),
            launch.start(conn, "true", node="broken"),
            launch.start_fed(conn, "true", node="broken", **feeds, ended=lambda _p, _e: None),
        ):
            with pytest.raises(RemoteError) as info:
                await attempt
            assert info.value.reason == "shell"
            assert info.value.message == (
                "broken: the login shell did not run gpuctl's /bin/sh launcher (exit status 1): "
                "hi; check that /bin/sh and base64 exist there and that the shell's startup files "
                "do not exit"
            )
    finally:
        pool().release(target, owner)


def test_the_command_sshd_gets_is_one_safe_line() -> None:
    wrapped = launch.launch("echo 'a'\n! $x `y` \"z\"\n" * 500)
    cmd = wrapped.command
    assert "\n" not in cmd and "!" not in cmd
    head, _, args = cmd.partition(" gpuctl ")
    assert head == f"exec /bin/sh -c '{launch.DECODER}'"
    chunks = args.split(" ")
    assert all(len(c) % 4 == 0 and not c.startswith("=") for c in chunks[:-1])
    assert all(
        set(c) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
        for c in chunks
    )
    assert wrapped.marker.startswith(b"gpuctl-start:") and wrapped.marker.endswith(b"\n")
    assert launch.launch("true").marker != wrapped.marker  # a nonce per launch
    with pytest.raises(RemoteError) as info:
        launch.launch("x" * (launch.MAX_SCRIPT + 1))
    assert info.value.reason == "config"


def test_banner_without_a_final_newline_is_split_off() -> None:
    marker = b"gpuctl-start:abc\n"
    assert launch.split_banner(b"motd" + marker + b"out\n", marker) == (b"motd", b"out\n")
    assert launch.split_banner(b"no marker\n", marker) is None


async def test_the_harness_login_wrapper_is_what_it_says(
    tmp_path: Path, ssh_cluster: SshCluster
) -> None:
    """The tcsh node really runs commands under tcsh (a csh-only construct works there)."""
    require_binary("tcsh")
    await asyncio.to_thread(ssh_cluster.start_node, "csh", login_shell="tcsh")
    r = await asyncio.to_thread(ssh_cluster.ssh, "csh", "set x = 5; echo $x $shell")
    assert r.stdout.split() == ["5", "/usr/bin/tcsh"]
