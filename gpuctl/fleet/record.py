"""Record the fleet's stream to a file and replay it: ``gpuctl record``, ``R`` in the screen,
``gpuctl replay`` and ``gpuctl replay --export-csv``.

A recording holds what the agents sent (hellos, samples, events), per node, with the time gpuctl
received it, and when a node's link failed (why). File layout (integers big-endian)::

    header   one JSON line: {"format": "gpuctl-recording", "version": 1, "started": t,
             "gpuctl": version, "nodes": [{"name": n, "link": kind}, ...]}
    frames   FRAME (b"GRF1", compressed length u32, first t f64, last t f64) + one zstd frame
             of JSON lines, the records:
               {"t": T, "n": node, "m": message}    a hello, sample or event of the node's agent
               {"t": T, "n": node, "down": reason}  the node's link failed
               {"t": T, "n": node, "slurm": {gpu: [job, user]}}  the Slurm jobs on its GPUs
             A frame starts with keyframe records ("k": 1): each node's current hello and last
             sample (or why it is down) and its Slurm jobs, so that a replay can start at any
             frame.
    index    FRAME (b"GRI1", length, 0, 0) + one zstd frame: JSON [[first t, offset], ...]
    trailer  b"GRECEND1" + the index's offset (u64)

Frames are written whole and flushed, so a recording killed mid-way replays up to its last
complete frame: without the trailer the reader walks the frame headers instead of the index.
A recording is data from outside when it comes back (attached to a ticket): every record is
checked, a frame is decompressed only up to ``MAX_FRAME_BYTES``, and what the agents said goes
through the same ``AgentSession`` as a live node's lines. Nothing in the file is believed before
it is checked, and what it can cost is bounded by the file's size or by the limits below (see
``RecordingReader``): a file that is not a recording is one line (``not a gpuctl recording``);
a damaged index is one line (``damaged index: reading frames in order``) and the frames are read
in order; a frame that cannot be read, or only in part, is one line (``frame N skipped: ...``)
and the rest of the recording replays.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import csv
import io
import json
import os
import re
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import zstandard

from gpuctl.core import wire
from gpuctl.core.model import NodeInfo, NodeSnapshot, NodeState
from gpuctl.core.wire import JsonObject
from gpuctl.fleet.fleet import Fleet
from gpuctl.fleet.links import STREAM_LIMIT, NodeLink
from gpuctl.fleet.session import AgentSession, LinkError, Statics, decode_sample, statics
from gpuctl.node import protocol
from gpuctl.node.metrics import METRICS as REGISTRY

FORMAT = "gpuctl-recording"
VERSION = 1
FRAME = struct.Struct(">4sIdd")
FRAME_TAG = b"GRF1"
INDEX_TAG = b"GRI1"
TRAILER = struct.Struct(">8sQ")
TRAILER_TAG = b"GRECEND1"
FRAME_SECONDS = 10.0  # seek granularity, and the most a killed recording loses
FRAME_BYTES = 8 << 20  # raw bytes that close a frame early (a big fleet)
MAX_FRAME_BYTES = 256 << 20  # a frame that says it is bigger is junk
MAX_HEADER = 4 << 20
# What a reader believes of a file (see RecordingReader): a frame the writer closes at
# FRAME_BYTES holds at most ~300,000 of the smallest records (29 bytes) plus its keyframes, and
# never a line that is not a record; a record is one agent line (at most STREAM_LIMIT) wrapped.
MAX_FRAME_LINES = 1 << 20
MAX_JUNK_LINES = 100  # lines that are not records: the rest of the frame is skipped
MAX_RECORD_LINE = 2 * STREAM_LIMIT
MAX_DEPTH = 32  # nesting of a record (a sample is 5 deep); deeper is junk, not a RecursionError
MAX_TIME = 2.0**36  # seconds (the year 4147): a later frame or record time is junk
MAX_NODES = 4096  # nodes a replay shows (8 x the 512 nodes of benchmarks/tui_load.py)
MAX_NAME = 255  # characters of a node name
RECORDED = ("hello", "sample", "event")
SUFFIX = ".gpurec"
BACKLOG = 600  # messages kept for a node whose session is opening (a fast replay)

Record = dict[str, Any]


class RecordingError(Exception):
    """A file that is not a gpuctl recording, or holds nothing to replay; one line."""


# -- writing ----------------------------------------------------------------------------------
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

    return __version__


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
        with contextlib.suppress(RuntimeError):  # no loop: frames close by size and time only
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(frame_seconds, self._tick)

    def _on_wire(self, node: str, msg: JsonObject) -> None:
        kind = msg.get("type")
        if kind not in RECORDED:
            return
        if kind == "hello":
            self.hellos[node] = msg
            self.last_sample.pop(node, None)
            self.down.pop(node, None)
        elif kind == "sample":
            self.samples += 1
            self.last_sample[node] = msg
        self._add({"t": self.clock(), "n": node, "m": msg})

    def _on_snapshot(self, snap: NodeSnapshot) -> None:
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
        if self._timer is not None:
            self._timer.cancel()
        self.flush()
        self.writer.close()
        self._ended = self.clock()

    @property
    def seconds(self) -> float:
        """How long the recording ran (so far)."""
        return (self._ended or self.clock()) - self.started


SlurmJobs = dict[str, list[str | None]]  # GPU index (as text) -> [job, user]


def slurm_jobs(snap: NodeSnapshot) -> SlurmJobs:
    """The Slurm job and user on each of a node's GPUs, as a recording keeps them."""
    return {
        str(gpu): [notes.get("slurm_job"), notes.get("slurm_user")]
        for gpu, notes in sorted(snap.annotations.items())
        if notes.get("slurm_job") is not None or notes.get("slurm_user") is not None
    }


