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

from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

if TYPE_CHECKING:
    from ..messages import EventMessage


class ReaderUnavailable(Exception):
    """This reader cannot run here; the message says why in one line."""


class Reader(object):
    """What the agent needs of a GPU reader (see the module docstring)."""

    name = "?"

    def versions(self) -> Dict[str, Optional[str]]:
        """``{"driver", "cuda", "nvml"}``: version strings or None."""
        raise NotImplementedError

    def static(self) -> List[Dict[str, Any]]:
        """Static facts per GPU (``protocol.STATIC_FIELDS``)."""
        raise NotImplementedError

    def sample(self, slow: bool = True) -> List[Dict[str, Any]]:
        """One dict per GPU (``protocol.SAMPLE_FIELDS``); ``slow`` also reads the slow fields."""
        raise NotImplementedError

    def events(self) -> List["EventMessage"]:
        """Event messages seen since the last call (XID, GPU lost)."""
        raise NotImplementedError

    def parents(self) -> List[Dict[str, Any]]:
        """Ancestors of the last sample's GPU processes; none by default."""
        return []

    def signal(self, pid: Any, name: Any, gpu_pids: Iterable[int],
               started: Any = None) -> Tuple[Optional[str], str]:
        """Send SIGTERM/SIGKILL to a GPU process of this node's user: ``(None, what was done)``
        or ``(error code, why not)`` (see ``procs.signal_process``)."""
        from .procs import signal_process

        return signal_process(pid, name, gpu_pids, started)

    def host(self) -> Optional[Dict[str, Any]]:
        """This node's host CPU, memory, load and network (``host.HostStats``), or None."""
        stats = getattr(self, "_host_stats", None)
        if stats is None:
            from .host import HostStats

            stats = self._host_stats = HostStats()
        return stats.sample()

    def close(self) -> None:
        """Release the driver."""


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
