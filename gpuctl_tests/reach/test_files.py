"""Files on a node: the same results over SFTP and, when a banner breaks the SFTP subsystem,
through the shell; ``~`` is the node's $HOME as its shell sees it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl.reach.errors import RemoteError
from gpuctl.reach.files import RemoteFiles, files_for
from gpuctl.reach.options import SshSettings, resolve
from gpuctl.reach.pool import Holder, pool
from gpuctl_tests.harness.sshd import SshCluster
from gpuctl_tests.helpers import require_binary

pytestmark = pytest.mark.sshd

NODES = {
    "sftp": {},
    "hostile": {"banner": "Welcome to the cluster", "sftp_banner": True},
    "tcsh": {"login_shell": "tcsh", "banner": "tcsh says hi", "sftp_banner": True},
}


@pytest.fixture(params=sorted(NODES))
async def files(request: Any, ssh_cluster: SshCluster) -> AsyncIterator[RemoteFiles]:
    kind = request.param
    if "login_shell" in NODES[kind]:
        require_binary(NODES[kind]["login_shell"])  # scripts/test.sh installs it
    await asyncio.to_thread(ssh_cluster.start_node, kind, **NODES[kind])
    target = resolve(kind, SshSettings(ssh_config=str(ssh_cluster.ssh_config_path)))
    owner = Holder()
    conn = await pool().connect(target, owner)
    yield files_for(conn, kind)
    pool().release(target, owner)


async def test_sftp_or_shell_same_results(files: RemoteFiles, tmp_path: Path) -> None:
    sftp = await files.sftp()
    if files.node == "sftp":
        assert sftp is not None and files.sftp_problem is None
    else:  # the banner before sftp-server corrupts the protocol: the shell takes over
        assert sftp is None and "SFTPBadMessage" in (files.sftp_problem or "")
    root = tmp_path / "remote"
    await files.mkdir(str(root / "a" / "b"), 0o750)
    assert (root / "a" / "b").stat().st_mode & 0o777 == 0o750
    assert (root / "a").stat().st_mode & 0o777 == 0o700  # parents gpuctl creates are private
    data = bytes(range(256)) * 4096 + b"\x00end"
    target_path = root / "a" / "b" / "f.bin"
    target = str(target_path)
    await files.write(target, data, 0o640)
    assert target_path.read_bytes() == data
    assert target_path.stat().st_mode & 0o777 == 0o640
    assert await files.read(target) == data
    assert await files.read(target, 1000) == data[1000:]
    assert await files.read(str(root / "missing")) is None
    assert await files.exists(target) and not await files.exists(str(root / "missing"))
    local = tmp_path / "local.bin"
    local.write_bytes(data * 3)
    await files.put(str(local), str(root / "put.bin"), 0o600)
    assert (root / "put.bin").read_bytes() == data * 3
    back = tmp_path / "back.bin"
    await files.get(str(root / "put.bin"), str(back))
    assert back.read_bytes() == data * 3
    # a streamed, atomic write: nothing under the final name until commit
    w = await files.open_atomic(str(root / "streamed"), 0o600)
    chunks = [os.urandom(1 << 20) for _ in range(5)]
    await asyncio.gather(
        *(w.write_at(c, i * len(c)) for i, c in enumerate(chunks))
    )  # submitted in order, as the jobs' writer does
    assert not (root / "streamed").exists()
    await w.commit()
    assert (root / "streamed").read_bytes() == b"".join(chunks)
    w = await files.open_atomic(str(root / "dropped"), 0o600)
    await w.write_at(b"partial", 0)
    await w.abort()
    assert not (root / "dropped").exists()
    assert sorted(p.name for p in root.iterdir()) == ["a", "put.bin", "streamed"]  # no temps


async def test_a_file_streams_in_order_whole_or_not_at_all(
    files: RemoteFiles, tmp_path: Path
) -> None:
    # more blocks than the reads kept in flight, and not a multiple of a block
    data = os.urandom(21 * (1 << 20) + 4321)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    got = [chunk async for chunk in files.chunks(str(src), ahead=8)]
    assert b"".join(got) == data
    if files.node == "sftp":  # many reads of the server's largest size, delivered in order
        assert len(got) > 8 and len({len(c) for c in got[:-1]}) == 1
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert [c async for c in files.chunks(str(empty))] == []
    with pytest.raises(RemoteError) as info:
        async for _ in files.chunks(str(tmp_path / "missing")):
            pass
    assert info.value.reason == "file" and "missing" in info.value.message


async def test_tilde_is_the_home_the_nodes_shell_sees(
    files: RemoteFiles, ssh_cluster: SshCluster
) -> None:
    home = await files.home()
    assert home == str(ssh_cluster.home)
    assert await files.abspath("~") == home
    assert await files.abspath("~/x/y") == f"{home}/x/y"
    assert await files.abspath("/abs/~x") == "/abs/~x"


async def test_a_failed_operation_is_one_line(files: RemoteFiles, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RemoteError) as info:
        await files.write(str(blocker / "under-a-file"), b"x")
    assert info.value.reason == "file"
    assert info.value.message.startswith(f"{files.node}: writing {blocker}/under-a-file failed: ")
    assert "\n" not in info.value.message