def read_slurm_jobs(value: object) -> dict[int, tuple[str | None, str | None]]:
    """A ``slurm`` record's jobs, checked: GPU index -> (job, user); junk is left out."""
    out: dict[int, tuple[str | None, str | None]] = {}
    for gpu, pair in (value if isinstance(value, dict) else {}).items():
        if (
            isinstance(gpu, str)
            and gpu.isdigit()
            and isinstance(pair, list)
            and len(pair) == 2
            and all(v is None or isinstance(v, str) for v in pair)
        ):
            out[int(gpu)] = (pair[0], pair[1])
    return out


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


# -- reading ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Frame:
    """Where one frame lies in the file and the stream time it covers."""

    offset: int
    length: int
    t_first: float
    t_last: float


class RecordingReader:
    """A recording opened for reading: its header, frames (complete ones only) and records.

    Everything in the file is checked before it is believed, and the work it can cause is
    bounded by the file's own size or by the limits below: the index must name distinct frames
    in order inside the file (else the frames are read in order, ``damaged``); a frame is
    read line by line as it is decompressed, and left at its first overlong line, after
    ``MAX_FRAME_LINES`` lines or ``MAX_JUNK_LINES`` lines that are not records; the header's
    nodes are at most ``MAX_NODES``. What was left out is one line each in ``problems``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Open ``path``; raises RecordingError (not a recording, nothing in it) or OSError."""
        self.path = Path(path)
        self.file: IO[bytes] = open(path, "rb")  # noqa: SIM115 - closed by close()
        self.problems: list[str] = []  # what could not be read, one line each (see ``_tell``)
        self.damaged: str | None = None  # why the index was not used, when it was damaged
        self._told: set[int] = set()  # the frames whose problem is in ``problems``
        try:
            self._read_header()
            self.size = os.fstat(self.file.fileno()).st_size
            try:
                frames = self._from_index()
            except DamagedIndex as e:
                self.damaged = str(e)
                frames = None
            self.complete = frames is not None
            self.frames = frames if frames is not None else self._scan()
        except BaseException:
            self.file.close()
            raise
        if not self.frames:
            self.file.close()
            raise RecordingError(f"{path}: the recording holds no complete frame yet")
        self._dctx = zstandard.ZstdDecompressor()

    def _read_header(self) -> None:
        line = self.file.readline(MAX_HEADER)
        try:
            header = protocol.parse_json(line)  # guarded: long numbers, deep nesting
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise RecordingError(f"{self.path} is not a gpuctl recording")
        if header.get("version") != VERSION:
            raise RecordingError(
                f"{self.path}: recording format version {header.get('version')!r:.40}; this "
                f"gpuctl reads version {VERSION}"
            )
        self.nodes: list[tuple[str, str]] = self._header_nodes(header.get("nodes"))
        started = header.get("started")
        self.started = float(started) if isinstance(started, int | float) else 0.0
        self.data_start = self.file.tell()

    def _header_nodes(self, nodes: object) -> list[tuple[str, str]]:
        """The header's (node, link kind), checked: each name once, at most ``MAX_NODES`` (a
        header of 100,000 names had the screen build 100,000 nodes: 34 s and 585 MB)."""
        kept: dict[str, str] = {}
        named = 0
        for n in nodes if isinstance(nodes, list) else []:
            name = n.get("name") if isinstance(n, dict) else None
            if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or name in kept:
                continue
            named += 1
            if len(kept) < MAX_NODES:
                link = n.get("link")
                kept[name] = link if isinstance(link, str) and 0 < len(link) <= 32 else "recorded"
        if named > MAX_NODES:
            self.problems.append(
                f"the recording names {named} nodes: replaying the first {MAX_NODES}"
            )
        return list(kept.items())

    def _from_index(self) -> list[Frame] | None:
        """The frames the index names; None without a trailer (a recording cut short).

        Raises DamagedIndex when the trailer is there but the index is not believable: it must
        name distinct frames at increasing offsets between the header and itself, so it has no
        more entries than that room holds, and it is read one entry at a time as it is
        decompressed (an index naming one frame 4.8 million times was 5 KB of zstd: parsed
        whole and each entry read again, it cost 1.3 GB and 34 s).
        """
        if self.size < self.data_start + TRAILER.size:
            return None
        self.file.seek(self.size - TRAILER.size)
        tag, offset = TRAILER.unpack(self.file.read(TRAILER.size))
        if tag != TRAILER_TAG:
            return None
        index_end = self.size - TRAILER.size
        if not self.data_start <= offset <= index_end - FRAME.size:
            raise DamagedIndex("the trailer points outside the file")
        self.file.seek(offset)
        itag, length, _, _ = FRAME.unpack(self.file.read(FRAME.size))
        if itag != INDEX_TAG or offset + FRAME.size + length != index_end:
            raise DamagedIndex("no index where the trailer points")
        room = (offset - self.data_start) // FRAME.size  # frames that fit before the index
        frames: list[Frame] = []
        end = self.data_start  # where the last frame named ends: the next must start there on
        for at in _index_offsets(self.file.read(length)):
            if len(frames) >= room:
                raise DamagedIndex(f"more entries than the {offset} bytes of frames can hold")
            if at < end:
                before = "the frame before it" if frames else "the header"
                raise DamagedIndex(f"entry {len(frames) + 1} is not after {before}")
            frame = self._frame_at_offset(at, offset)
            if frame is None:
                raise DamagedIndex(f"entry {len(frames) + 1} names no frame")
            frames.append(frame)
            end = at + FRAME.size + frame.length
        return frames

    def _frame_at_offset(self, offset: int, end: int) -> Frame | None:
        """The frame whose head is at ``offset``, when it is one and lies before ``end``."""
        if not self.data_start <= offset <= end - FRAME.size:
            return None
        self.file.seek(offset)
        head = self.file.read(FRAME.size)
        if len(head) < FRAME.size:
            return None
        tag, length, t_first, t_last = FRAME.unpack(head)
        if (
            tag != FRAME_TAG
            or offset + FRAME.size + length > end
            or not (_in_time(t_first) and _in_time(t_last) and t_first <= t_last)
        ):
            return None
        return Frame(offset, length, t_first, t_last)

    def _scan(self) -> list[Frame]:
        frames: list[Frame] = []
        offset = self.data_start
        while (frame := self._frame_at_offset(offset, self.size)) is not None:
            frames.append(frame)
            offset = frame.offset + FRAME.size + frame.length
        return frames

    def close(self) -> None:
        self.file.close()

    @property
    def start(self) -> float:
        """Stream time of the first record."""
        return self.frames[0].t_first

    @property
    def end(self) -> float:
        """Stream time of the last record."""
        return self.frames[-1].t_last

    def frame_index(self, t: float) -> int:
        """The frame to start from to see the stream at time ``t``."""
        firsts = [f.t_first for f in self.frames]
        return max(0, bisect.bisect_right(firsts, t) - 1)

    def read_frame(self, i: int) -> Iterator[Record]:
        """Frame ``i``'s records, checked, as they are decompressed; a damaged or hostile frame
        gives what could be read of it and says why the rest was skipped (``problems``).

        Bounded in work as well as in size: 5.8 KB of zstd inflating to 64 MiB of tiny lines
        took 62 s and 363 MB when the frame was split whole and every line parsed.
        """
        frame = self.frames[i]
        self.file.seek(frame.offset + FRAME.size)
        data = self.file.read(frame.length)
        try:
            size = zstandard.frame_content_size(data)
        except zstandard.ZstdError:  # not a zstd frame at all
            size = -1
        if not 0 <= size <= MAX_FRAME_BYTES:
            self._tell(i, f"not a zstd frame of a known size up to {MAX_FRAME_BYTES >> 20} MiB")
            return
        junk = 0
        try:
            for number, line in enumerate(_lines(self._dctx, data), 1):
                if number > MAX_FRAME_LINES:
                    self._tell(i, f"more than {MAX_FRAME_LINES} lines (from line {number} on)")
                    return
                rec = _record(line)
                if rec is not None:
                    yield rec
                    continue
                junk += 1
                if junk >= MAX_JUNK_LINES:
                    self._tell(i, f"{junk} of its first {number} lines are not records")
                    return
        except _Skip as e:
            self._tell(i, str(e))

    def records(self, first_frame: int = 0) -> Iterator[tuple[int, Record]]:
        """(frame number, record) from ``first_frame`` on, in order."""
        for i in range(first_frame, len(self.frames)):
            for rec in self.read_frame(i):
                yield i, rec

    def _tell(self, i: int, why: str) -> None:
        """Keep one line about frame ``i`` (numbered from 1 for the user), once per frame."""
        if i not in self._told:
            self._told.add(i)
            self.problems.append(f"frame {i + 1} skipped: {why}")


