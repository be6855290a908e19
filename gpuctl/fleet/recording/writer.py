"""Writing a recording: ``RecordingWriter`` (the file) and ``Recorder`` (a fleet's stream).

Frames are written whole and flushed, so a recording killed mid-way replays up to its last
complete frame: without the trailer the reader walks the frame headers instead of the index.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import zstandard

from gpuctl.core.model import NodeSnapshot, NodeState
from gpuctl.core.wire import JsonObject
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.recording.format import (
    FORMAT,
    FRAME,
    FRAME_TAG,
    INDEX_TAG,
    SUFFIX,
    TRAILER,
    TRAILER_TAG,
    VERSION,
    Record,
    SlurmJobs,
    slurm_jobs,
)
from gpuctl.node import protocol

FRAME_SECONDS = 10.0  # seek granularity, and the most a killed recording loses
FRAME_BYTES = 8 << 20  # raw bytes that close a frame early (a big fleet)
RECORDED = ("hello", "sample", "event")


class RecordingWriter:
    """Writes the header, then frames, then the index and trailer on ``close()``."""

    def __init__(
        self, path: str | os.PathLike[str], nodes: list[tuple[str, str]], *, started: float
    ) -> None:
        """Create ``path`` (mode 0600: samples name users and their commands). Raises
        FileExistsError when it exists, OSError when it cannot be created."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.path = Path(path)
        self.file: IO[bytes] = os.fdopen(fd, "wb")
        header = {
            "format": FORMAT,
            "version": VERSION,
            "started": started,
            "gpuctl": _version(),
            "nodes": [{"name": n, "link": kind} for n, kind in nodes],
        }
        self.file.write(json.dumps(header, separators=(",", ":")).encode() + b"\n")
        self.file.flush()
        self.index: list[tuple[float, int]] = []
        self._zstd = zstandard.ZstdCompressor(level=3)
        self.closed = False

    def write_frame(self, payload: bytes, t_first: float, t_last: float) -> None:
        """Compress ``payload`` (JSON lines) into one frame and flush it to the file."""
        data = self._zstd.compress(payload)
        offset = self.file.tell()
        self.file.write(FRAME.pack(FRAME_TAG, len(data), t_first, t_last) + data)
        self.file.flush()
        self.index.append((t_first, offset))

    def close(self) -> None:
        """Write the index and the trailer, and close the file."""
        if self.closed:
            return
        self.closed = True
        data = self._zstd.compress(json.dumps(self.index).encode())
        offset = self.file.tell()
        self.file.write(FRAME.pack(INDEX_TAG, len(data), 0.0, 0.0) + data)
        self.file.write(TRAILER.pack(TRAILER_TAG, offset))
        self.file.close()


def _version() -> str:
    from gpuctl import __version__

    return str(__version__)


