"""Machine-readable results: outcome and exit code, JUnit XML, --json, draining failed nodes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import junitparser
import pytest

from gpuctl.accept.results import EXIT_CODES, drain_failed, exit_code, junit_xml, outcome
from gpuctl.reach.slurm import SlurmClient
from gpuctl.service import ReadOnlyError
from gpuctl.workloads.accept_suite.schema import SECTIONS
from gpuctl_tests.accept.test_cli import gpuctl, lines


def node(verdict: str, sections: dict[str, dict[str, Any]] | None, **kw: Any) -> dict[str, Any]:
    report = None if sections is None else {"sections": sections}
    return {"verdict": verdict, "failures": [], "report": report, **kw}


def cluster(nodes: dict[str, dict[str, Any]], warnings: tuple[str, ...] = ()) -> dict[str, Any]:
    verdict = "PASS" if all(n["verdict"] == "PASS" for n in nodes.values()) else "FAIL"
    return {"verdict": verdict, "failures": [], "warnings": list(warnings), "nodes": nodes}


PASSED = {"env": {"verdict": "PASS", "seconds": 0.5}, "compute": {"verdict": "PASS"}}


def test_each_outcome_has_its_exit_code() -> None:
    ok = node("PASS", PASSED)
    bad = node("FAIL", {**PASSED, "compute": {"verdict": "FAIL", "failures": ["x"]}})
    gone = node("ERROR", None, reason="not reachable")
    assert (outcome(cluster({"a": ok})), exit_code(cluster({"a": ok}))) == ("PASS", 0)
    assert exit_code(cluster({"a": ok}, warnings=("a: no peak",))) == 4
    assert exit_code(cluster({"a": ok, "b": gone})) == 3
    assert exit_code(cluster({"a": bad, "b": gone})) == 1  # a finding beats a node unheard
    assert EXIT_CODES == {"PASS": 0, "FAIL": 1, "ERROR": 3, "WARN": 4}


def test_junit_has_one_case_per_node_and_check_and_survives_hostile_text(tmp_path: Path) -> None:
    hostile = "wrong \x1b[31mred\x00\x07 <b>&"
    report = cluster(
        {
            "gpu01": node(
                "FAIL",
                {
                    "env": {"verdict": "PASS", "seconds": 1.25},
                    "compute": {"verdict": "FAIL", "summary": "s", "failures": [hostile]},
                    "pcie": {"verdict": "SKIP", "summary": "no GPU"},
                    "health": {"verdict": "WARN", "summary": "w", "warnings": ["hot"]},
                },
                failures=[hostile, "degraded compute/gpu3/bf16: 88 TFLOP/s is 12% below"],
            ),
            "gpu02": node("ERROR", None, reason="not reachable: timeout"),
        }
    )
    path = tmp_path / "j.xml"
    path.write_text(junit_xml(report))
    xml = junitparser.JUnitXml.fromfile(str(path))
    suites = {s.name: s for s in xml}
    assert set(suites) == {"gpu01", "gpu02"}
    cases = {c.name: c for c in suites["gpu01"]}
    assert list(cases) == ["env", "compute", "pcie", "health", "history"]
    assert cases["env"].is_passed and cases["env"].time == pytest.approx(1.25)
    (failure,) = cases["compute"].result
    assert isinstance(failure, junitparser.Failure) and failure.message == "wrong [31mred <b>&"
    assert isinstance(cases["pcie"].result[0], junitparser.Skipped)
    assert cases["health"].is_passed and "WARN: hot" in (cases["health"].system_out or "")
    assert cases["history"].result[0].message.startswith("degraded compute/gpu3/bf16")
    gone = list(suites["gpu02"])
    assert len(gone) == 1 and isinstance(gone[0].result[0], junitparser.Error)
    assert (suites["gpu01"].tests, suites["gpu01"].failures, suites["gpu01"].skipped) == (5, 2, 1)


def test_draining_is_refused_in_read_only_mode_before_slurm_is_asked(tmp_path: Path) -> None:
    report = cluster({"gpu01": node("FAIL", PASSED, failures=["compute gpu3 bf16: slow"])})
    client = SlurmClient(tmp_path / "no-such-slurm.conf")  # asking it would fail differently
    with pytest.raises(ReadOnlyError, match="draining nodes in Slurm is disabled"):
        drain_failed(report, client, read_only=True)


@pytest.mark.slurm
def test_drain_and_resume_on_a_real_slurm(
    slurm_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuctl import audit

    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "state"))
    client = SlurmClient(slurm_cluster.conf_path)
    name = slurm_cluster.node
    report = cluster(
        {name: node("FAIL", PASSED, failures=["compute gpu3 bf16:\n 150 TFLOP/s", "x"])}
    )
    try:
        drained = drain_failed(report, client, read_only=False)
        assert drained == {name: "gpuctl accept: compute gpu3 bf16: 150 TFLOP/s (+1 more)"}
        (seen,) = client.nodes(names=[name])
        assert seen.drained and seen.reason == drained[name]
    finally:
        client.resume([name])
    (seen,) = client.nodes(names=[name])
    assert not seen.drained and seen.reason is None
    entries, _ = audit.read()
    assert [(e.action, e.node, e.target, e.outcome) for e in reversed(entries)] == [
        ("drain", name, drained[name], "ok"),
        ("resume", name, "", "ok"),
    ]


@pytest.mark.slurm
@pytest.mark.slow
def test_a_failed_node_gives_json_junit_exit_1_and_is_drained(
    tmp_path: Path, slurm_cluster: Any
) -> None:
    name = slurm_cluster.node
    config = (
        f'[clusters.hpc]\nnodes = "{name}"\nvia = "local"\npython = "{sys.executable}"\n'
        f'slurm_conf = "{slurm_cluster.conf_path}"\n'
    )
    skip = [a for s in SECTIONS if s not in ("env", "ddp_allreduce") for a in ("--skip", s)]
    junit = tmp_path / "accept.xml"
    try:
        r = gpuctl(
            tmp_path, "--device", "cpu", "--quick", *skip, "--test-break-rank", "1",
            "--json", "--junit", str(junit), "--drain-failed", "--no-history", config=config,
        )  # fmt: skip
        (seen,) = SlurmClient(slurm_cluster.conf_path).nodes(names=[name])
    finally:
        slurm_cluster.resume()
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]
    report = json.loads(r.stdout)  # stdout is the report alone
    assert report["outcome"] == "FAIL" and report["nodes"][name]["verdict"] == "FAIL"
    reason = report["drained"][name]
    assert reason.startswith("gpuctl accept: all-reduce rank ")
    assert seen.drained and seen.reason == reason
    assert f"drained {name} in Slurm: {reason}" in r.stderr
    assert any(ln.startswith("[RESULT] FAILURE:") for ln in r.stderr.splitlines())
    xml = junitparser.JUnitXml.fromfile(str(junit))
    cases = {c.name: c for s in xml for c in s}
    assert list(cases) == [*SECTIONS, "history"]
    assert isinstance(cases["ddp_allreduce"].result[0], junitparser.Failure)
    assert cases["env"].is_passed and isinstance(cases["compute"].result[0], junitparser.Skipped)


@pytest.mark.slurm
@pytest.mark.slow
def test_a_warning_exits_4_and_a_node_without_report_3(tmp_path: Path, slurm_cluster: Any) -> None:
    only_env = [a for s in SECTIONS if s != "env" for a in ("--skip", s)]
    config = (  # box1 is no Slurm node: its expected GPU count cannot be had
        f'[clusters.hpc]\nnodes = "box1"\nvia = "local"\npython = "{sys.executable}"\n'
        f'slurm_conf = "{slurm_cluster.conf_path}"\n'
    )
    r = gpuctl(tmp_path, "--device", "cpu", "--quick", *only_env, config=config)
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    assert lines(r)[-1].startswith("[RESULT] WARNING: [")
    assert "box1: expected GPU count unknown: Slurm" in lines(r)[-1]
    r = gpuctl(tmp_path, "--local", "--device", "cpu", "--python", str(tmp_path / "nopython"))
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    assert lines(r)[-1].startswith("[RESULT] FAILURE: [")


def test_history_that_cannot_be_written_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    from gpuctl.accept.history import HistoryStore
    from gpuctl.accept.run import AcceptOptions, AcceptRun, outcome_from_report
    from gpuctl.workloads.accept_suite.schema import SCHEMA_VERSION

    history = HistoryStore(tmp_path / "h.sqlite")
    (tmp_path / "h.sqlite").unlink()
    (tmp_path / "h.sqlite").mkdir()  # the database is gone: sqlite cannot open it
    run = AcceptRun(["n1"], AcceptOptions(), "agent")
    report = {"schema_version": SCHEMA_VERSION, "verdict": "PASS", "sections": {}, "started": 1.0}
    run.finish_node(outcome_from_report("n1", report, None))
    cluster_report = run._conclude(None, history)
    assert cluster_report["failures"] == []
    assert cluster_report["warnings"][0].startswith("n1: history not recorded: ")
    assert exit_code(cluster_report) == 4
