"""Protocol records every reader builds the same way: a lost GPU's sample, and events."""

from typing import TYPE_CHECKING, Any, Dict, Optional

from ..protocol import SAMPLE_FIELDS, event_message

if TYPE_CHECKING:
    from ..messages import EventMessage


def lost_record(index: int, uuid: Optional[str]) -> Dict[str, Any]:
    """The sample of a GPU that fell off the bus: every reading null, state "lost"."""
    rec = dict.fromkeys(SAMPLE_FIELDS)  # type: Dict[str, Any]
    rec.update({"index": index, "uuid": uuid, "state": "lost", "processes": []})
    return rec


def event(kind: str, gpu: Optional[int], detail: Dict[str, Any]) -> "EventMessage":
    """An ``event`` message of this moment (``kind`` "xid", "gpu_lost", ...)."""
    return event_message(kind, gpu, detail)
