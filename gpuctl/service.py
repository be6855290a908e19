"""The service layer: may this mutating action run, and whose burns and processes are whose.

Every action that changes nodes (starting or stopping burns, starting acceptance runs,
submitting or cancelling jobs) asks ``check`` (or a ``Guard``) before it does anything, whichever
front end it came from: the TUI, the CLI or the Python API (``gpuctl.fleet.control``,
``gpuctl.accept.run``, ``gpuctl.jobs.Executor``). Agents started with ``--read-only`` refuse on
their side too: defence in depth, not the first line.

Read-only mode has these sources, first match wins:

- the caller's own decision: ``read_only=True`` (``--read-only``, a TUI started read-only);
  ``read_only=False`` means the caller decided already (the CLI checked before the command ran,
  the TUI at start) and nothing is looked at again;
- a fleet built read-only (its agents run with ``--read-only``), whatever else says;
- the session's decision, made once when its ``gpuctl.context.Context`` was built (the one the
  caller holds, else the process's ``gpuctl.context.current()``) from ``$GPUCTL_READ_ONLY``
  set to anything but 0/false/no/off (a typo must not lift a safety switch), then
  ``read_only = true`` in the config. A config that cannot be read refuses the action with its
  own one-line ``ConfigError`` rather than guess. The file is not read again at each action:
  a session keeps the mode it started with (``gpuctl.readonly.read_only_reason``, the floor
  below this module and the context, is how a context decides).

Owners: every burn carries ``owner`` (``Owner``: the user name of this process's uid, the login
host and a per-process session id) in ``stress_start``; the agent records it, reports it and
marks the burner process with it, so that another session sees whose a burner is. ``stress
stop`` stops the caller's user's burners only, unless asked for any owner.

Signalling a GPU process (the process view's kill keys, ``gpuctl.fleet.control.
signal_process``) is a mutating action too, allowed only for the caller's own processes
(``not_mine``); the agent checks the uid again on its side.

Others' processes: ``others_on`` says which GPUs run processes of another user than the caller,
from the latest sample the fleet holds, so the TUI can ask and the CLI can require ``--force``
before a burn lands on someone's job.

Headless: standard library, ``gpuctl.context`` and ``gpuctl.core``; never textual.
"""

from __future__ import annotations

import os
import pwd
import secrets
import socket
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuctl.context import Context, current
from gpuctl.core.model import NodeSnapshot, OwnerWire
from gpuctl.core.wire import JsonObject

if TYPE_CHECKING:
    from gpuctl.fleet.fleet import Fleet

# What a front end that holds only a yes/no says of why (the TUI: the CLI decided at start).
ANY_SOURCE = "--read-only, GPUCTL_READ_ONLY or read_only in the config"
OWNER_FIELDS = ("user", "host", "session")
OWNER_LIMIT = 256  # characters of one owner field; the agent refuses longer ones


class ReadOnlyError(Exception):
    """A mutating action refused in read-only mode. ``str()`` is one line:
    ``read-only mode: stress is disabled (GPUCTL_READ_ONLY is set: unset it)``; ``what`` is the
    action, ``why`` the source and how to lift it."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"read-only mode: {what} is disabled ({why})")
        self.what = what
        self.why = why


def fleet_read_only(fleet: Fleet) -> bool:
    """True when ``fleet`` (a ``gpuctl.fleet.fleet.Fleet``) was built read-only: one of its
    links starts its agent with ``--read-only`` (``NodeLink.read_only``)."""
    return any(rt.link.read_only for rt in fleet.nodes.values())


def read_only_link_why(fleet: Fleet) -> str | None:
    """Why a link of ``fleet`` cannot act, when it says (a node seen through Prometheus has no
    agent: ``NodeLink.read_only_why``), else None."""
    for rt in fleet.nodes.values():
        why = rt.link.read_only_why
        if why is not None:
            return why
    return None


@dataclass(frozen=True, slots=True)
class Guard:
    """What an object knows of read-only mode, kept to judge the actions it performs later.

    ``read_only``: the caller's decision (None: the session's, below); ``context``: the
    session whose decision counts (None: the process's, ``gpuctl.context.current()``, looked
    up at the first action that needs it); ``fleet``: the fleet the actions go to (a fleet
    built read-only refuses whatever else says); ``why``: the words for an explicit
    ``read_only=True``.
    """

    read_only: bool | None = None
    context: Context | None = None
    fleet: Fleet | None = None
    why: str | None = None

    def refusal(self, what: str) -> ReadOnlyError | None:
        """The error that refuses ``what`` ("stress", "submitting jobs"), or None when it may
        run. Raises ConfigError when the session's config must be read and cannot be."""
        link_why = read_only_link_why(self.fleet) if self.fleet is not None else None
        if link_why is not None:  # no agent to act through: no flag lifts that
            return ReadOnlyError(what, link_why)
        if self.read_only:
            return ReadOnlyError(what, self.why or "read_only=True was given: leave it out")
        if self.fleet is not None and fleet_read_only(self.fleet):
            return ReadOnlyError(
                what, "the fleet's agents run with --read-only: build the fleet without read_only"
            )
        if self.read_only is False:
            return None
        context = self.context if self.context is not None else current()
        why = context.read_only_why
        return None if why is None else ReadOnlyError(what, why)

    def check(self, what: str) -> None:
        """Raise ReadOnlyError when ``what`` may not run (ConfigError: see ``refusal``)."""
        error = self.refusal(what)
        if error is not None:
            raise error


