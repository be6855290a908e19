"""[HEALTH]: ECC, remapped rows, retired pages, XIDs and throttling read from NVML; XIDs in the
kernel log and PCIe AER counters read from the node (``nodehealth``)."""

from typing import TYPE_CHECKING, Any

from gpuctl.node.metrics import throttle_badges
from gpuctl.workloads.accept_suite import nodehealth

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpuctl.workloads.accept_suite.suite import Suite

BAD_THROTTLE = ("hw_slowdown", "hw_thermal", "hw_power_brake")
WARN_THROTTLE = ("sw_thermal",)


def run(suite: "Suite") -> "dict[str, Any]":
    """[HEALTH]: ECC, remapped rows, XIDs and throttling read from NVML."""
    if not suite.cuda:
        return {"verdict": "SKIP", "summary": "no GPU on a CPU run (NVML not read)", "gpus": []}
    if suite.nvml is None or suite.nvml.nv is None:
        why = suite.nvml.error if suite.nvml else "NVML not opened"
        return {"verdict": "SKIP", "summary": f"NVML unavailable ({why})", "gpus": []}
    if suite.args.prolog:  # no load ran: the reasons now
        suite.nvml.throttle_now()
    when = "now" if suite.args.prolog else "during COMPUTE"
    suite.nvml.poll_xids()
    log, log_source = _kernel_log(suite)
    logged = nodehealth.parse_xids(log) if log is not None else []
    gpus, failures, warns = [], [], []
    ours: set[str] = set()
    for g in suite.gpus:
        i = g["index"]
        h = suite.nvml.health(i)
        pci = suite.nvml.pci_address(i)
        key = nodehealth.pci_key(pci) if pci else None
        if key:
            ours.add(key)
        h.update(
            index=i,
            xids=sorted(set(suite.nvml.xids.get(i, []))),
            throttle=sorted(suite.nvml.throttle.get(i, ())),
            retired_pending=suite.nvml.retired_pending(i),
            pci=pci,
            kernel_xids=[
                {k: x[k] for k in ("xid", "hardware", "text")} for x in logged if x["pci"] == key
            ],
            aer=nodehealth.aer_counters(pci, suite.args.test_sysfs_root) if pci else None,
            verdict="PASS",
            reason=None,
        )
        problems, notes = [], []
        if h["ecc_uncorrected_volatile"]:
            problems.append(f"{int(h['ecc_uncorrected_volatile'])} uncorrectable ECC errors")
        rows = h["remapped_rows"] or {}
        if rows.get("pending"):
            problems.append("row remapping pending (reset the GPU)")
        if rows.get("failure"):
            problems.append("row remapping failed")
        if h["retired_pending"]:
            problems.append("page retirement pending (reset the GPU)")
        problems.extend(_kernel_xid_problems(h["kernel_xids"], hardware=True))
        notes.extend(_kernel_xid_problems(h["kernel_xids"], hardware=False))
        before = suite.links_before.get(i)
        if before is not None:
            h["link_errors"] = _grown(before, suite.nvml.link_errors(i))
            bad, odd = _link_error_problems(h["link_errors"], suite.args.link_errors)
            problems.extend(bad)
            notes.extend(odd)
        bad, odd = _aer_problems(h["aer"])
        problems.extend(bad)
        notes.extend(odd)
        if h["xids"]:
            problems.append(f"XID {','.join(str(x) for x in h['xids'])} during the run")
        hw = [t for t in h["throttle"] if t in BAD_THROTTLE]
        if hw:
            problems.append(f"throttled {when}: {' '.join(throttle_badges(hw))}")
        soft = [t for t in h["throttle"] if t in WARN_THROTTLE]
        if problems:
            h["verdict"], h["reason"] = "FAIL", "; ".join(problems)
            failures.append(f"health gpu{i}: {h['reason']}")
        elif soft or notes:
            if soft:
                notes.insert(0, f"throttled {when}: {' '.join(throttle_badges(soft))}")
            h["verdict"], h["reason"] = "WARN", "; ".join(notes)
            warns.append(i)
        gpus.append(h)
        suite.out.line(
            f"gpu{i} ECC uncorrected {h['ecc_uncorrected_volatile']}, "
            f"remapped rows {_rows_text(rows)}, XID {_xids_text(h['xids'])}, "
            f"throttle {' '.join(throttle_badges(h['throttle'])) or 'none'}, "
            f"kernel-log XID {_xids_text(x['xid'] for x in h['kernel_xids'])}, "
            f"AER {_aer_text(h['aer'])}  {h['verdict']}"
            + (f" ({h['reason']})" if h["reason"] else "")
        )
    node_xids = [x for x in logged if x["pci"] not in ours]
    if node_xids:
        suite.out.line(
            "kernel-log XIDs of devices not under test: "
            + ", ".join(f"{x['pci']} XID {x['xid']}" for x in node_xids[:20])
        )
    if log is None:
        suite.out.line(f"kernel log unreadable, XIDs not checked: {log_source}")
    verdict = "FAIL" if failures else ("WARN" if warns or log is None else "PASS")
    summary = "; ".join(failures) or f"{len(gpus)} GPU(s) healthy"
    if log is None:
        summary += f"; kernel log unreadable ({log_source}): XIDs not checked"
    return {
        "verdict": verdict,
        "gpus": gpus,
        "failures": failures,
        "summary": summary,
        "kernel_log": log_source if log is not None else None,
        "kernel_log_error": None if log is not None else log_source,
        "node_xids": node_xids,
    }


