"""GPU readers: NVML (pynvml), else nvidia-smi CSV, else a clear reason why neither works.

A reader is an object with:
    name                     "nvml" | "nvidia-smi" | "simulated"
    versions() -> dict       {"driver", "cuda", "nvml"}: version strings or None
    static() -> list         static facts per GPU (protocol.STATIC_FIELDS)
    sample(slow) -> list     one dict per GPU (protocol.SAMPLE_FIELDS); slow=True also reads the
                             slow fields (ECC, retired pages, remapped rows), else repeats them
    events() -> list         event messages seen since the last call (XID, GPU lost)
    parents() -> list        ancestors of the last sample's GPU processes (pid, ppid, uid, user,
                             command, started): the sample's ``parents``
    host() -> dict           the host's CPU, memory, load and network: the sample's ``host``
    signal(pid, name, started) -> (code, message)   the ``signal`` request (procs.signal_process)
    close()
``Reader`` spells that out; the three readers derive from it.
"""

from typing import List, Optional, Tuple

from .base import Reader, ReaderUnavailable

__all__ = ["Reader", "ReaderUnavailable", "open_reader"]


def open_reader(simulate: Optional[str] = None,
                seed: int = 0) -> Tuple[Optional[Reader], Optional[str]]:
    """Return ``(reader, note)`` for the first reader that works, else ``(None, reason)``.

    ``note`` is None for NVML and the simulated reader; for the nvidia-smi fallback it says why
    NVML is not used ("NVML: nvmlInit failed: ..."), so the user sees why a node is on it.

    ``simulate`` ("8" or "8:H100" or "2:A100,2:H100") selects the simulated reader instead.
    """
    if simulate:
        from .sim import SimReader

        return SimReader.from_spec(simulate, seed=seed), None
    reasons = []  # type: List[str]
    try:
        from .nvml import NvmlReader

        return NvmlReader.open(), None
    except ReaderUnavailable as e:
        reasons.append("NVML: %s" % e)
    except ImportError as e:  # the nvml module itself is missing from an old bundle
        reasons.append("NVML: %s" % e)
    try:
        from .smi import SmiReader

        return SmiReader.open(), "; ".join(reasons)
    except ReaderUnavailable as e:
        reasons.append("nvidia-smi: %s" % e)
    except ImportError as e:
        reasons.append("nvidia-smi: %s" % e)
    return None, "no NVIDIA driver found (%s)" % "; ".join(reasons)
