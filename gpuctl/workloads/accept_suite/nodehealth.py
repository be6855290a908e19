"""What the node itself says about its GPUs, beside NVML: XIDs in the kernel log and the PCIe AER
error counters in sysfs (no torch; standard library only).

The kernel log is read from the first source that answers: ``dmesg``, ``/dev/kmsg``, then
``journalctl -k -b``. Without root (``kernel.dmesg_restrict=1``, no ``adm``/``systemd-journal``
group) none may answer: ``kernel_log`` then says why for each, and the caller must report the
XIDs as unchecked, never as absent.
"""

import errno
import os
import re
import subprocess
from collections.abc import Sequence
from typing import Any, NamedTuple

# "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus." (function omitted)
XID_LINE = re.compile(
    r"NVRM: Xid \(PCI:(?P<domain>[0-9A-Fa-f]{1,8}):(?P<bus>[0-9A-Fa-f]{1,2}):"
    r"(?P<dev>[0-9A-Fa-f]{1,2})(?:\.[0-7])?\): (?P<xid>\d+)(?P<rest>.*)"
)


class Xid(NamedTuple):
    """A common XID, after NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors): what it
    means and what an operator does about it. ``XIDS`` is the one table of them: this suite's
    health section names the hardware ones; the TUI's detail screen and events name every one.
    """

    meaning: str
    action: str  # what to do, as an operator would be told
    hardware: bool  # the hardware failed (else usually an application's fault)


XIDS: "dict[int, Xid]" = {
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


# XIDs that mean the hardware (memory, NVLink, the bus, the GPU's firmware) failed; the others
# (13, 31, 43, 45, ...) are usually raised by an application's fault.
HARDWARE_XIDS = {xid: x.meaning for xid, x in XIDS.items() if x.hardware}
KMSG = "/dev/kmsg"
AER_KINDS = ("correctable", "nonfatal", "fatal")
LOG_TIMEOUT_S = 20.0


def kernel_log(
    kmsg: str = KMSG, dmesg: str = "dmesg", journalctl: str = "journalctl"
) -> "tuple[list[str] | None, str]":
    """``(lines, source)`` of the kernel log since boot, or ``(None, why)`` naming every source
    that was tried and why it did not answer."""
    tried: list[str] = []
    lines = _command([dmesg], tried)
    if lines is not None:
        return lines, "dmesg"
    lines = _kmsg(kmsg, tried)
    if lines is not None:
        return lines, kmsg
    lines = _command([journalctl, "-k", "-b", "-q", "--no-pager", "-o", "cat"], tried)
    if lines is not None:
        return lines, "journalctl -k"
    return None, "; ".join(tried)


def _command(argv: "list[str]", tried: "list[str]") -> "list[str] | None":
    try:
        r = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=LOG_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        tried.append(f"{argv[0]}: {e.strerror if isinstance(e, OSError) else 'timed out'}")
        return None
    text = r.stdout.decode("utf-8", "replace")
    if r.returncode != 0 or not text.strip():
        # An empty log is an unreadable one: the kernel always logs something at boot (and
        # journalctl without a readable journal prints nothing and exits 0).
        err = r.stderr.decode("utf-8", "replace").strip().splitlines()
        tried.append(f"{argv[0]}: {(err or [f'exit {r.returncode}, no output'])[-1][:160]}")
        return None
    return text.splitlines()


def _kmsg(path: str, tried: "list[str]") -> "list[str] | None":
    """The records of /dev/kmsg: one per read(); EAGAIN at the end (opened non-blocking)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        tried.append(f"{path}: {e.strerror}")
        return None
    lines: list[str] = []
    try:
        while len(lines) < 1_000_000:
            try:
                rec = os.read(fd, 8192)
            except OSError as e:
                if e.errno == errno.EAGAIN:
                    break
                if e.errno == errno.EPIPE:  # overwritten while we read: carry on
                    continue
                tried.append(f"{path}: {e.strerror}")
                return None
            if not rec:
                break
            # "PRI,SEQ,USEC,FLAGS;message\n continuation lines"
            head = rec.decode("utf-8", "replace").split("\n", 1)[0]
            lines.append(head.split(";", 1)[-1])
    finally:
        os.close(fd)
    if not lines:
        tried.append(f"{path}: no records")
        return None
    return lines


def parse_xids(lines: "Sequence[str]") -> "list[dict[str, Any]]":
    """The NVRM XID lines: ``{pci: "0000:3b:00", xid, hardware, text}`` each, in log order."""
    out = []
    for line in lines:
        m = XID_LINE.search(line)
        if m is None:
            continue
        xid = int(m.group("xid"))
        out.append(
            {
                "pci": pci_key(f"{m.group('domain')}:{m.group('bus')}:{m.group('dev')}"),
                "xid": xid,
                "hardware": xid in HARDWARE_XIDS,
                "text": line[m.start() :][:200],
            }
        )
    return out


def pci_key(address: str) -> str:
    """``domain:bus:device`` in sysfs' spelling (``0000:3b:00``), from any NVML/kernel form
    (``00000000:3B:00.0``, ``0000:3b:00``)."""
    parts = address.strip().lower().split(":")
    if len(parts) < 3:
        return address.strip().lower()
    domain, bus, dev = parts[-3], parts[-2], parts[-1].split(".")[0]
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}"


def aer_counters(pci_address: str, sysfs: str = "/sys") -> "dict[str, Any] | None":
    """PCIe AER error totals of a device and of the port above it (the link's other end):
    ``{device: {correctable, nonfatal, fatal}, port: {...} | None, port_address}``; None when
    the device has no readable AER counters (no AER support, or no such device)."""
    key = pci_key(pci_address)
    dev_dir = os.path.join(sysfs, "bus", "pci", "devices", f"{key}.{_function(pci_address)}")
    device = _aer_dir(dev_dir)
    if device is None:
        return None
    parent = os.path.dirname(os.path.realpath(dev_dir))
    port = None
    port_address = None
    if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", os.path.basename(parent)):
        port = _aer_dir(parent)
        port_address = os.path.basename(parent) if port is not None else None
    return {"device": device, "port": port, "port_address": port_address}


def _function(address: str) -> str:
    tail = address.strip().rsplit(":", 1)[-1]
    return tail.split(".", 1)[1] if "." in tail else "0"


def _aer_dir(folder: str) -> "dict[str, int] | None":
    counts: dict[str, int] = {}
    for kind in AER_KINDS:
        try:
            with open(os.path.join(folder, f"aer_dev_{kind}")) as f:
                text = f.read()
        except OSError:
            continue
        counts[kind] = _aer_total(text)
    return counts or None


def _aer_total(text: str) -> int:
    """The ``TOTAL_ERR_*`` line of an aer_dev_* file, else the sum of its counters."""
    total = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            continue
        if parts[0].startswith("TOTAL_ERR"):
            return int(parts[1])
        total += int(parts[1])
    return total
