"""GPU readers: NVML (pynvml), else nvidia-smi CSV, else a clear reason why neither works.

A reader is an object with:
    name                     "nvml" | "nvidia-smi" | "simulated"
    versions() -> dict       {"driver", "cuda", "nvml"}: version strings or None
    static() -> list         static facts per GPU (protocol.STATIC_FIELDS)
    sample(slow) -> list     one dict per GPU (protocol.SAMPLE_FIELDS); slow=True also reads the
                             slow fields (ECC, retired pages, remapped rows), else repeats them
    events() -> list         event messages seen since the last call (XID, GPU lost)
    close()
"""


class ReaderUnavailable(Exception):
    """This reader cannot run here; the message says why in one line."""


def open_reader(simulate=None, seed=0):
    """Return ``(reader, None)`` for the first reader that works, else ``(None, reason)``.

    ``simulate`` ("8" or "8:H100" or "2:A100,2:H100") selects the simulated reader instead.
    """
    if simulate:
        from .sim import SimReader

        return SimReader.from_spec(simulate, seed=seed), None
    reasons = []
    try:
        from .nvml import NvmlReader

        return NvmlReader.open(), None
    except ReaderUnavailable as e:
        reasons.append("NVML: %s" % e)
    except ImportError as e:  # the nvml module itself is missing from an old bundle
        reasons.append("NVML: %s" % e)
    try:
        from .smi import SmiReader

        return SmiReader.open(), None
    except ReaderUnavailable as e:
        reasons.append("nvidia-smi: %s" % e)
    except ImportError as e:
        reasons.append("nvidia-smi: %s" % e)
    return None, "no NVIDIA driver found (%s)" % "; ".join(reasons)
