"""The common XIDs, after NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors): what each
means and what an operator does about it. The one table of them: the acceptance suite's health
section names the hardware ones, the TUI's detail screen and events name every one.

Standard library only: it travels in the node bundle with ``nodehealth``.
"""

from typing import NamedTuple


class Xid(NamedTuple):
    meaning: str
    action: str  # what to do, as an operator would be told
    hardware: bool  # the hardware failed (else usually an application's fault)


XIDS: dict[int, Xid] = {
    8: Xid(
        "GPU stopped processing (timeout)", "restart the job; reset the GPU if it recurs", False
    ),
    13: Xid(
        "graphics engine exception",
        "usually the application (bad address or instruction): check its code",
        False,
    ),
    31: Xid(
        "GPU memory page fault",
        "usually the application (illegal address): check its code",
        False,
    ),
    32: Xid(
        "invalid or corrupted push buffer stream",
        "check the PCIe link; reset the GPU if it recurs",
        False,
    ),
    38: Xid("driver firmware error", "reload or update the driver", False),
    43: Xid("GPU stopped processing (channel reset)", "the application faulted: restart it", False),
    45: Xid(
        "preemptive cleanup after earlier errors",
        "look at the XID before it; often a killed process",
        False,
    ),
    48: Xid("double-bit ECC error", "drain the node and reset the GPU", True),
    61: Xid(
        "internal micro-controller breakpoint",
        "reset the GPU; call the vendor if it recurs",
        True,
    ),
    62: Xid("internal micro-controller halt", "drain the node and reset the GPU", True),
    63: Xid(
        "ECC page retirement or row remapping recorded",
        "reset the GPU when idle to apply it",
        True,
    ),
    64: Xid(
        "ECC page retirement or row remapping failed",
        "drain the node and replace the GPU",
        True,
    ),
    68: Xid("video decoder exception", "restart the application", False),
    69: Xid("graphics engine class error", "restart the application", False),
    74: Xid("NVLink error", "drain the node, reset its GPUs, check NVLink", True),
    79: Xid("GPU has fallen off the bus", "drain and reset the node", True),
    92: Xid("high single-bit ECC error rate", "watch it; replace the GPU if it keeps rising", True),
    94: Xid("contained ECC error", "restart the job it hit; reset the GPU when idle", True),
    95: Xid("uncontained ECC error", "drain the node and reset the GPU", True),
    109: Xid("context switch timeout", "restart the job; reset the GPU if it recurs", False),
    119: Xid("GSP RPC timeout", "drain the node and reset the GPU", True),
    120: Xid("GSP error", "drain the node and reset the GPU", True),
    154: Xid(
        "GPU recovery action changed",
        "do the recovery the driver names (reset the GPU or reboot the node)",
        False,
    ),
}


def xid_text(xid: object) -> str:
    """An XID in words: "XID 79: GPU has fallen off the bus: drain and reset the node"."""
    known = XIDS.get(xid) if isinstance(xid, int) and not isinstance(xid, bool) else None
    if known is None:
        return f"XID {xid}: see NVIDIA's XID catalogue"
    return f"XID {xid}: {known.meaning}: {known.action}"