def _kernel_log(suite: "Suite") -> "tuple[list[str] | None, str]":
    path = suite.args.test_kernel_log
    if path is None:
        return nodehealth.kernel_log()
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines(), path
    except OSError as e:
        return None, f"{path}: {e.strerror}"


def _kernel_xid_problems(xids: "list[dict[str, Any]]", hardware: bool) -> "list[str]":
    """One phrase per distinct XID of the kind asked (hardware ones fail, others are noted)."""
    counts: dict[int, int] = {}
    for x in xids:
        if x["hardware"] == hardware:
            counts[x["xid"]] = counts.get(x["xid"], 0) + 1
    return [
        f"kernel log XID {xid}"
        + (f" x{n}" if n > 1 else "")
        + (f" ({nodehealth.HARDWARE_XIDS[xid]})" if hardware else "")
        for xid, n in sorted(counts.items())
    ]


LINK_WORDS = {  # counter: (one, many)
    "replay": ("NVLink replay", "NVLink replays"),
    "recovery": ("NVLink recovery", "NVLink recoveries"),
    "crc_flit": ("NVLink CRC FLIT error", "NVLink CRC FLIT errors"),
    "crc_data": ("NVLink CRC data error", "NVLink CRC data errors"),
    "pcie_replay": ("PCIe replay", "PCIe replays"),
}


def _grown(before: "dict[str, Any]", after: "dict[str, Any]") -> "dict[str, int]":
    """How much each counter grew during the run (counters NVML could not read left out)."""
    return {
        k: int(after[k]) - int(before[k])
        for k in LINK_WORDS
        if isinstance(before.get(k), int) and isinstance(after.get(k), int)
    }


def _link_error_problems(grown: "dict[str, int]", limit: int) -> "tuple[list[str], list[str]]":
    """(failures, notes): a link that retrained (an NVLink recovery) or erred more than
    ``limit`` times during the run fails; fewer errors are noted."""
    bad: list[str] = []
    odd: list[str] = []
    for kind, n in grown.items():
        if n <= 0:
            continue
        words = f"{n} {LINK_WORDS[kind][n != 1]} during the run"
        if kind == "recovery":
            bad.append(f"{words} (the link retrained)")
        elif n > limit:
            bad.append(f"{words} (more than {limit})")
        else:
            odd.append(words)
    return bad, odd


def _aer_problems(aer: "dict[str, Any] | None") -> "tuple[list[str], list[str]]":
    """(failures, notes): uncorrectable AER errors fail, correctable ones are noted."""
    bad: list[str] = []
    odd: list[str] = []
    if not aer:
        return bad, odd
    for where, counts in (("GPU", aer["device"]), (f"port {aer['port_address']}", aer["port"])):
        if not counts:
            continue
        unc = {k: counts.get(k, 0) for k in ("nonfatal", "fatal") if counts.get(k)}
        if unc:
            bad.append(
                f"PCIe AER {', '.join(f'{n} {k}' for k, n in unc.items())} errors on the {where}"
            )
        if counts.get("correctable"):
            odd.append(f"PCIe AER {counts['correctable']} correctable errors on the {where}")
    return bad, odd


def _rows_text(rows: "dict[str, Any]") -> str:
    """``1 correctable, 0 uncorrectable, pending``, or ``unread`` (NVML gave none)."""
    if not rows:
        return "unread"
    flags = [k for k in ("pending", "failure") if rows.get(k)]
    counts = [f"{rows.get(k, '?')} {k}" for k in ("correctable", "uncorrectable")]
    return ", ".join(counts + flags)


def _xids_text(xids: "Iterable[object]") -> str:
    return ",".join(str(x) for x in xids) or "none"


def _aer_text(aer: "dict[str, Any] | None") -> str:
    if not aer:
        return "unreadable"
    d = aer["device"]
    return "/".join(str(d.get(k, "?")) for k in nodehealth.AER_KINDS) + " (corr/nonfatal/fatal)"
