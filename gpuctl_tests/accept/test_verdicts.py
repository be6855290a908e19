"""Verdicts of ``gpuctl accept``: floors and dtypes from the config and the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuctl.config import ConfigError, parse_config
from gpuctl.workloads.accept_suite.schema import SECTIONS
from gpuctl_tests.accept.test_cli import LIGHT, gpuctl, reports


def test_floors_and_dtypes_are_config_keys_checked_with_their_line() -> None:
    config = parse_config(
        '[accept]\ndtypes = ["bf16", "fp16"]\n[accept.floors.L40S]\nfp32 = 0.4\nbf16 = 0.55\n'
    )
    assert config.accept.floors == {"L40S": {"fp32": 0.4, "bf16": 0.55}}
    assert config.accept.dtypes == ("bf16", "fp16")
    assert config.accept.floor is None  # no single floor unless one is set
    for text, why in (
        ("[accept.floors.B200]\nbf16 = 0.5\n", "unknown GPU model 'B200'"),
        ("[accept.floors.L40S]\nint4 = 0.5\n", "unknown dtype 'int4'"),
        ("[accept.floors.L40S]\nbf16 = 2\n", "within (0, 1]"),
        ('[accept]\ndtypes = ["int8"]\n', "unknown dtype 'int8'"),
    ):
        with pytest.raises(ConfigError) as e:
            parse_config(text, "c.toml")
        assert str(e.value).startswith("c.toml:") and why in str(e.value), str(e.value)
        assert "\n" not in str(e.value)


@pytest.mark.slow
def test_dtypes_on_the_command_line_and_floors_from_the_config_reach_the_suite(
    tmp_path: Path,
) -> None:
    config = '[accept]\ndtypes = ["fp16"]\n[accept.floors.L40S]\nfp32 = 0.4\n'
    d = tmp_path / "D"
    args = ("--local", "--device", "cpu", "--quick", "--skip", "membw", *LIGHT)
    r = gpuctl(tmp_path, *args, "--dtypes", "fp32,bf16", "--report-dir", str(d), config=config)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (report,) = reports(d)
    results = report["sections"]["compute"]["devices"][0]["results"]
    assert [x["dtype"] for x in results] == ["fp32", "bf16"]  # typed wins over the config
    assert report["sections"]["compute"]["floors"] == {"L40S": {"fp32": 0.4}}
    assert report["options"]["floor"] is None
    bad = gpuctl(tmp_path, "--local", "--device", "cpu", "--dtypes", "fp32,int4")
    assert bad.returncode == 2 and "--dtypes: unknown int4" in bad.stderr
    assert bad.stderr.strip().count("\n") == 0
    # Without --dtypes the config's list is used.
    r = gpuctl(tmp_path, *args, "--report-dir", str(tmp_path / "E"))
    assert r.returncode == 0, r.stdout[-2000:]
    (report,) = reports(tmp_path / "E")
    assert [x["dtype"] for x in report["sections"]["compute"]["devices"][0]["results"]] == ["fp16"]


# -- the expected GPU count ---------------------------------------------------------------------
def test_a_node_short_of_gpus_is_named_with_the_count_and_its_source() -> None:
    from gpuctl.workloads.accept_suite.sections.env import count_shortfall

    assert count_shortfall("gpu07", 7, 8, "Slurm gres gpu:h100:8") == (
        "gpu07: 7 of 8 GPUs visible (expected: Slurm gres gpu:h100:8)"
    )
    assert count_shortfall("gpu07", 8, 8, "x") is None
    assert count_shortfall("gpu07", 7, None, None) is None


def test_expected_counts_come_from_the_cluster_the_node_and_the_accept_table() -> None:
    from gpuctl.accept.expect import Expectation, from_config
    from gpuctl.cli.watch import accept_defaults

    config = parse_config(
        "[accept]\nexpect_gpus = 4\n"
        '[clusters.dgx]\nnodes = "dgx[1-3]"\nexpect_gpus = 8\n'
        '[clusters.dgx.override."dgx3"]\nexpect_gpus = 7\n'
        '[clusters.hpc]\nnodes = "gpu[1-2]"\nvia = "srun"\n'
        '[clusters.lab]\nnodes = "box1"\n'
    )
    expected, gres_from = from_config(config, ["dgx1", "dgx3", "box1", "gpu1"])
    assert expected == {
        "dgx1": Expectation(8, "[clusters.dgx] expect_gpus"),
        "dgx3": Expectation(7, "[clusters.dgx] expect_gpus"),
        "box1": Expectation(4, "[accept] expect_gpus"),
        "gpu1": Expectation(4, "[accept] expect_gpus"),
    }
    assert gres_from == {}
    # Without [accept] expect_gpus, the Slurm cluster's nodes are asked from their gres.
    config = parse_config('[clusters.hpc]\nnodes = "gpu[1-2]"\nvia = "srun"\n')
    assert from_config(config, ["gpu1"]) == ({}, {"gpu1": None})
    # The screen's `a` gets the same (the TUI builds its options with accept_defaults).
    table = parse_config('[accept]\nexpect_gpus = 4\npython = "p"\n').accept
    got = accept_defaults(table, config, ["gpu1"])
    assert got == {"python": "p", "expected": {}, "gres_from": {"gpu1": None}}


@pytest.mark.slurm
async def test_slurm_gres_gives_the_count_and_a_node_without_gres_says_why(
    slurm_cluster: Any,
) -> None:
    from gpuctl.accept.expect import Expectation, resolve

    conf = str(slurm_cluster.conf_path)
    found, missing = await resolve([slurm_cluster.node, "nosuch"], None, {}, {
        slurm_cluster.node: conf, "nosuch": conf,
    })  # fmt: skip
    assert found == {slurm_cluster.node: Expectation(2, "Slurm gres gpu:h100:2")}
    assert "nosuch" in missing and "GRES" in missing["nosuch"]
    typed, _ = await resolve([slurm_cluster.node], 8, {}, {slurm_cluster.node: conf})
    assert typed[slurm_cluster.node] == Expectation(8, "--expect-gpus")


@pytest.mark.slurm
@pytest.mark.slow
def test_every_run_asks_slurm_how_many_gpus_a_configured_node_has(
    tmp_path: Path, slurm_cluster: Any
) -> None:
    """No --expect-gpus typed: the suite is told the node's gres count and where it came from."""
    node = slurm_cluster.node
    config = (
        f'[clusters.hpc]\nnodes = "{node}"\nvia = "local"\n'
        f'slurm_conf = "{slurm_cluster.conf_path}"\n'
    )
    only_env = [a for s in SECTIONS if s != "env" for a in ("--skip", s)]
    d = tmp_path / "D"
    r = gpuctl(tmp_path, "--device", "cpu", "--quick", *only_env, "--report-dir", str(d),
               config=config)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (report,) = reports(d)
    assert report["options"]["expect_gpus"] == 2
    assert report["options"]["expect_source"] == "Slurm gres gpu:h100:2"