class DamagedIndex(Exception):
    """The trailer is there but the index it points to is not believable; one line why."""


class _Skip(Exception):
    """The rest of a frame cannot be read; one line why."""


def _index_offsets(data: bytes) -> Iterator[int]:
    """The frame offsets of an index (zstd of JSON ``[[first t, offset], ...]``), one entry at a
    time as it is decompressed: flat entries matched by a pattern, never parsed whole (no
    nesting, no list of millions). Raises DamagedIndex at the first thing that is not one."""
    stream = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data))
    buf, at, eof = b"", 0, False
    opened = False
    while True:
        if not eof and len(buf) - at < 4096:  # an entry is < 100 bytes: never cut when matched
            try:
                chunk = stream.read(1 << 16)
            except zstandard.ZstdError:
                raise DamagedIndex("the index is not zstd data") from None
            buf, at, eof = buf[at:] + chunk, 0, not chunk
        if not opened:
            m = _INDEX_OPEN.match(buf, at)
            if m is None:
                raise DamagedIndex("the index is not a list")
            opened, at = True, m.end()
            if m[1]:  # "[]": no frames
                break
            continue
        m = _INDEX_ENTRY.match(buf, at)
        if m is None:
            raise DamagedIndex("the index holds something other than [time, offset] entries")
        yield int(m[1])
        at = m.end()
        if m[2] == b"]":
            break
    if buf[at:].strip() or stream.read(4096).strip():
        raise DamagedIndex("the index goes on after its end")


