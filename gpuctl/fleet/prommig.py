"""A GPU in MIG mode seen through Prometheus (``gpuctl.fleet.prom``): one row summing its
instances, its utilisation their GR_ENGINE_ACTIVE weighed by their compute slices over the
GPU's, and the instances as a sample's ``mig`` list."""

from __future__ import annotations

import re

from gpuctl.core.wire import JsonObject

MIB = 1 << 20
# MIG: in DCGM exporter's default device mode ("flex") a GPU in MIG mode has no series of its
# own but one per GPU instance, each with the parent's ``gpu`` and ``UUID`` labels plus the
# instance's id and profile (internal/pkg/collector: GPUInstanceID, MigProfile), and without
# GPU_UTIL (DCGM does not report it for instances: GR_ENGINE_ACTIVE, a ratio, instead). The
# screen's model has a row per GPU index, so a MIG GPU is one row summing its instances: its
# memory the sum of theirs, its utilisation their GR_ENGINE_ACTIVE weighted by each one's
# compute slices (the "3" of "3g.40gb") over the GPU's slices (``mig_slices``: 7 on an H100,
# whether instances hold them or not), ``mig_mode`` set in its hello.
MIG_ID, MIG_PROFILE = "GPU_I_ID", "GPU_I_PROFILE"
MIG_UTIL = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
MIG_SUMMED = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
_SLICES = re.compile(r"(\d+)g\.")
# A GPU's compute slices in MIG mode, by its model (DCGM exporter's ``modelName``, "NVIDIA
# A100-SXM4-80GB"), the first that matches: NVIDIA's MIG user guide ("Supported GPUs": 7
# instances at most on the A100, H100, H20, H200, GH200, B200, GB200; 4 on the A30 and the
# RTX PRO 6000 Blackwell, 2 on the RTX PRO 5000 Blackwell).
MIG_MODELS = (
    (re.compile(r"RTX PRO 6000"), 4),
    (re.compile(r"RTX PRO 5000"), 2),
    (re.compile(r"\bA30\b"), 4),
    (re.compile(r"\b(A100|H100|H200|H20|GH200|GB200|B200|B300|GB300)\b"), 7),
)
# ... else by its instances' profile names where every one is a documented profile of GPUs of
# one slice count (the guide's "Supported MIG Profiles", "+me" media extensions left out):
# the A30's (4 slices) and the 7-slice GPUs' (A100 40/80 GB, H100 80/94/96 GB, H200, B200,
# B300). Not "1g.24gb", "2g.48gb", "4g.96gb": the H100 94 GB's and the RTX PRO Blackwells' too.
MIG_PROFILES = {
    **dict.fromkeys(("1g.6gb", "2g.12gb", "4g.24gb"), 4),
    **dict.fromkeys(
        (
            *("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),  # A100 40 GB
            *("1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),  # A100 80 GB, H100
            *("1g.12gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),  # H100 94 GB
            *("3g.48gb", "4g.48gb", "7g.96gb"),  # GH200, H20 (96 GB)
            *("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),  # H200
            *("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),  # B200
            *("1g.34gb", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"),  # B300
        ),
        7,
    ),
}


def profile_slices(profile: str) -> int:
    """A MIG profile's compute slices: the "3" of "3g.40gb" (1 for a name without one)."""
    m = _SLICES.search(profile)
    return int(m.group(1)) if m else 1


def mig_slices(model: str | None, profiles: list[str]) -> int | None:
    """A GPU's compute slices in MIG mode (7 on an A100 or H100): by its ``model``, else by
    its instances' ``profiles`` where all are known ones (``MIG_PROFILES``) of one count;
    None where neither tells."""
    for pattern, slices in MIG_MODELS:
        if model and pattern.search(model):
            return slices
    counts = {MIG_PROFILES.get(p.split("+", 1)[0]) for p in profiles}
    if len(counts) == 1 and None not in counts:
        return counts.pop()
    return None


def mig_util(
    instances: dict[str, tuple[str, float | None]], model: str | None = None
) -> int | None:
    """A MIG GPU's utilisation: its instances' GR_ENGINE_ACTIVE (%) weighted by their compute
    slices ("3g.40gb": 3) over the GPU's (``mig_slices``), so that a GPU whose one 2g
    instance is busy reads 29%, not 100%: the five slices no instance holds are idle. Where
    the GPU's slices are not known (a model and profiles not in the tables), over the
    instances' own: what the instances there are do, not the GPU."""
    total = weight = held = 0.0
    for profile, util in instances.values():
        slices = profile_slices(profile)
        held += slices
        if util is None:
            continue
        total += util * slices
        weight += slices
    if not weight:
        return None
    whole = mig_slices(model, [p for p, _u in instances.values()])
    return round(total / (weight if whole is None else max(whole, held)))


def mig_instances(
    instances: dict[str, tuple[str, float | None]], memory: dict[str, dict[str, float]]
) -> list[JsonObject]:
    """A MIG GPU's instances as a sample's ``mig`` (protocol): id, profile, utilisation (%),
    memory used and total (bytes: its used plus free, FB_RESERVED being read only at the
    host's slow turns), by instance id."""
    out: list[JsonObject] = []
    for gi in sorted(instances, key=lambda i: (len(i), i)):
        profile, util = instances[gi]
        mem = memory.get(gi, {})
        used, free = mem.get("fb_used"), mem.get("fb_free")
        out.append(
            {
                "id": gi,
                "profile": profile or None,
                "util": None if util is None else min(100, max(0, round(util))),
                "mem_used": None if used is None else int(used * MIB),
                "mem_total": None if used is None or free is None else int((used + free) * MIB),
            }
        )
    return out
