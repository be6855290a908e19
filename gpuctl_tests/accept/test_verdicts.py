"""Verdicts of ``gpuctl accept``: floors and dtypes from the config and the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuctl.config import ConfigError, parse_config
from gpuctl_tests.accept.test_cli import LIGHT, gpuctl, reports


def test_floors_and_dtypes_are_config_keys_checked_with_their_line() -> None:
    config = parse_config(
        '[accept]\ndtypes = ["bf16", "fp16"]\n[accept.floors.L40S]\nfp32 = 0.4\nbf16 = 0.55\n'
    )
    assert config.accept["floors"] == {"L40S": {"fp32": 0.4, "bf16": 0.55}}
    assert config.accept["dtypes"] == ("bf16", "fp16")
    assert config.accept.get("floor") is None  # no single floor unless one is set
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
