"""Protocol records every reader builds the same way: a lost GPU's sample, and events."""

import time

from ..protocol import SAMPLE_FIELDS


def lost_record(index, uuid):
    """The sample of a GPU that fell off the bus: every reading null, state "lost"."""
    rec = dict.fromkeys(SAMPLE_FIELDS)
    rec.update({"index": index, "uuid": uuid, "state": "lost", "processes": []})
    return rec


def event(kind, gpu, detail):
    """An ``event`` message of this moment (``kind`` "xid", "gpu_lost", ...)."""
    return {"type": "event", "t": time.time(), "kind": kind, "gpu": gpu, "detail": detail}
