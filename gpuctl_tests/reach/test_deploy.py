"""The trusted bundle: the boot code runs the agent only from a private folder of the user's and
only a bundle whose sha256 matches; the login side makes the folder private or refuses."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpuctl.config import NodeConfig
from gpuctl.fleet.session import LinkError
from gpuctl.fleet.ssh import BundleStore, SshLink, agent_script
from gpuctl.reach.deploy import BOOT, expected_digest
from gpuctl_tests.harness.sshd import SshCluster
from gpuctl_tests.helpers import old_python

NOBODY = 65534


def fake_bundle(path: Path, marker: Path) -> None:
    """A zipapp whose agent, if it ever ran, would leave ``marker``."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("gpuctl/__init__.py", "")
        zf.writestr("gpuctl/node/__init__.py", "")
        zf.writestr(
            "gpuctl/node/__main__.py",
            f"open({str(marker)!r}, 'w').write('ran')\ndef main(argv):\n    return 0\n",
        )


def start_locally(folder: Path, store: BundleStore, python: str, digest: str | None) -> str:
    """Run the agent script with ``sh -c`` (as srun does) and return its first line."""
    node = NodeConfig(name="n", cluster="c", python=python, simulate="1", interval=0.2)
    script = agent_script(node, str(folder), store.name, digest=digest)
    p = subprocess.run(
        ["sh", "-c", script],
        input=b"",
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ""},
    )
    return p.stdout.decode().splitlines()[0] if p.stdout else p.stderr.decode()


@pytest.fixture(scope="module")
def store() -> BundleStore:
    return BundleStore()


@pytest.mark.parametrize("python", ["3.6.15", "this"])
@pytest.mark.parametrize("digest", ["full", "from the name"])
def test_boot_runs_only_the_right_bundle_from_a_private_folder(
    tmp_path: Path, store: BundleStore, python: str, digest: str
) -> None:
    py = sys.executable if python == "this" else old_python(python)
    full = store.sha256 if digest == "full" else None
    folder = tmp_path / "bundles"
    folder.mkdir(mode=0o700)
    bundle = folder / store.name
    marker = tmp_path / "ran"

    def start() -> str:
        return start_locally(folder, store, py, full)

    assert start() == f"gpuctl-deploy: missing {bundle}"
    fake_bundle(bundle, marker)  # tampered: the right name, other content
    assert start() == f"gpuctl-deploy: mismatch {bundle}"
    bundle.write_bytes(b"")  # what a full disk leaves
    assert start() == f"gpuctl-deploy: missing {bundle}"  # the sh's check: replaced all the same
    data = store.data
    bundle.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])  # one bit off
    assert start() == f"gpuctl-deploy: mismatch {bundle}"
    bundle.unlink()
    real = tmp_path / "elsewhere.pyz"
    real.write_bytes(store.data)
    bundle.symlink_to(real)  # the right bytes, but reached through a link: not in the folder
    assert start() == f"gpuctl-deploy: mismatch {bundle}"
    bundle.unlink()
    bundle.write_bytes(store.data)
    hello = json.loads(start())
    assert hello["type"] == "hello"
    for mode in (0o770, 0o755, 0o707):  # others may read or write it: not private
        folder.chmod(mode)
        assert start() == f"gpuctl-deploy: unsafe-dir {folder} uid={os.getuid()} mode={mode:o}"
    folder.chmod(0o700)
    os.chown(folder, NOBODY, -1)  # not ours
    try:
        assert start() == f"gpuctl-deploy: unsafe-dir {folder} uid={NOBODY} mode=700"
    finally:
        os.chown(folder, os.getuid(), -1)
    assert not marker.exists()  # nothing of a wrong bundle ever ran


def test_boot_parses_on_python_2_to_say_old_python(tmp_path: Path) -> None:
    py27 = old_python("2.7.18")
    r = subprocess.run(
        [py27, "-c", BOOT, str(tmp_path / "x.pyz"), "0" * 64],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.stdout == "gpuctl-deploy: old-python 2.7.18\n", r.stderr


def test_expected_digest() -> None:
    data = b"bundle"
    sha = hashlib.sha256(data).hexdigest()
    assert expected_digest(f"gpuctl-node-{sha[:16]}.pyz", None) == sha[:16]
    assert expected_digest(f"gpuctl-node-{sha[:16]}.pyz", sha) == sha
    assert expected_digest("other.pyz", None) == ""  # never matches: never runs


@pytest.mark.sshd
async def test_a_bundle_folder_not_ours_is_refused(
    ssh_cluster: SshCluster, tmp_path: Path, store: BundleStore
) -> None:
    await asyncio.to_thread(ssh_cluster.start_node, "strange")
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o755)
    os.chown(folder, NOBODY, -1)
    marker = tmp_path / "ran"
    fake_bundle(folder / store.name, marker)
    os.chown(folder / store.name, NOBODY, -1)
    node = NodeConfig(
        name="strange",
        cluster="t",
        ssh_config=str(ssh_cluster.ssh_config_path),
        bundle_dir=str(folder),
        simulate="1",
    )
    link = SshLink(node, store=store)
    try:
        with pytest.raises(LinkError) as info:
            await link.open()
    finally:
        await link.aclose()
    assert info.value.reason == "deploy"
    assert info.value.message == (
        f"strange:{folder} belongs to uid {NOBODY}, not to you: the agent's code must live in "
        "a folder only you can change: set bundle_dir to a folder of yours (the default is "
        "~/.cache/gpuctl)"
    )
    assert folder.stat().st_mode & 0o777 == 0o755  # left as it was
    assert not marker.exists() and store.uploads == []


@pytest.mark.sshd
async def test_a_wider_bundle_folder_of_ours_is_made_private(
    ssh_cluster: SshCluster, tmp_path: Path, store: BundleStore
) -> None:
    await asyncio.to_thread(ssh_cluster.start_node, "wide")
    folder = tmp_path / "wide"
    folder.mkdir()
    folder.chmod(0o775)  # group-writable: anyone in the group could swap the bundle
    (folder / store.name).write_bytes(store.data)
    node = NodeConfig(
        name="wide",
        cluster="t",
        ssh_config=str(ssh_cluster.ssh_config_path),
        bundle_dir=str(folder),
        simulate="1",
    )
    link = SshLink(node, store=store)
    try:
        session = await link.open()
        assert (await session.handshake(30)).protocol is not None
        await session.close()
    finally:
        await link.aclose()
    assert folder.stat().st_mode & 0o777 == 0o700
    # a folder that does not exist yet is created private, parents too
    deep = tmp_path / "new" / "deeper"
    link = SshLink(
        NodeConfig(
            name="wide",
            cluster="t",
            ssh_config=str(ssh_cluster.ssh_config_path),
            bundle_dir=str(deep),
            simulate="1",
        ),
        store=store,
    )
    try:
        session = await link.open()
        await session.close()
    finally:
        await link.aclose()
    assert deep.stat().st_mode & 0o777 == 0o700
    assert deep.parent.stat().st_mode & 0o777 == 0o700
    assert (deep / store.name).stat().st_mode & 0o777 == 0o600