_INDEX_OPEN = re.compile(rb"\s*\[(\s*\])?")
_INDEX_ENTRY = re.compile(
    rb"\s*\[\s*-?\d{1,30}(?:\.\d{1,30})?(?:[eE][-+]?\d{1,4})?\s*,\s*(\d{1,20})\s*\]\s*([,\]])"
)


def _lines(dctx: zstandard.ZstdDecompressor, data: bytes) -> Iterator[bytes]:
    """The lines of one zstd frame as it is decompressed, never more than ``MAX_FRAME_BYTES``
    in all; raises _Skip at a line longer than ``MAX_RECORD_LINE`` or at damaged data."""
    stream = dctx.stream_reader(io.BytesIO(data))
    pieces: list[bytes] = []  # the line being read, in pieces (joined once, at its end)
    held = 0
    total = 0
    while True:
        try:
            chunk = stream.read(1 << 16)
        except zstandard.ZstdError:
            raise _Skip("damaged zstd data") from None
        total += len(chunk)
        if total > MAX_FRAME_BYTES:
            raise _Skip(f"more than {MAX_FRAME_BYTES >> 20} MiB")
        if not chunk:
            break
        if b"\n" not in chunk:
            pieces.append(chunk)
            held += len(chunk)
        else:
            lines = chunk.split(b"\n")
            lines[0] = b"".join([*pieces, lines[0]])
            last = lines.pop()
            for line in lines:
                if len(line) > MAX_RECORD_LINE:
                    raise _Skip(f"a line of more than {MAX_RECORD_LINE} bytes")
                yield line
            pieces, held = [last], len(last)
        if held > MAX_RECORD_LINE:
            raise _Skip(f"a line of more than {MAX_RECORD_LINE} bytes")
    if held:
        yield b"".join(pieces)