def refusal(
    what: str,
    *,
    read_only: bool | None = None,
    context: Context | None = None,
    fleet: Fleet | None = None,
    why: str | None = None,
) -> ReadOnlyError | None:
    """``Guard(read_only, context, fleet, why).refusal(what)``: the error or None."""
    return Guard(read_only, context, fleet, why).refusal(what)


def check(
    what: str,
    *,
    read_only: bool | None = None,
    context: Context | None = None,
    fleet: Fleet | None = None,
    why: str | None = None,
) -> None:
    """Refuse ``what`` in read-only mode: raises ReadOnlyError (one line, see the module
    docstring for the sources), or ConfigError when the config cannot be read."""
    Guard(read_only, context, fleet, why).check(what)


# -- owners -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Owner:
    """Who started a burn: a user name, the host gpuctl ran on and that gpuctl's session id."""

    user: str
    host: str
    session: str

    @classmethod
    def from_wire(cls, d: object) -> Owner | None:
        """An owner from a protocol dict, or None when it is missing or malformed."""
        if not isinstance(d, Mapping):
            return None
        values = [d.get(k) for k in OWNER_FIELDS]
        if not all(isinstance(v, str) and v for v in values):
            return None
        return cls(*(str(v) for v in values))

    def to_wire(self) -> OwnerWire:
        """The ``owner`` field of ``stress_start``."""
        return {"user": self.user, "host": self.host, "session": self.session}

    def __str__(self) -> str:
        return f"{self.user}@{self.host}"


_me: Owner | None = None


def user_name() -> str:
    """This process's user: the name of its uid (the uid as text when it has no name)."""
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def me() -> Owner:
    """The owner of the burns this process starts: its user, this host, and a session id made
    once per process (two gpuctl in two terminals are two sessions of one user)."""
    global _me
    if _me is None:
        host = socket.gethostname() or "localhost"
        _me = Owner(user_name()[:OWNER_LIMIT], host[:OWNER_LIMIT], secrets.token_hex(6))
    return _me


def owner_text(owner: object) -> str:
    """``user@host`` of a wire owner, or "an unknown owner" (a burner no gpuctl marked)."""
    parsed = owner if isinstance(owner, Owner) else Owner.from_wire(owner)
    return str(parsed) if parsed is not None else "an unknown owner"


def stop_request(gpus: list[int] | None, *, any_owner: bool = False) -> JsonObject:
    """The ``stress_stop`` request that stops this agent's burns and the burners of other
    sessions on the node: only those of the caller's user, unless ``any_owner``."""
    msg: JsonObject = {
        "type": "stress_stop",
        "gpus": "all" if gpus is None else list(gpus),
        "others": True,
    }
    if not any_owner:
        msg["owner_user"] = me().user
    return msg


# -- other users' processes on GPUs -------------------------------------------------------------
UNKNOWN_USER = "an unknown user"


def not_mine(process_user: str | None, *, user: str | None = None) -> str | None:
    """Why a process of ``process_user`` is not the caller's to signal (``user``, default this
    process's user), in words (``belongs to alice, not to bob: only your own processes``), or
    None when it is the caller's. A process whose user the node could not tell is not."""
    mine = user if user is not None else user_name()
    if process_user == mine:
        return None
    return f"belongs to {process_user or UNKNOWN_USER}, not to {mine}: only your own processes"


@dataclass(frozen=True, slots=True)
class OthersGpu:
    """A GPU whose latest sample shows processes of users other than the caller's:
    ``users`` is ``(user, processes)``, most processes first."""

    node: str
    gpu: int
    users: tuple[tuple[str, int], ...]

    def line(self) -> str:
        """``gpu03 GPU 2 runs processes of alice (2)``."""
        return f"{self.node} GPU {self.gpu} {self.runs()}"

    def runs(self) -> str:
        """``runs processes of alice (2), bob (1)``."""
        return f"runs processes of {_users(self.users)}"


def _users(counts: Iterable[tuple[str, int]]) -> str:
    return ", ".join(f"{user} ({n})" for user, n in counts)


def others_on(
    snap: NodeSnapshot, gpus: Iterable[int] | None = None, *, user: str | None = None
) -> list[OthersGpu]:
    """The GPUs of ``snap`` (those in ``gpus``; None: all) whose latest sample shows processes
    of users other than ``user`` (default: this process's), by GPU index. A process whose user
    the node could not tell counts as another user's. GPUs already burning are left out: a
    start there is refused as busy, and the burner is the caller's own."""
    mine = user if user is not None else user_name()
    wanted = None if gpus is None else set(gpus)
    out = []
    for g in sorted(snap.gpus, key=lambda g: g.index):
        if wanted is not None and g.index not in wanted:
            continue
        if snap.burning(g.index):
            continue
        counts = Counter(p.user or UNKNOWN_USER for p in g.processes if p.user != mine)
        if counts:
            ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            out.append(OthersGpu(snap.name, g.index, tuple(ranked)))
    return out


def others_summary(found: Iterable[OthersGpu]) -> str:
    """One sentence for many GPUs: ``3 GPUs run processes of other users: alice (4), bob (1)``
    (users by their processes over all those GPUs). Empty for none."""
    found = list(found)
    if not found:
        return ""
    if len(found) == 1:
        return found[0].line()
    total: Counter[str] = Counter()
    for o in found:
        for u, n in o.users:
            total[u] += n
    ranked = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))
    return f"{len(found)} GPUs run processes of other users: {_users(ranked)}"