class Recorder:
    """Records ``fleet``'s stream into ``path`` from now until ``close()``.

    Runs on the fleet's event loop (its listeners do). Frames close every ``frame_seconds`` of
    stream, or at ``FRAME_BYTES``; a timer closes a frame that quiet nodes leave open.
    """

    def __init__(
        self,
        fleet: Fleet,
        path: str | os.PathLike[str],
        *,
        frame_seconds: float = FRAME_SECONDS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """Start recording; raises FileExistsError or OSError when ``path`` cannot be made."""
        self.fleet = fleet
        self.clock = clock or fleet.clock
        self.frame_seconds = frame_seconds
        self.started = self.clock()
        nodes = [(n, rt.link.kind) for n, rt in fleet.nodes.items()]
        self.writer = RecordingWriter(path, nodes, started=self.started)
        self.path = self.writer.path
        self.hellos: dict[str, JsonObject] = {}
        self.last_sample: dict[str, JsonObject] = {}
        self.down: dict[str, str] = {}
        self.slurm: dict[str, SlurmJobs] = {}
        self.header = {n for n, _kind in nodes}
        self.joined: dict[str, str] = {}  # node -> link kind, for the nodes added since
        self.left: dict[str, str] = {}  # header node -> why, for those removed since
        for name, rt in fleet.nodes.items():
            jobs = slurm_jobs(rt.snapshot)
            if jobs:
                self.slurm[name] = jobs
            if rt.session is not None and rt.session.hello_msg is not None:
                self.hellos[name] = rt.session.hello_msg
            elif rt.snapshot.state is NodeState.UNREACHABLE:
                self.down[name] = rt.snapshot.reason or "unreachable"
        self.samples = 0
        self._lines: list[bytes] = []
        self._size = 0
        self._first: float | None = None
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._ended: float | None = None
        fleet.on_wire(self._on_wire)
        fleet.subscribe(self._on_snapshot)
        fleet.on_removed(self._on_removed)
        with contextlib.suppress(RuntimeError):  # no loop: frames close by size and time only
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(frame_seconds, self._tick)

    def _join(self, node: str) -> None:
        """A node the header does not name (``Fleet.add_node``: a host that appeared in the
        site's Prometheus): a ``join`` record, before anything of its own, says when it came
        and how it is reached; every later frame's keyframes say it again."""
        if (node in self.header and node not in self.left) or node in self.joined:
            return
        self.left.pop(node, None)  # a header node back after it left: it joins again
        rt = self.fleet.nodes.get(node)
        kind = self.joined[node] = rt.link.kind if rt is not None else "recorded"
        self._add({"t": self.clock(), "n": node, "join": kind})

    def _on_removed(self, node: str, why: str) -> None:
        """A node the fleet dropped (``Fleet.remove_node``: a host gone from the site's
        Prometheus): a ``leave`` record, and nothing of it in later keyframes but, for a header
        node, its ``leave`` (a replay starting there must not show it)."""
        for state in (self.hellos, self.last_sample, self.down, self.slurm, self.joined):
            state.pop(node, None)
        if node in self.header:
            self.left[node] = why
        self._add({"t": self.clock(), "n": node, "leave": why})

    def _on_wire(self, node: str, msg: JsonObject) -> None:
        kind = msg.get("type")
        if kind not in RECORDED:
            return
        self._join(node)
        if kind == "hello":
            self.hellos[node] = msg
            self.last_sample.pop(node, None)
            self.down.pop(node, None)
        elif kind == "sample":
            self.samples += 1
            self.last_sample[node] = msg
        self._add({"t": self.clock(), "n": node, "m": msg})

    def _on_snapshot(self, snap: NodeSnapshot) -> None:
        if snap.name == self.fleet.leaving:
            return  # remove_node's last word: the ``leave`` that follows says why, not a down
        self._join(snap.name)  # its first snapshot, published by add_node
        jobs = slurm_jobs(snap)
        if jobs != self.slurm.get(snap.name, {}):
            self.slurm[snap.name] = jobs
            self._add({"t": self.clock(), "n": snap.name, "slurm": jobs})
        if snap.state is not NodeState.UNREACHABLE:
            return
        reason = snap.reason or "unreachable"
        if self.down.get(snap.name) != reason:
            self.down[snap.name] = reason
            self.hellos.pop(snap.name, None)
            self.last_sample.pop(snap.name, None)
            self._add({"t": self.clock(), "n": snap.name, "down": reason})

    def _add(self, record: Record) -> None:
        t = record["t"]
        if self._first is None:
            self._first = t
            for node, link in self.joined.items():  # first: what a replay starting here adds
                self._line({"t": t, "n": node, "k": 1, "join": link})
            for node, why in self.left.items():  # ... and the header's nodes it leaves out
                self._line({"t": t, "n": node, "k": 1, "leave": why})
            for node, hello in self.hellos.items():
                self._line({"t": t, "n": node, "k": 1, "m": hello})
                sample = self.last_sample.get(node)
                if sample is not None:  # what a replay that starts here shows at once
                    self._line({"t": t, "n": node, "k": 1, "m": sample})
            for node, reason in self.down.items():
                self._line({"t": t, "n": node, "k": 1, "down": reason})
            for node, jobs in self.slurm.items():
                if jobs:
                    self._line({"t": t, "n": node, "k": 1, "slurm": jobs})
        self._line(record)
        self._last = t
        if t - self._first >= self.frame_seconds or self._size >= FRAME_BYTES:
            self.flush()

    def _line(self, record: Record) -> None:
        try:
            line = json.dumps(record, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        except ValueError:  # NaN in what an agent sent: JSON cannot carry it back
            line = json.dumps(protocol.sanitize(record), separators=(",", ":")).encode() + b"\n"
        self._lines.append(line)
        self._size += len(line)

    def _tick(self) -> None:
        if self._first is not None and self.clock() - self._first >= self.frame_seconds:
            self.flush()
        if not self.writer.closed:
            self._timer = asyncio.get_running_loop().call_later(self.frame_seconds, self._tick)

    def flush(self) -> None:
        """Write the open frame (if any) to the file."""
        if self._first is None or self.writer.closed:
            return
        self.writer.write_frame(b"".join(self._lines), self._first, self._last)
        self._lines, self._size, self._first = [], 0, None

    def close(self) -> None:
        """Write what is open, the index and the trailer; stop listening to the fleet."""
        self.fleet.unsubscribe(self._on_wire)
        self.fleet.unsubscribe(self._on_snapshot)
        self.fleet.unsubscribe(self._on_removed)
        if self._timer is not None:
            self._timer.cancel()
        self.flush()
        self.writer.close()
        self._ended = self.clock()

    @property
    def seconds(self) -> float:
        """How long the recording ran (so far)."""
        return (self._ended or self.clock()) - self.started


def new_recording_path(folder: Path, clock: Callable[[], float] = time.time) -> Path:
    """A fresh file name in ``folder`` (made 0700): ``gpuctl-YYYYmmdd-HHMMSS.gpurec``."""
    from gpuctl.paths import private_dir

    private_dir(folder)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(clock()))
    path = folder / f"gpuctl-{stamp}{SUFFIX}"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"gpuctl-{stamp}-{n}{SUFFIX}"
    return path
