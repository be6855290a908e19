"""An acceptance run's results for machines: its outcome and exit code, JUnit XML, and draining
the nodes that failed in Slurm.

Outcomes of a cluster report (``gpuctl.accept.run``), worst first, and the exit codes of
``gpuctl accept``:

====== ==== ==========================================================================
FAIL   1    a node failed a check (a section, or its own history)
ERROR  3    a node gave no report (unreachable, the suite could not start, cancelled)
WARN   4    everything passed, with warnings (a GPU model without a reference peak, an
            expected GPU count Slurm could not give, history not recorded)
PASS   0    every node passed every check
====== ==== ==========================================================================

(2 is a usage mistake: a bad option or config, read-only mode.)

JUnit (``junit_xml``): one ``testsuite`` per node, one ``testcase`` per node and check (each
section the node reported, then ``history``); a FAIL is a ``failure``, a node without a report
an ``error`` in every check, a SKIP ``skipped``, a WARN a pass whose ``system-out`` holds the
warning. What a node sent is data: control characters XML cannot carry are removed.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

from gpuctl import service
from gpuctl.reach.slurm import SlurmClient

EXIT_CODES = {"PASS": 0, "FAIL": 1, "ERROR": 3, "WARN": 4}
DRAIN_PREFIX = "gpuctl accept: "
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def outcome(report: Mapping[str, Any]) -> str:
    """FAIL, ERROR, WARN or PASS (the worst node's; see the table above)."""
    nodes = report.get("nodes") or {}
    verdicts = [str(n.get("verdict")) for n in nodes.values()]
    if "FAIL" in verdicts or (report.get("failures") and not verdicts):
        return "FAIL"
    if any(v not in ("PASS", "FAIL") for v in verdicts):
        return "ERROR"
    if report.get("warnings"):
        return "WARN"
    return "PASS" if report.get("verdict") == "PASS" else "FAIL"


def exit_code(report: Mapping[str, Any]) -> int:
    """The exit code of ``gpuctl accept`` for this report."""
    return EXIT_CODES[outcome(report)]


def failed_nodes(report: Mapping[str, Any]) -> dict[str, list[str]]:
    """The nodes whose verdict is FAIL, with their failure lines."""
    return {
        name: [str(f) for f in node.get("failures") or []] or ["failed"]
        for name, node in (report.get("nodes") or {}).items()
        if node.get("verdict") == "FAIL"
    }


def _text(value: Any) -> str:
    return _XML_BAD.sub("", str(value))


def junit_xml(report: Mapping[str, Any]) -> str:
    """The cluster report as JUnit XML (one test case per node and check); the pairs pass's
    report (``gpuctl.accept.pairs``) as one test case per node and one per pair tested."""
    if report.get("schema") == "gpuctl.accept.pairs":
        return _pairs_junit(report)
    root = ET.Element("testsuites", name="gpuctl accept")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for name, node in (report.get("nodes") or {}).items():
        suite = ET.SubElement(root, "testsuite", name=_text(name))
        counts = dict.fromkeys(totals, 0)
        node_report = node.get("report") or {}
        sections = node_report.get("sections") or {}
        checks = list(sections) or list(node.get("sections") or {})
        for check in [*checks, "history"]:
            case = ET.SubElement(suite, "testcase", name=_text(check), classname=_text(name))
            counts["tests"] += 1
            sec = sections.get(check) or {}
            if isinstance(sec.get("seconds"), int | float):
                case.set("time", f"{float(sec['seconds']):.3f}")
            if not node_report:
                why = _text(node.get("reason") or "no report")
                ET.SubElement(case, "error", message=why, type="ERROR").text = why
                counts["errors"] += 1
                continue
            if check == "history":
                failures = [str(f) for f in node.get("failures") or []]
                lines = [_text(f) for f in failures if f.startswith("degraded ")]
                if lines:
                    fail = ET.SubElement(case, "failure", message=lines[0], type="FAIL")
                    fail.text = "\n".join(lines)
                    counts["failures"] += 1
                continue
            verdict = str(sec.get("verdict") or "ERROR")
            summary = _text(sec.get("summary") or "")
            if verdict == "FAIL":
                lines = [_text(f) for f in sec.get("failures") or []] or [summary]
                fail = ET.SubElement(case, "failure", message=lines[0], type="FAIL")
                fail.text = "\n".join(lines)
                counts["failures"] += 1
            elif verdict == "SKIP":
                ET.SubElement(case, "skipped", message=summary)
                counts["skipped"] += 1
            elif verdict == "WARN":
                warnings = [_text(w) for w in sec.get("warnings") or []] or [summary]
                ET.SubElement(case, "system-out").text = "WARN: " + "\n".join(warnings)
            elif verdict != "PASS":
                ET.SubElement(case, "error", message=summary, type=verdict).text = summary
                counts["errors"] += 1
        for k, v in counts.items():
            suite.set(k, str(v))
            totals[k] += v
    for k, v in totals.items():
        root.set(k, str(v))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _pairs_junit(report: Mapping[str, Any]) -> str:
    """``accept --pairs``: a suite ``nodes`` (a case a node: failed with the bisection's
    evidence when it is a bad node) and a suite ``pairs`` (a case a pair tested, a round each:
    failed when it did not run, or when its link is named bad)."""
    root = ET.Element("testsuites", name="gpuctl accept --pairs")
    bad_nodes: Mapping[str, Any] = report.get("bad_nodes") or {}
    bad_links = {
        frozenset(link.get("nodes") or ()): _text(link.get("evidence") or "")
        for link in report.get("bad_links") or []
    }
    cases: dict[str, list[tuple[str, str, str | None]]] = {"nodes": [], "pairs": []}
    for name in report.get("nodes") or {}:
        why = bad_nodes.get(name)
        cases["nodes"].append((_text(name), "pairs", None if why is None else _text(why)))
    for pair in report.get("pairs") or []:
        a, b = (str(n) for n in pair.get("nodes") or ("?", "?"))
        why = None if pair.get("ok") else _text(pair.get("why") or "no result")
        why = why or bad_links.get(frozenset((a, b)))
        busbw = pair.get("busbw")
        name = f"{a}-{b} round {pair.get('round', 1)}"
        cases["pairs"].append((_text(name), f"{busbw or 0:.3f} GB/s", why))
    failures_total = 0
    for suite_name, rows in cases.items():
        suite = ET.SubElement(root, "testsuite", name=suite_name)
        failures = 0
        for name, out, why in rows:
            case = ET.SubElement(suite, "testcase", name=name, classname=suite_name)
            ET.SubElement(case, "system-out").text = out
            if why is not None:
                ET.SubElement(case, "failure", message=why, type="FAIL").text = why
                failures += 1
        suite.set("tests", str(len(rows)))
        suite.set("failures", str(failures))
        failures_total += failures
    root.set("tests", str(sum(len(r) for r in cases.values())))
    root.set("failures", str(failures_total))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def drain_failed(
    report: Mapping[str, Any],
    client: SlurmClient,
    *,
    read_only: bool | None = None,
) -> dict[str, str]:
    """Drain every node that failed in Slurm, the reason naming its first failure; returns
    node -> the reason given. Nodes without a report (ERROR) are left alone: the run could not
    judge them.

    Raises ``gpuctl.service.ReadOnlyError`` in read-only mode (before anything is asked),
    SlurmError when scontrol refuses (a user who is not a Slurm operator, an unknown node).
    """
    service.check("draining nodes in Slurm", read_only=read_only)
    drained: dict[str, str] = {}
    for name, failures in failed_nodes(report).items():
        reason = (
            DRAIN_PREFIX + failures[0] + (f" (+{len(failures) - 1} more)" if failures[1:] else "")
        )
        drained[name] = client.drain([name], reason)
    return drained


def resume(names: Sequence[str], client: SlurmClient, *, read_only: bool | None = None) -> None:
    """Put drained nodes back into service (``state=resume``). Raises like ``drain_failed``."""
    service.check("resuming nodes in Slurm", read_only=read_only)
    client.resume(list(names))
