"""The file format of a recording.

A recording holds what the agents sent (hellos, samples, events), per node, with the time gpuctl
received it, and when a node's link failed (why). File layout (integers big-endian)::

    header   one JSON line: {"format": "gpuctl-recording", "version": 1, "started": t,
             "gpuctl": version, "nodes": [{"name": n, "link": kind}, ...]}
    frames   FRAME (b"GRF1", compressed length u32, first t f64, last t f64) + one zstd frame
             of JSON lines, the records:
               {"t": T, "n": node, "m": message}    a hello, sample or event of the node's agent
               {"t": T, "n": node, "down": reason}  the node's link failed
               {"t": T, "n": node, "slurm": {gpu: [job, user]}}  the Slurm jobs on its GPUs
               {"t": T, "n": node, "join": link}  a node the header does not name joined the
                                                  fleet (reached by ``link``: its kind)
               {"t": T, "n": node, "leave": why}  the node left the fleet (a host gone from
                                                  the site's Prometheus); no ``down`` comes
                                                  before it (its link did not fail; an older
                                                  recording's down there replays as before)
             A frame starts with keyframe records ("k": 1): the nodes joined since the header,
             each node's current hello and last sample (or why it is down) and its Slurm jobs,
             so that a replay can start at any frame.
    index    FRAME (b"GRI1", length, 0, 0) + one zstd frame: JSON [[first t, offset], ...]
    trailer  b"GRECEND1" + the index's offset (u64)
"""

from __future__ import annotations

import struct
from typing import Any

from gpuctl.core.model import NodeSnapshot

FORMAT = "gpuctl-recording"
VERSION = 1
FRAME = struct.Struct(">4sIdd")
FRAME_TAG = b"GRF1"
INDEX_TAG = b"GRI1"
TRAILER = struct.Struct(">8sQ")
TRAILER_TAG = b"GRECEND1"
SUFFIX = ".gpurec"

Record = dict[str, Any]


class RecordingError(Exception):
    """A file that is not a gpuctl recording, or holds nothing to replay; one line."""


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
