"""The trusted bundle: the agent's zipapp runs on a node only from a private folder and only
after its content hash matches.

On the login side, ``prepare_folder`` makes the bundle folder the user's own with mode 0700
(created so; tightened when it is the user's and wider; refused, in one line saying why and
what to set, when it is not the user's, is a shared sticky folder others may write, like
``/tmp``, or cannot be made private); ``deploy`` then pushes the
bundle there (temporary name, then rename).

On the node, ``BOOT`` runs under the node's python before anything of the bundle is imported
(``python -c BOOT BUNDLE DIGEST ARGS...``): it refuses a Python older than 3.6 in words (it
parses on Python 2), checks that the folder is the user's and private (``unsafe-dir``), that the
bundle is a regular file of the user's whose sha256 is DIGEST (the full digest, or the 16-digit
prefix a bundle's name carries), and otherwise says ``missing`` or ``mismatch`` instead of
running it: the login side then uploads the bundle again. An empty, truncated or tampered file
is replaced, never run.
"""

from __future__ import annotations

import re
import shlex

import asyncssh

from gpuctl.reach import launch
from gpuctl.reach.errors import RemoteError
from gpuctl.reach.files import files_for, remote_path

DEPLOY_TAG = b"gpuctl-deploy:"
_NAME = re.compile(r"gpuctl-node-([0-9a-f]{16,64})\.pyz$")

# Must parse on Python 2 (to say "old-python") and run on 3.6: no f-strings, no annotations.
BOOT = r"""import sys
if sys.version_info < (3, 6):
    sys.stdout.write('gpuctl-deploy: old-python %d.%d.%d\n' % tuple(sys.version_info[:3]))
    sys.exit(0)
import errno, hashlib, os, stat
bundle, want = sys.argv[1], sys.argv[2]
folder = os.path.dirname(os.path.abspath(bundle))
def say(words):
    sys.stdout.write('gpuctl-deploy: ' + words + '\n')
    sys.stdout.flush()
    sys.exit(0)
try:
    st = os.stat(folder)
except OSError:
    say('missing ' + bundle)
if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
    say('unsafe-dir %s uid=%d mode=%o' % (folder, st.st_uid, st.st_mode & 0o7777))
try:
    fd = os.open(bundle, os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0))
except OSError as e:
    say(('missing ' if e.errno == errno.ENOENT else 'mismatch ') + bundle)
f = os.fdopen(fd, 'rb')
fst = os.fstat(fd)
h = hashlib.sha256()
while True:
    chunk = f.read(1 << 20)
    if not chunk:
        break
    h.update(chunk)
f.close()
got = h.hexdigest()
if (not stat.S_ISREG(fst.st_mode) or fst.st_uid != os.getuid() or fst.st_size == 0
        or len(want) < 16 or not got.startswith(want)):
    say('mismatch ' + bundle)
sys.path.insert(0, bundle)
from gpuctl.node.__main__ import main
sys.exit(main(sys.argv[3:]))
"""


def expected_digest(bundle_file: str, digest: str | None) -> str:
    """What BOOT compares the bundle's sha256 with: the full ``digest`` when given, else the
    16-digit prefix the file's name carries ("" for a name without one: never runs)."""
    if digest:
        return digest
    m = _NAME.search(bundle_file)
    return m.group(1) if m else ""


def boot_line(python_var: str, bundle_var: str, digest: str, args: list[str]) -> str:
    """The ``sh`` line that execs BOOT under ``$python_var`` on ``$bundle_var``."""
    return (
        f'exec "${python_var}" -c {shlex.quote(BOOT)} "${bundle_var}" '
        f"{shlex.quote(digest)} {shlex.join(args)}"
    )


def parse_reply(line: bytes) -> tuple[str, str] | None:
    """A ``gpuctl-deploy: WORD REST`` line as ``(WORD, REST)``, or None for any other line."""
    if not line.startswith(DEPLOY_TAG):
        return None
    word, _, rest = line[len(DEPLOY_TAG) :].decode(errors="replace").strip().partition(" ")
    return word, rest


_PREPARE = r"""umask 077
D={folder}
mkdir -p "$D" 2>/dev/null
if [ ! -d "$D" ]; then echo "gpuctl-folder: cannot-create"; exit 0; fi
if [ ! -O "$D" ]; then
    echo "gpuctl-folder: not-ours $(ls -ldn "$D" | awk '{{print $3}}')"; exit 0
fi
P=$(ls -ldn "$D")
case "$P" in d???????w[tT]*) echo "gpuctl-folder: shared ${{P%% *}}"; exit 0;; esac
chmod 700 "$D" 2>/dev/null
P=$(ls -ldn "$D")
case "$P" in drwx------*) ;; *) echo "gpuctl-folder: not-private ${{P%% *}}"; exit 0;; esac
cd "$D" && echo "gpuctl-folder: ok $(pwd -P)"
"""


async def prepare_folder(conn: asyncssh.SSHClientConnection, folder: str, node: str) -> str:
    """Make ``folder`` (``~`` is the node's ``$HOME``) the user's own, mode 0700; returns its
    absolute path on the node. Raises RemoteError("deploy") when it is not the user's or
    cannot be made private."""
    r = await launch.run(conn, _PREPARE.format(folder=remote_path(folder)), node=node, timeout=60)
    lines = [ln for ln in r.stdout.decode(errors="replace").splitlines() if ln.strip()]
    word, _, rest = (lines[-1] if lines else "").partition("gpuctl-folder: ")[2].partition(" ")
    fix = "set bundle_dir to a folder of yours (the default is ~/.cache/gpuctl)"
    if word == "ok" and rest.startswith("/"):
        return rest
    if word == "not-ours":
        raise RemoteError(
            "deploy",
            f"{node}:{folder} belongs to uid {rest}, not to you: the agent's code must live in "
            f"a folder only you can change: {fix}",
        )
    if word == "shared":
        # a sticky folder others may write (like /tmp) is shared on purpose: not tightened
        raise RemoteError(
            "deploy",
            f"{node}:{folder} is writable by others ({rest}, a shared folder gpuctl will not "
            f"change): {fix}",
        )
    if word == "not-private":
        raise RemoteError(
            "deploy",
            f"{node}:{folder} is {rest} and cannot be made 0700 (chmod failed): {fix}",
        )
    err = r.stderr.decode(errors="replace").strip().splitlines()
    why = err[-1] if err else "mkdir failed"
    raise RemoteError("deploy", f"{node}: cannot create {folder}: {why}: {fix}")


async def deploy(
    conn: asyncssh.SSHClientConnection, folder: str, name: str, data: bytes, node: str
) -> str:
    """Push the bundle ``data`` as ``folder/name`` into the private folder (made so first);
    returns the absolute path. Raises RemoteError("deploy")."""
    where = await prepare_folder(conn, folder, node)
    path = f"{where}/{name}"
    try:
        await files_for(conn, node).write(path, data, mode=0o600)
    except RemoteError as e:
        if e.reason == "lost":
            raise
        raise RemoteError(
            "deploy", f"cannot upload the agent bundle to {node}:{path}: {e.message}"
        ) from None
    return path
