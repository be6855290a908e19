"""What a node sends reaches a pipe as it reaches a terminal: without escapes (issue 38.1).

``gpuctl status | grep H100`` ends on the operator's terminal: a model name that holds an OSC 52
clipboard write, an OSC 0 title, an OSC 8 link or a cursor move must come out as plain text
there too. The real CLI, a real local agent, the stand-in NVML naming its GPUs so."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from gpuctl_tests.node.nvml_stub import NvmlStub

# Model names as a hostile node's NVML (or a user able to fake one) could give them.
HOSTILE_MODELS = {
    0: "NVIDIA H100\x1b]52;c;cm0gLXJmIH4=\x07 80GB\x1b]0;pwned\x07 HBM3",
    1: "NVIDIA \x1b]8;;http://x.invalid/\x07A100\x1b]8;;\x07\x1b[3A\x1b[2J-SXM4\x9b-80GB\x7f",
}
SHOWN = {0: "H100 80GB HBM3", 1: "A100-SXM4-80GB"}  # short names, what is left of them


def _control(text: str) -> set[str]:
    return {hex(ord(c)) for c in text if c != "\n" and not c.isprintable()}


def local_node(nvml_lib_dir: Path, tmp_path: Path, script: str, node: str = "n1") -> dict[str, str]:
    """The environment of a gpuctl whose config has one node, ``node``, reached by a real
    local agent that reads the stand-in NVML scripted with ``script``."""
    stub = NvmlStub(nvml_lib_dir, tmp_path / "nvml.conf", script)
    config = tmp_path / "config.toml"
    config.write_text(
        f'[clusters.lab]\nnodes = "{node}"\nvia = "local"\npython = "{sys.executable}"\n'
    )
    return stub.env({"GPUCTL_STATE_DIR": str(tmp_path / "state"), "GPUCTL_CONFIG": str(config)})


def test_status_through_a_pipe_shows_a_hostile_model_as_text(
    nvml_lib_dir: Path, tmp_path: Path
) -> None:
    script = "count 2\n" + "".join(f"name {i} {n}\n" for i, n in HOSTILE_MODELS.items())
    env = local_node(nvml_lib_dir, tmp_path, script)
    for argv in (["status"], ["status", "--json"]):
        r = subprocess.run(
            [sys.executable, "-m", "gpuctl", *argv],
            env=env,
            capture_output=True,  # stdout a pipe: `gpuctl status | grep H100`
            timeout=120,
        )
        out, err = r.stdout.decode(), r.stderr.decode()
        assert r.returncode == 0, err
        assert not _control(out) and not _control(err), (out, err)
        if "--json" in argv:  # data for a script: JSON's own escapes (\u001b), nothing raw
            names = [g["name"] for g in json.loads(out)["nodes"][0]["gpus"]]
            assert names == list(HOSTILE_MODELS.values())
        else:
            assert "pwned" not in out and "x.invalid" not in out
            header, *rows = out.splitlines()
            assert header.split()[:3] == ["NODE", "GPU", "MODEL"]
            for i, shown in SHOWN.items():
                assert re.split(r"\s{2,}", rows[i])[:3] == ["n1", str(i), shown], rows