def _record(line: bytes) -> Record | None:
    """One line of a frame as a record, or None when it is not one: JSON (guarded: long
    numbers) of a node, a time and what happened, nested no deeper than ``MAX_DEPTH`` (a
    message replayed goes through encoders and decoders that recurse)."""
    if not _shallow(line, MAX_DEPTH):
        return None
    try:
        rec = protocol.parse_json(line)
    except ValueError:
        return None
    if not (
        isinstance(rec, dict)
        and isinstance(rec.get("n"), str)
        and isinstance(rec.get("t"), int | float)
        and _in_time(rec["t"])
        and (
            isinstance(rec.get("m"), dict)
            or isinstance(rec.get("down"), str)
            or isinstance(rec.get("slurm"), dict)
        )
    ):
        return None
    return rec


def _shallow(line: bytes, depth: int) -> bool:
    """True when the JSON text ``line`` nests lists and objects no deeper than ``depth`` (or
    is no JSON: the parser says so). On the text, with C-speed steps only (a walk of the parsed
    value in Python cost twice the parse): the strings taken out, the brackets kept, then
    innermost pairs removed ``depth`` times; what is left is deeper."""
    if line.count(b"[") + line.count(b"{") <= depth:
        return True
    # Without a backslash (no escaped quote) every other piece between quotes is a string.
    escaped = b"\\" in line
    text = _JSON_STRING.sub(b"", line) if escaped else b"".join(line.split(b'"')[::2])
    text = text.translate(None, _NOT_BRACKETS)
    for _ in range(depth):
        if not text:
            return True
        text = _BRACKET_PAIR.sub(b"", text)
    return not text


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_PAIR = re.compile(rb"\[\]|\{\}")


def _in_time(t: float) -> bool:
    """A time a recording can hold: the clock's seconds, from 1970 to ``MAX_TIME`` (a frame
    at 1e300 s would fail every conversion to a date)."""
    return 0 <= t <= MAX_TIME


# -- replaying --------------------------------------------------------------------------------
class RecordedLink(NodeLink):
    """A replayed node: its agent's messages come from the recording, as the replay plays."""

    holds_files = False  # no process, no connection: no `ulimit -n` advice for a replay

    def __init__(self, replayer: Replayer, name: str, kind: str) -> None:
        self.replayer = replayer
        self.name = name
        self.kind = kind

    async def open(self) -> AgentSession:
        return await self.replayer.open_session(self.name)

    def describe(self) -> str:
        return f"recorded {self.kind}"


class _Discard:
    """The request side of a replayed node: requests go nowhere."""

    def write(self, data: bytes | str) -> None:
        pass


