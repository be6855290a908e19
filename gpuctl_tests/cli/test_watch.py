"""``gpuctl watch`` wiring: what the config hands to the TUI."""

from __future__ import annotations

from gpuctl.accept.run import AcceptOptions
from gpuctl.cli.watch import accept_defaults


def test_accept_table_reaches_the_tui_options() -> None:
    table = {
        "python": "/opt/torch/bin/python",
        "floor": 0.5,
        "partition": "gpu",
        "quick": False,
        "test_break_rank": 1,
    }
    got = accept_defaults(table)
    assert got == {"python": "/opt/torch/bin/python", "floor": 0.5}
    opts = AcceptOptions(quick=True, device="cpu", **got)
    assert opts.python == "/opt/torch/bin/python" and "--floor" in opts.suite_args()
