"""Reading a recording: ``RecordingReader``.

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

import bisect
import io
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import zstandard

from gpuctl.fleet.links import STREAM_LIMIT
from gpuctl.fleet.recording.format import (
    FORMAT,
    FRAME,
    FRAME_TAG,
    INDEX_TAG,
    TRAILER,
    TRAILER_TAG,
    VERSION,
    Record,
    RecordingError,
)
from gpuctl.node import protocol

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
# What a frame may inflate to, by its compressed size (issue 38.6: 44 KB of frames of a million
# near-identical lines replayed as 12.8 million rows, a 1.05 GB CSV). The writer's frames
# inflate 12-13 times (the demo; 16 simulated idle nodes). The steadiest it can make, 128 nodes
# of 8 GPUs whose every reading stays the same (only the times move), inflates 749 times and
# holds 1 GPU sample per compressed byte: a repeated line costs zstd about 7 bytes whatever
# its length, so a node of 16 GPUs would inflate about 1,500 times and hold 2 samples a byte.
# The rows bound is the one that holds a replay and its CSV to the file's size (at most 8
# rows a byte; the crafted frames held 290); the bytes bound spares decompressing the rest.
MAX_INFLATION = 8192  # decompressed bytes per compressed byte
MAX_ROWS_PER_BYTE = 8  # records per compressed byte, a sample counting as its GPUs


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
        self._full_told = False  # whether ``admit`` said that it left joined nodes out
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
                kept[name] = _link_kind(n.get("link"))
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

    def admit(self, known: int, rec: Record) -> str | None:
        """The link kind of a node the header does not name that ``rec`` brings in (see
        ``joins``), when ``known`` nodes (the header's and those joined before) leave room
        for it under ``MAX_NODES``; None otherwise (once full, one line in ``problems``)."""
        kind = joins(rec)
        if kind is None:
            return None
        if known >= MAX_NODES:
            if not self._full_told:
                self._full_told = True
                self.problems.append(
                    f"nodes joined the recording past {MAX_NODES} in all: they are left out"
                )
            return None
        return kind

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
        if size > MAX_INFLATION * len(data):
            self._tell(
                i,
                f"{len(data)} bytes that inflate to {size} (more than {MAX_INFLATION} times: "
                "no recording's frame does)",
            )
            return
        junk = 0
        rows, most_rows = 0, MAX_ROWS_PER_BYTE * len(data)
        try:
            for number, line in enumerate(_lines(self._dctx, data), 1):
                if number > MAX_FRAME_LINES:
                    self._tell(i, f"more than {MAX_FRAME_LINES} lines (from line {number} on)")
                    return
                rec = _record(line)
                if rec is not None:
                    rows += _rows(rec)
                    if rows > most_rows:
                        self._tell(
                            i,
                            f"more than {most_rows} GPU samples in {len(data)} bytes (from "
                            f"line {number} on; no recording's frame holds {MAX_ROWS_PER_BYTE} "
                            "a byte)",
                        )
                        return
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


def _rows(rec: Record) -> int:
    """What a record costs a replay and its CSV: a sample one row per GPU, anything else one."""
    msg = rec.get("m")
    gpus = msg.get("gpus") if isinstance(msg, dict) else None
    return max(1, len(gpus)) if isinstance(gpus, list) else 1


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
            or isinstance(rec.get("join"), str)
            or isinstance(rec.get("leave"), str)
        )
    ):
        return None
    return rec


def joins(rec: Record) -> str | None:
    """The link kind of the node ``rec`` brings into a replay when the header does not name it
    (a node added to the fleet while it was recorded): a ``join`` record's, or ``recorded`` for
    the node's hello or link failure (a recording made before joins were written holds only
    those); None for any other record, or for a name no header could hold."""
    if not 0 < len(rec["n"]) <= MAX_NAME:
        return None
    msg = rec.get("m")
    if isinstance(msg, dict):
        return "recorded" if msg.get("type") == "hello" else None
    if "slurm" in rec or "leave" in rec:
        return None
    join = rec.get("join")
    return _link_kind(join) if isinstance(join, str) else "recorded"  # else: a "down"


def _link_kind(value: object) -> str:
    """A node's link kind as a recording names it (the header's, a ``join``'s), checked."""
    return value if isinstance(value, str) and 0 < len(value) <= 32 else "recorded"


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