class Replayer:
    """Plays a recording into a fleet of ``RecordedLink`` nodes on a clock of recorded time.

    ``now()`` is the recorded time shown: it runs ``speed`` times as fast as the wall clock,
    stops at the end and while paused. ``seek(t)`` jumps: every node reconnects with its hello
    and its last sample as of ``t``. Call ``fleet()`` once, then run ``play()`` as a task.
    """

    def __init__(
        self,
        reader: RecordingReader,
        *,
        speed: float = 1.0,
        start: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader = reader
        self.speed = speed
        self.monotonic = monotonic
        self.paused = False
        self.links = {n: RecordedLink(self, n, kind) for n, kind in reader.nodes}
        self.hellos: dict[str, JsonObject] = {}
        self.down: dict[str, str] = {}
        self.last_sample: dict[str, JsonObject] = {}
        self.slurm: dict[str, dict[int, tuple[str | None, str | None]]] = {}
        self.readers: dict[str, asyncio.StreamReader] = {}
        self.samples_played = 0
        self._fleet: Fleet | None = None
        self._reconnecting: set[str] = set()
        self._arrived: dict[str, asyncio.Event] = {}
        # What a node's agent said after its hello while its session was being opened.
        self._backlog: dict[str, list[JsonObject]] = {}
        self._again: set[str] = set()
        self._changed = asyncio.Event()
        self._base_t = reader.start
        self._base_mono = monotonic()
        self._pending: list[Record] = []
        self._records: Iterator[tuple[int, Record]] = iter(())
        self._position(reader.start if start is None else start)

    # -- the clock --------------------------------------------------------------------------
    def now(self) -> float:
        """The recorded time the replay stands at."""
        if self.paused:
            return self._base_t
        t = self._base_t + (self.monotonic() - self._base_mono) * self.speed
        return min(t, self.reader.end)

    @property
    def ended(self) -> bool:
        return self.now() >= self.reader.end and not self._pending

    def set_speed(self, speed: float) -> None:
        self._rebase()
        self.speed = max(0.01, min(speed, 1e6))
        self._changed.set()

    def toggle_pause(self) -> None:
        self._rebase()
        self.paused = not self.paused
        self._changed.set()

    def _rebase(self) -> None:
        self._base_t = self.now()
        self._base_mono = self.monotonic()

    # -- the fleet --------------------------------------------------------------------------
    def fleet(self, **kwargs: Any) -> Fleet:
        """The fleet of replayed nodes, on the replay's clock (no pings: nobody answers)."""
        kwargs.setdefault("backoff_base", 0.5)
        kwargs.setdefault("connect_timeout", 1e9)  # a node not yet seen waits for its hello
        kwargs.setdefault("backoff_max", 2.0)
        self._fleet = Fleet(self.links, clock=self.now, liveness_timeout=0, **kwargs)
        for name in self.links:
            self._annotate(name)
        return self._fleet

    def _annotate(self, name: str) -> None:
        """Give node ``name``'s GPUs the Slurm jobs the recording has for them now."""
        fleet = self._fleet
        if fleet is None:
            return
        want = self.slurm.get(name, {})
        have = fleet.snapshot(name).annotations
        held = {g for g, notes in have.items() if "slurm_job" in notes or "slurm_user" in notes}
        for gpu in sorted(set(want) | held):
            job, user = want.get(gpu, (None, None))
            fleet.annotate(name, gpu, slurm_job=job, slurm_user=user)

    async def open_session(self, name: str) -> AgentSession:
        """A session for node ``name`` as the recording has it now (a hello, its last sample).

        Raises LinkError with the recorded reason when the node was down then. A node the
        recording has not reached yet stays connecting: its hello (or a seek) reconnects it.
        """
        while (hello := self.hellos.get(name)) is None:
            why = self.down.get(name)
            if why is not None:
                reason, _, message = why.partition(": ")
                raise LinkError(reason, message or reason)
            await self._arrived.setdefault(name, asyncio.Event()).wait()
        reader = asyncio.StreamReader(limit=STREAM_LIMIT)
        self._feed(reader, hello)
        for msg in self._backlog.pop(name, ()):
            self._feed(reader, msg)
        old = self.readers.get(name)
        if old is not None:
            old.feed_eof()
        self.readers[name] = reader

        async def close() -> None:
            reader.feed_eof()
            if self.readers.get(name) is reader:
                del self.readers[name]

        return AgentSession(reader, _Discard(), close=close)

    @staticmethod
    def _feed(reader: asyncio.StreamReader, msg: JsonObject) -> None:
        with contextlib.suppress(ValueError, TypeError):  # junk in a file: skip the line
            reader.feed_data(protocol.encode(msg))

    # -- position ---------------------------------------------------------------------------
    def _position(self, t: float) -> None:
        """Stand at time ``t``: the state of every node then, records after it pending."""
        t = max(self.reader.start, min(t, self.reader.end))
        self.hellos.clear()
        self.down.clear()
        self.last_sample.clear()
        self.slurm.clear()
        first = self.reader.frame_index(t)
        self._records = self.reader.records(first)
        self._pending = []
        for i, rec in self._records:
            if rec.get("k"):  # the state at a frame's start: only the first frame's is ours
                if i == first:
                    self._apply_state(rec)
                continue
            if rec["t"] > t:
                self._pending = [rec]
                break
            self._apply_state(rec)
        self._backlog = {n: [m] for n, m in self.last_sample.items()}
        self._base_t = t
        self._base_mono = self.monotonic()

    def _apply_state(self, rec: Record) -> None:
        """Keep what a record says about its node, without feeding any session."""
        node = rec["n"]
        if node not in self.links:  # not a node of the header: kept nowhere (unbounded)
            return
        arrived = self._arrived.pop(node, None)
        if arrived is not None:
            arrived.set()  # a node waiting in open_session: its hello (or its failure) is here
        msg = rec.get("m")
        if isinstance(msg, dict):
            kind = msg.get("type")
            if kind == "hello":
                self.hellos[node] = msg
                self.down.pop(node, None)
                self.last_sample.pop(node, None)
            elif kind == "sample":
                self.last_sample[node] = msg
        elif "slurm" in rec:
            self.slurm[node] = read_slurm_jobs(rec["slurm"])
        else:
            self.down[node] = str(rec.get("down"))
            self.hellos.pop(node, None)
            self.last_sample.pop(node, None)

    def seek(self, t: float) -> None:
        """Jump to recorded time ``t`` (clamped to the recording): each node reconnects as it
        stood then, with its history dropped."""
        before = dict(self.hellos)
        self._position(t)
        fleet = self._fleet
        if fleet is not None:
            for name in self.links:
                fleet.forget_history(name)
                self._annotate(name)
                reader = self.readers.get(name)
                hello = self.hellos.get(name)
                if reader is not None and hello is not None and hello == before.get(name):
                    # the same agent then as now: its stream goes on from the sample at ``t``
                    sample = self.last_sample.get(name)
                    if sample is not None:
                        self._feed(reader, sample)
                elif reader is not None:
                    self._reconnect(name)  # another agent then (or none): a new session
                else:
                    # Waiting for a hello (woken by ``_position`` when it has one) or backing
                    # off after a failure: cut that short. Never a cancel here: asyncio's
                    # wait_for can lose a cancellation that meets its inner task's end.
                    fleet.nodes[name].wake.set()
        self._changed.set()

    def _reconnect(self, name: str) -> None:
        """Have the fleet open node ``name`` again, one reconnect at a time (a burst of seeks
        must not leave two tasks streaming one node)."""
        if name in self._reconnecting:
            self._again.add(name)
            return
        self._reconnecting.add(name)
        task = asyncio.get_running_loop().create_task(self._reconnect_loop(name))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _reconnect_loop(self, name: str) -> None:
        try:
            while self._fleet is not None:
                self._again.discard(name)
                await self._fleet.reconnect(name)
                if name not in self._again:
                    return
        finally:
            self._reconnecting.discard(name)

    # -- playing ----------------------------------------------------------------------------
    async def play(self) -> None:
        """Feed the records to the nodes as the clock reaches them; runs until cancelled."""
        played = 0
        while True:
            rec = self._next()
            if rec is None:
                await self._wait(None)  # the end: wait for a seek
                continue
            wait = rec["t"] - self.now()
            if wait > 0:
                self._pending.insert(0, rec)
                # a timer on the replay's clock; a seek, pause or new speed cuts it short
                await self._wait(None if self.paused else wait / self.speed)
                continue
            self._play(rec)
            played += 1
            if played % 256 == 0:
                await asyncio.sleep(0)  # let the fleet read what was fed at a high speed

    def _next(self) -> Record | None:
        if self._pending:
            return self._pending.pop(0)
        for _i, rec in self._records:
            if not rec.get("k"):
                return rec
        return None

    async def _wait(self, timeout: float | None) -> None:
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def _play(self, rec: Record) -> None:
        node = rec["n"]
        if node not in self.links:
            return
        msg = rec.get("m")
        was_up = node in self.hellos
        self._apply_state(rec)
        fleet = self._fleet
        if isinstance(msg, dict) and msg.get("type") == "hello":
            self._backlog[node] = []
            streaming = self.readers.pop(node, None) is not None
            if fleet is not None and streaming:  # a new agent on a streaming node: reconnect
                self._reconnect(node)
            elif fleet is not None:  # a node that was down: cut its backoff short
                fleet.nodes[node].wake.set()
            return
        if "slurm" in rec:
            self._annotate(node)
            return
        if not isinstance(msg, dict):  # the link failed: end the node's stream
            self._backlog.pop(node, None)
            reader = self.readers.pop(node, None)
            if reader is not None and was_up:
                reader.feed_eof()
            return
        reader = self.readers.get(node)
        if reader is not None:
            self._feed(reader, msg)
        elif node in self.hellos:  # its session is opening: it gets these first
            backlog = self._backlog.setdefault(node, [])
            backlog.append(msg)
            del backlog[:-BACKLOG]
        if msg.get("type") == "sample":
            self.samples_played += 1


def parse_position(text: str, reader: RecordingReader) -> float:
    """``--from``: seconds into the recording (``90``, ``90s``, ``5m``, ``1h2m3s``), a clock time
    (``03:12``, ``03:12:30``: the first such moment of the recording, local time) or a date and
    time (``2026-11-24T03:12:30``). Raises ValueError with one line."""
    from datetime import datetime, timedelta

    text = text.strip()
    offset = parse_duration(text, allow_zero=True)
    if offset is not None:
        return reader.start + offset
    span = f"the recording runs from {format_time(reader.start)} to {format_time(reader.end)}"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        when = None
    if when is not None:
        return when.timestamp()
    parts = text.split(":")
    if 2 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
        h, m, s = (int(p) for p in (*parts, "0")[:3])
        if h < 24 and m < 60 and s < 60:
            day = datetime.fromtimestamp(reader.start).replace(hour=h, minute=m, second=s)
            while day.timestamp() < reader.start - 1:
                day += timedelta(days=1)
            return day.timestamp()
    raise ValueError(
        f"--from {text!r}: give seconds into the recording (90, 5m), a time (03:12) or a date "
        f"and time (2026-11-24T03:12); {span}"
    )


def parse_duration(text: str, *, allow_zero: bool = False) -> float | None:
    """``90``, ``+90``, ``90s``, ``1.5m``, ``2h``, ``1h2m3s`` as seconds (``protocol``'s one
    duration grammar); None when ``text`` is not one, or is zero unless ``allow_zero``."""
    from gpuctl.node.protocol import parse_seconds

    value = parse_seconds(text.removeprefix("+"))
    if value is None or (value == 0 and not allow_zero):
        return None
    return value


def format_time(t: float) -> str:
    """A recorded time as the screen and the CSV show it: local date and time."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


# -- CSV --------------------------------------------------------------------------------------
# Who and when, the registry's readings flagged "csv" (named by their wire key, in the
# registry's order: ``gpuctl/node/metrics.py``), then the structured fields and the job.
CSV_HEAD = ("time", "t", "node", "gpu", "uuid", "model", "state")
CSV_READINGS = tuple(m.key for m in REGISTRY if "csv" in m.flags)
CSV_TAIL = (
    "throttle",
    "ecc_volatile_corrected",
    "ecc_volatile_uncorrected",
    "ecc_aggregate_corrected",
    "ecc_aggregate_uncorrected",
    "remapped_correctable",
    "remapped_uncorrectable",
    "processes",
    "slurm_job",
    "slurm_user",
)
CSV_COLUMNS = CSV_HEAD + CSV_READINGS + CSV_TAIL


def _cell(value: object) -> object:
    """A cell as a spreadsheet should take it: a node's text never becomes a formula."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return "" if value is None else value


def _iso(t: float) -> str:
    """``t`` as an ISO date in UTC; empty for a time no date can hold (a sample's own time is
    what its agent said, never checked)."""
    try:
        ms = round(t * 1000)
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"
    except (OverflowError, ValueError, OSError):
        return ""


def export_csv(reader: RecordingReader, out: IO[str], *, start: float | None = None) -> int:
    """Write one row per node x GPU x sample (from ``start`` on) to ``out``; returns the rows."""
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    models: dict[str, dict[int, str]] = {}
    hellos: dict[str, Statics | None] = {}  # what each node's samples leave to its hello
    jobs: dict[str, dict[int, tuple[str | None, str | None]]] = {}
    rows = 0
    first = reader.frame_index(start) if start is not None else 0
    nodes = {name for name, _kind in reader.nodes}
    for _i, rec in reader.records(first):
        msg = rec.get("m")
        node = rec["n"]
        if node not in nodes:  # not in the header: not replayed either, nor kept (unbounded)
            continue
        if "slurm" in rec:
            jobs[node] = read_slurm_jobs(rec["slurm"])
        if not isinstance(msg, dict):
            continue
        if msg.get("type") == "hello":
            hellos[node] = statics(wire.lenient(NodeInfo, msg) or NodeInfo())
            gpus = msg.get("gpus")
            models[node] = {
                g["index"]: g["name"]
                for g in (gpus if isinstance(gpus, list) else [])
                if isinstance(g, dict)
                and isinstance(g.get("index"), int)
                and isinstance(g.get("name"), str)
            }
            continue
        if rec.get("k") or msg.get("type") != "sample":
            continue
        sample = decode_sample(msg, hellos.get(node))
        if start is not None and rec["t"] < start:
            continue
        for g in sample.gpus:
            ecc = g.ecc or {}
            rows_ = g.remapped_rows or {}
            job, user = jobs.get(node, {}).get(g.index, (None, None))
            row = {
                "time": _iso(g.t),
                "t": f"{g.t:.3f}",
                "node": node,
                "gpu": g.index,
                "uuid": g.uuid,
                "model": models.get(node, {}).get(g.index),
                "state": "lost" if g.lost else "ok",
                **{key: getattr(g, key) for key in CSV_READINGS},
                "throttle": "|".join(g.throttle) if g.throttle is not None else None,
                "ecc_volatile_corrected": ecc.get("volatile_corrected"),
                "ecc_volatile_uncorrected": ecc.get("volatile_uncorrected"),
                "ecc_aggregate_corrected": ecc.get("aggregate_corrected"),
                "ecc_aggregate_uncorrected": ecc.get("aggregate_uncorrected"),
                "remapped_correctable": rows_.get("correctable"),
                "remapped_uncorrectable": rows_.get("uncorrectable"),
                "processes": len(g.processes),
                "slurm_job": job,
                "slurm_user": user,
            }
            writer.writerow([_cell(row[c]) for c in CSV_COLUMNS])  # by name: no column drifts
            rows += 1
    return rows