def test_the_nodes_shape_and_memtest_size_reach_the_suite_from_config_and_command_line() -> None:
    """[accept] expect_model / expect_nvlinks / expect_mig / memtest_mb (and the typed options)
    become the suite's options, which the suite itself accepts; the screen's `a` passes them."""
    from gpuctl.cli.accept import _options
    from gpuctl.cli.main import build_parser
    from gpuctl.cli.watch import accept_defaults
    from gpuctl.workloads.accept_suite.suite import parse_args

    config = parse_config(
        '[accept]\nexpect_model = "H100"\nexpect_nvlinks = 18\nexpect_mig = "on"\n'
        "memtest_mb = 512\n"
    )
    parser = build_parser()
    opts = _options(parser.parse_args(["accept", "--local"]), config)
    argv = opts.suite_args()
    for flag, value in (
        ("--expect-model", "H100"),
        ("--expect-nvlinks", "18"),
        ("--expect-mig", "on"),
        ("--memtest-mb", "512"),
    ):
        assert argv[argv.index(flag) + 1] == value
    suite = parse_args(argv)
    assert (suite.expect_model, suite.expect_nvlinks, suite.expect_mig) == ("H100", 18, "on")
    assert suite.memtest_mb == 512
    # typed wins over the config
    typed = ["accept", "--local", "--expect-model", "A100", "--expect-nvlinks", "12"]
    argv = _options(parser.parse_args(typed), config).suite_args()
    assert argv[argv.index("--expect-model") + 1] == "A100"
    assert argv[argv.index("--expect-nvlinks") + 1] == "12"
    # nothing set, nothing passed: the suite's defaults hold
    argv = _options(parser.parse_args(["accept", "--local"]), parse_config("")).suite_args()
    assert not {"--expect-model", "--expect-nvlinks", "--expect-mig", "--memtest-mb"} & set(argv)
    assert accept_defaults(config.accept)["expect_model"] == "H100"
    with pytest.raises(ConfigError, match="expect_mig"):
        parse_config('[accept]\nexpect_mig = "maybe"\n', "c.toml")
