"""What every GPU reader is (``Reader``) and how one says it cannot run here
(``ReaderUnavailable``): below the readers and ``open_reader`` (the package), so that each
reader imports this and the package imports the readers, never the other way round."""

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
