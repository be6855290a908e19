"""[TRAIN]: a tiny model trained on each device; its loss must fall."""

from typing import TYPE_CHECKING, Any

from gpuctl.workloads.accept_suite.smoke import tiny_mlp, train_steps

if TYPE_CHECKING:
    from gpuctl.workloads.accept_suite.suite import Suite


def run(suite: "Suite") -> "dict[str, Any]":
    """[TRAIN]: a tiny model trained on each device; its loss must fall."""
    torch = suite.torch
    a = suite.args
    steps = 80 if a.quick else 300
    results, failures = [], []
    for label, device, _name in suite.devices():
        gen = torch.Generator().manual_seed(1234)
        teacher = torch.randn(32, 1, generator=gen)
        torch.manual_seed(0)
        model = tiny_mlp(torch, device)
        t = train_steps(torch, model, model.parameters(), teacher, gen, device, steps)
        first, final, finite, drop = t["first"], t["final"], t["finite"], t["drop"]
        r = {
            "index": device.index,
            "label": label,
            "steps": steps,
            "first_loss": first,
            "final_loss": final,
            "drop": drop,
            "verdict": "PASS",
            "reason": None,
        }
        if not finite:
            r["verdict"], r["reason"] = "FAIL", "loss became NaN or Inf"
        elif drop is None or drop < a.loss_drop:
            r["verdict"] = "FAIL"
            r["reason"] = (
                f"loss {first:.4g} -> {final:.4g} in {steps} steps: "
                f"fell {100 * (drop or 0):.0f}%, needs {100 * a.loss_drop:.0f}%"
            )
        results.append(r)
        suite.out.line(
            f"{label} loss {first:.4g} -> {final:.4g} in {steps} steps "
            f"(-{100 * (drop or 0):.0f}%)  {r['verdict']}"
        )
        if r["verdict"] == "FAIL":
            failures.append(f"train {label}: {r['reason']}")
    return {
        "verdict": "FAIL" if failures else "PASS",
        "devices": results,
        "loss_drop": a.loss_drop,
        "failures": failures,
        "summary": ", ".join(f"{r['label']} -{100 * (r['drop'] or 0):.0f}%" for r in results),
    }
