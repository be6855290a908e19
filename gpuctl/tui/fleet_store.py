"""The app's view of the fleet: latest snapshot per node, versions, totals, XIDs seen.

The fleet's listener only drops the newest snapshot into ``pending`` (latest wins); the app takes
the pending set once per refresh tick, so a burst of samples costs one repaint, not one per
sample. A live node's sample also replaces its kept snapshot at once, with its header parts
computed (``offer``: while the memory is warm); the flush still counts it changed.

A node that leaves the fleet (``Fleet.remove_node``: a host the site's Prometheus stopped holding)
is forgotten at the next flush too (``leave``, ``take_removed``), with the rebuild of the list:
until then its rows are painted from its last snapshot, never from a half-forgotten node.

The header's cluster figures (``totals``, ``trouble``) are asked for at every flush (about nine a
second) but only the nodes taken since the last ask changed: each node's part is kept and only
the changed ones are computed again (``_settle``), instead of a walk over every node's cached
part at each ask (a call, a version check, a dict of counts per node). At 512 nodes of 8 GPUs
with 60 changed per flush the two took 1.2 ms a flush before, 0.8-1.0 ms now: the rest is the
changed nodes' own parts (``trouble_counts``, ``node_totals``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuctl.core.format import short_model
from gpuctl.core.model import BurnState, GpuSample, NodeSnapshot, NodeState
from gpuctl.fleet.fleet import Fleet
from gpuctl.tui.view import (
    ALLOC_IDLE,
    PROBLEMS,
    ClusterTotals,
    GpuFacts,
    NodeFilter,
    NodeTotals,
    cluster_totals,
    node_totals,
    parse_filter,
    trouble_counts,
    trouble_event,
)

if TYPE_CHECKING:
    from gpuctl.fleet.troublelog import Trouble, TroubleLog

BURN_ENDED = ("done", "failed")
BURN_ENDED_SHOWN_S = 60.0  # a finished burn's verdict stays on its row this long


class FleetStore:
    """Everything the widgets read; only the app writes it (attributes down)."""

    def __init__(self, fleet: Fleet, clock: Callable[[], float] = time.time) -> None:
        self.fleet = fleet
        self.clock = clock
        self.order: list[str] = list(fleet.names)
        self.snaps: dict[str, NodeSnapshot] = {n: fleet.snapshot(n) for n in self.order}
        self.version: dict[str, int] = dict.fromkeys(self.order, 0)
        self.pending: dict[str, NodeSnapshot] = {}
        self.arrivals: dict[str, float] = {}  # monotonic time a pending snapshot arrived
        # (node, GPU) an XID was seen on: the app adds to it, ``take_removed`` replaces it;
        # nothing removes from it in place (``xid_gpus`` indexes it: the set indexed, its size)
        self.xids: set[tuple[str, int]] = set()
        self._xid_index: tuple[set[tuple[str, int]], int, dict[str, set[int]]] = (self.xids, 0, {})
        # The trouble log the app keeps (``gpuctl.fleet.troublelog``): ``n`` walks its
        # unacknowledged rows first (``unacked_at``).
        self.troubles: TroubleLog | None = None
        self.filter: NodeFilter = parse_filter("")
        self._totals: dict[str, tuple[int, NodeTotals]] = {}
        self._trouble: dict[str, tuple[int, dict[str, int]]] = {}
        self._burn_ended: dict[tuple[str, int], float] = {}  # when a burn was seen finished
        # The header's parts (``_settle``): per node, in ``order``, whether it is live and its
        # totals when it is live or stale; the trouble counted over every node, and each
        # node's share of it; the nodes taken since the parts were last brought up to date.
        self._parts: dict[str, tuple[bool, NodeTotals | None]] = dict.fromkeys(
            self.order, (False, None)
        )
        self._trouble_sum: dict[str, int] = dict.fromkeys(PROBLEMS, 0)
        # ``counts``: the live nodes and the GPUs of the live and stale ones, kept with the
        # parts (the sums of ``totals`` are made only when the header shows them)
        self._live_n = 0
        self._gpus_n = 0
        self._counted: dict[str, dict[str, int]] = {}
        self._unsettled: set[str] = set(self.order)
        self.leaving: dict[str, str] = {}  # node -> why it left, until the next flush

    # -- writes (the app) ---------------------------------------------------------------------
    def offer(self, snapshot: NodeSnapshot) -> bool:
        """Keep the newest snapshot of a node; True if a flush must be scheduled.

        A snapshot that only moves its node's readings on (the same state, hello and number
        of GPUs: what a live node's every sample is) also replaces the one in ``snaps`` at once,
        rather than at the flush (which still counts it changed: versions, the header's parts):
        the replaced one, its GPUs' readings and processes (~180 blocks of memory a node of 8
        GPUs), is freed here, and the next line's decode takes those blocks again while they
        are in the cache; freed 60 nodes at a time by the flush, they were cold by the time the
        decodes of the next 100 ms took them (``_PyObject_Malloc`` was 9% of the screen's CPU
        at 4,096 GPUs, ``perf``). What a paint before the flush shows of the node is then the
        newer readings in the same rows.

        Its header parts (``trouble_counts``, ``node_totals``) are computed here too, for the
        version the flush will give it, while its GPUs' readings are in the cache (just
        decoded): at the flush, 60 nodes later, reading them again took several times as
        long. Any other snapshot drops the parts kept for that version (the flush computes
        them); an XID comes with a snapshot (the app offers one after every event)."""
        first = not self.pending
        name = snapshot.name
        self.pending[name] = snapshot
        kept = self.snaps.get(name)
        after = self.version.get(name, 0) + 1  # the version the flush gives it
        if (
            kept is not None
            and kept.state is snapshot.state
            and kept.info is snapshot.info
            and len(kept.gpus) == len(snapshot.gpus)
            and name not in self.leaving
        ):
            self.snaps[name] = snapshot
            self._trouble[name] = (after, trouble_counts(snapshot, self.xid_gpus(name)))
            if snapshot.state in (NodeState.LIVE, NodeState.STALE):
                self._totals[name] = (after, node_totals(snapshot))
        else:
            for parts in (self._trouble, self._totals):
                part = parts.get(name)
                if part is not None and part[0] == after:
                    del parts[name]
        self.arrivals.setdefault(name, time.monotonic())
        return first

    def leave(self, name: str, why: str) -> bool:
        """Note that node ``name`` left the fleet (``why``), to be forgotten at the next flush
        (``take_removed``); True if a flush must be scheduled. A snapshot of it still pending
        is dropped: one arriving after this is the node come back."""
        first = not self.pending and not self.leaving
        self.pending.pop(name, None)
        self.arrivals.pop(name, None)
        self.leaving[name] = why
        return first

    def take_removed(self) -> dict[str, str]:
        """Forget the nodes that left since the last call (their rows, the header's parts,
        their XIDs); returns them, each with why it left. Call before ``take_pending``: a node
        that left and came back within one flush is forgotten, then added again."""
        leaving, self.leaving = self.leaving, {}
        gone = {n: why for n, why in leaving.items() if n in self.snaps}
        if not gone:
            return gone
        self._settle()  # each node's share of the trouble is counted: take the leavers' out
        for name in gone:
            for kind, n in self._counted.pop(name, {}).items():
                self._trouble_sum[kind] -= n
            del self.snaps[name]
            self._count(self._parts.get(name), None)
            for kept in (self._totals, self._trouble, self._parts):
                kept.pop(name, None)
            # ``version`` is kept: a node that comes back goes on counting, so what a widget
            # kept by (node, version) is never taken for the new node's
        self.order = [n for n in self.order if n not in gone]
        self.xids = {key for key in self.xids if key[0] not in gone}
        self._burn_ended = {k: t for k, t in self._burn_ended.items() if k[0] not in gone}
        return gone

    def take_pending(self) -> tuple[set[str], dict[str, float]]:
        """Apply pending snapshots; returns the changed names and when each arrived."""
        pending, self.pending = self.pending, {}
        arrivals, self.arrivals = self.arrivals, {}
        for name, snap in pending.items():
            if name not in self.snaps:
                self.order.append(name)
                self._parts[name] = (False, None)  # its place in ``order``
            self.snaps[name] = snap
            self.version[name] = self.version.get(name, 0) + 1
        names = set(pending)
        self._unsettled |= names
        return names, arrivals

    # -- reads (the widgets) ------------------------------------------------------------------
    def _settle(self) -> None:
        """Compute again the header's parts of the nodes taken since the last call."""
        if not self._unsettled:
            return
        live_or_stale = (NodeState.LIVE, NodeState.STALE)
        total = self._trouble_sum
        for name in self._unsettled:
            s = self.snaps[name]
            totals = self._node_totals(s) if s.state in live_or_stale else None
            part = (s.state is NodeState.LIVE, totals)
            self._count(self._parts.get(name), part)
            self._parts[name] = part
            counts = self.node_trouble(name)
            old = self._counted.get(name)
            if old != counts:  # most nodes, each sample: the same counts (none), nothing to move
                if old is not None:
                    for kind, n in old.items():
                        total[kind] -= n
                for kind, n in counts.items():
                    total[kind] = total.get(kind, 0) + n
            self._counted[name] = counts
        self._unsettled = set()

    def _count(
        self,
        old: tuple[bool, NodeTotals | None] | None,
        new: tuple[bool, NodeTotals | None] | None,
    ) -> None:
        """Move ``counts`` from a node's old part to its new one (None: no part)."""
        for part, sign in ((old, -1), (new, 1)):
            if part is not None:
                self._live_n += sign * part[0]
                if part[1] is not None:
                    self._gpus_n += sign * part[1].gpus

    def totals(self) -> ClusterTotals:
        self._settle()
        return cluster_totals(self._parts.values())

    def counts(self) -> tuple[int, int, int]:
        """``totals``' live nodes, nodes and GPUs, without its sums over every node."""
        self._settle()
        return self._live_n, len(self._parts), self._gpus_n

    def _node_totals(self, s: NodeSnapshot) -> NodeTotals:
        v = self.version.get(s.name, 0)
        cached = self._totals.get(s.name)
        if cached is None or cached[0] != v:
            cached = (v, node_totals(s))
            self._totals[s.name] = cached
        return cached[1]

    def xid_gpus(self, name: str) -> set[int]:
        """The GPUs of node ``name`` an XID was seen on (a set of the caller's own).

        Asked for every node's every sample (``offer``) and for every node at each sort by
        trouble: ``xids`` is indexed by node once it changes (it only grows, or is replaced),
        not walked at each ask (a walk per sample, as long as the XIDs seen: a cluster's
        day brings many, Xid 13, 31 and 43 are a user program's faults)."""
        xids = self.xids
        if not xids:
            return set()
        indexed, size, index = self._xid_index
        if indexed is not xids or size != len(xids):
            index = {}
            for n, i in xids:
                index.setdefault(n, set()).add(i)
            self._xid_index = (xids, len(xids), index)
        mine = index.get(name)
        return set(mine) if mine else set()

    def last_xid(self, name: str, gpu: int | None) -> object | None:
        """The number of the last XID a GPU reported, as its event said it (None: none kept;
        "?" when one was seen but its event is no longer kept)."""
        if gpu is None:
            return None
        for e in reversed(self.fleet.events(name)):
            if e.kind == "xid" and e.gpu == gpu:
                xid: object = e.detail.get("xid", "?")
                return xid
        return "?" if (name, gpu) in self.xids else None

    def unacked_at(self) -> dict[tuple[str, int | None], Trouble]:
        """Where the trouble log's unacknowledged alarms and warnings are, on the screen's
        nodes: (node, GPU; None: the node's own, an unreachable node, a failed acceptance run)
        to its newest row. Made once per ``n``: it walks these first."""
        out: dict[tuple[str, int | None], Trouble] = {}
        if self.troubles is None:
            return out
        for row in reversed(self.troubles.unacked()):  # the newest last: it stays
            if (
                row.node in self.snaps
                and trouble_event(row.kind, row.subject, row.detail)[1] != "plain"
            ):
                out[(row.node, row.gpu)] = row
        return out

    @staticmethod
    def unacked_notice(row: Trouble) -> str:
        """What ``n`` says when it stops on an unacknowledged row."""
        what = trouble_event(row.kind, row.subject, row.detail)[0]
        where = row.node if row.gpu is None else f"{row.node} GPU {row.gpu}"
        times = f" ×{row.count}" if row.count > 1 else ""
        return f"unacknowledged{times}: {where}: {what} (e: the events, Enter there acknowledges)"

    def node_trouble(self, name: str) -> dict[str, int]:
        """``view.trouble_counts`` of a node, kept until its next snapshot (an XID comes with
        one: the app offers the node's snapshot after every event)."""
        v = self.version.get(name, 0)
        cached = self._trouble.get(name)
        if cached is None or cached[0] != v:
            cached = (v, trouble_counts(self.snaps[name], self.xid_gpus(name)))
            self._trouble[name] = cached
        return cached[1]

    def trouble(self) -> dict[str, int]:
        """The header's counts over the cluster: lost GPUs, GPUs with an XID, with ECC or
        row-remap trouble, down (unreachable or stale) nodes, GPUs slowed down."""
        if not self.order:
            return {}
        self._settle()
        out = dict(self._trouble_sum)
        out[ALLOC_IDLE] = self.fleet.idle.count()  # a span of time: the fleet's tracker
        return out

    def node_totals(self, name: str) -> NodeTotals:
        return self._node_totals(self.snaps[name])

    def model(self, s: NodeSnapshot, gpu: int) -> str:
        if s.info is not None:
            for st in s.info.gpus:
                if st.index == gpu:
                    return short_model(st.name)
        return "?"

    def burn(self, s: NodeSnapshot, gpu: int) -> BurnState | None:
        """The burn a GPU row shows: a finished one (done, failed) only for
        ``BURN_ENDED_SHOWN_S`` after it was first seen finished, then none."""
        burn = s.burn(gpu)
        key = (s.name, gpu)
        if burn is None or burn.get("state") not in BURN_ENDED:
            self._burn_ended.pop(key, None)
            return burn
        ended = self._burn_ended.setdefault(key, self.clock())
        return burn if self.clock() - ended < BURN_ENDED_SHOWN_S else None

    def any_match(self) -> bool:
        """Whether the filter lets any node through."""
        return any(self.visible_gpus(self.snaps[n]) is not None for n in self.order)

    def is_burning(self, s: NodeSnapshot, gpu: int) -> bool:
        return s.burning(gpu)

    def facts(self, s: NodeSnapshot, g: GpuSample) -> GpuFacts:
        return GpuFacts(
            model=self.model(s, g.index),
            xid=(s.name, g.index) in self.xids,
            burning=self.is_burning(s, g.index),
            idle_s=self.fleet.idle.idle_for(s.name, g.index),
        )

    def visible_gpus(self, s: NodeSnapshot) -> list[int] | None:
        """Positions in ``s.gpus`` the filter lets through; None hides the whole node."""
        f = self.filter
        if not f.node_matches(s):
            return None
        if not f.has_gpu_terms:
            return list(range(len(s.gpus)))
        shown = [i for i, g in enumerate(s.gpus) if f.gpu_matches(s, g, self.facts(s, g))]
        if shown:
            return shown
        # A node without GPU rows (unreachable, connecting) still matches by name.
        if not s.gpus and f.gpu_matches(s, None, self._no_facts):
            return []
        return None

    _no_facts = GpuFacts()

    def retry_in(self, name: str) -> float | None:
        """Seconds until the fleet tries a down node again; None while it tries (or is up)."""
        at = self.fleet.retry_at(name)
        return None if at is None else max(0.0, at - self.fleet.clock())

    def util_history(self, name: str, gpu: int, n: int) -> list[float | None]:
        return self.fleet.history(name, gpu).recent("util", n)
