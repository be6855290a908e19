"""Reference dense peaks per GPU model, for "fraction of peak" in acceptance reports.

Source: the vendors' datasheets as collected in the team note ``notes/gpu-peaks.md`` (dense
figures, never the 2:4-sparsity ones). TFLOP/s for math, GB/s for memory. ``None`` means the
model has no such unit (V100 has no TF32 or BF16 tensor cores): that dtype is skipped, not failed.
BF16 and FP16 tensor peaks are equal on every listed model, so one column serves both.

No torch here: the login side reads this table too.
"""

import re

SOURCE = "vendor datasheets via notes/gpu-peaks.md (dense, no sparsity)"

# key: (display name, fp32, tf32, bf16/fp16 tensor, memory GB/s, bf16 supported)
PEAKS: "dict[str, tuple[str, float, float | None, float, float, bool]]" = {
    "V100-SXM2": ("Tesla V100 SXM2", 15.7, None, 125.0, 900.0, False),
    "V100-PCIE": ("Tesla V100 PCIe", 14.0, None, 112.0, 900.0, False),
    "A100-SXM-40": ("A100 40GB SXM", 19.5, 156.0, 312.0, 1555.0, True),
    "A100-SXM-80": ("A100 80GB SXM", 19.5, 156.0, 312.0, 2039.0, True),
    "A100-PCIE-40": ("A100 40GB PCIe", 19.5, 156.0, 312.0, 1555.0, True),
    "A100-PCIE-80": ("A100 80GB PCIe", 19.5, 156.0, 312.0, 1935.0, True),
    "H100-SXM": ("H100 SXM 80GB", 67.0, 494.5, 989.0, 3350.0, True),
    "H100-PCIE": ("H100 PCIe 80GB", 51.0, 378.0, 756.0, 2000.0, True),
    "H200-SXM": ("H200 SXM 141GB", 67.0, 494.5, 989.0, 4800.0, True),
    # Not in the note: NVIDIA's H200 NVL and GH200 datasheets, dense (half the sparse figure).
    # The H200 NVL is a 600 W PCIe card with lower clocks than the SXM H200; GH200's Hopper
    # runs at H100 SXM clocks with HBM3 (96 GB, 4.0 TB/s) or HBM3e (144 GB, 4.9 TB/s).
    "H200-NVL": ("H200 NVL 141GB", 60.0, 417.5, 835.5, 4800.0, True),
    "GH200": ("GH200 96GB HBM3", 67.0, 494.5, 989.0, 4000.0, True),
    "GH200-144": ("GH200 144GB HBM3e", 67.0, 494.5, 989.0, 4900.0, True),
    "L40S": ("L40S 48GB", 91.6, 183.0, 362.0, 864.0, True),
    "RTX-A6000": ("RTX A6000 48GB", 38.7, 77.4, 154.8, 768.0, True),
    "RTX-4090": ("RTX 4090 24GB", 82.6, 82.6, 165.2, 1008.0, True),
}

# Device names as CUDA/NVML report them, first match wins. Order matters: "A100 80GB PCIe" must
# be tried before the generic A100 rules, PCIe before SXM, GH200 and H200 NVL before H200.
_RULES = (
    (r"v100.*pcie", "V100-PCIE"),
    (r"v100", "V100-SXM2"),
    (r"a100.*(pcie|pci-e).*80|a100.*80.*(pcie|pci-e)", "A100-PCIE-80"),
    (r"a100.*(pcie|pci-e)", "A100-PCIE-40"),
    (r"a100.*80", "A100-SXM-80"),
    (r"a100", "A100-SXM-40"),
    (r"h100.*(pcie|pci-e)", "H100-PCIE"),
    (r"h100.*(sxm|hbm3)", "H100-SXM"),
    (r"gh200.*(144|hbm3e)", "GH200-144"),
    (r"gh200", "GH200"),
    (r"h200.*nvl", "H200-NVL"),
    (r"h200", "H200-SXM"),
    (r"l40s", "L40S"),
    (r"rtx a6000", "RTX-A6000"),
    (r"rtx 4090", "RTX-4090"),
)

DTYPE_COLUMN = {"fp32": 1, "tf32": 2, "bf16": 3, "fp16": 3}


# Shipped floors: the fraction of the dense peak a healthy GPU's GEMM must reach, per model and
# dtype. From the note's public measurements of short PyTorch GEMM runs (bf16: ~0.80 of the
# H100/H200 figure, ~0.85 on A100, ~0.75 on L40S, ~0.80 on RTX A6000) less a margin of about
# 0.12 for clocks and run-to-run spread. TF32 gets the bf16 floor less 0.05 (same tensor cores,
# more bytes per FLOP). FP32 on GA102/AD102 parts (L40S, RTX A6000, RTX 4090): the datasheet
# counts dual-issue FP32 that an SGEMM does not reach (about half of it), hence 0.35; on
# A100/H100-class parts SGEMM runs close to the FP32 peak. A model not listed, or a dtype not
# listed for it, uses DEFAULT_FLOOR. The config's ``[accept.floors.<MODEL>]`` overrides these.
DEFAULT_FLOOR = 0.6
_HOPPER = {"fp32": 0.6, "tf32": 0.6, "bf16": 0.65, "fp16": 0.65}
FLOORS: "dict[str, dict[str, float]]" = {
    "V100-SXM2": {"fp32": 0.6, "fp16": 0.6},
    "V100-PCIE": {"fp32": 0.6, "fp16": 0.6},
    "A100-SXM-40": {"fp32": 0.7, "tf32": 0.65, "bf16": 0.7, "fp16": 0.7},
    "A100-SXM-80": {"fp32": 0.7, "tf32": 0.65, "bf16": 0.7, "fp16": 0.7},
    "A100-PCIE-40": {"fp32": 0.7, "tf32": 0.65, "bf16": 0.7, "fp16": 0.7},
    "A100-PCIE-80": {"fp32": 0.7, "tf32": 0.65, "bf16": 0.7, "fp16": 0.7},
    "H100-SXM": _HOPPER,
    "H100-PCIE": _HOPPER,
    "H200-SXM": _HOPPER,
    "H200-NVL": _HOPPER,
    "GH200": _HOPPER,
    "GH200-144": _HOPPER,
    "L40S": {"fp32": 0.35, "tf32": 0.55, "bf16": 0.6, "fp16": 0.6},
    "RTX-A6000": {"fp32": 0.35, "tf32": 0.6, "bf16": 0.65, "fp16": 0.65},
    "RTX-4090": {"fp32": 0.35, "tf32": 0.55, "bf16": 0.6, "fp16": 0.6},
}


def floor_for(
    key: "str | None",
    dtype: str,
    overrides: "dict[str, dict[str, float]] | None" = None,
    uniform: "float | None" = None,
) -> "tuple[float, str]":
    """The floor (fraction of peak) for one model key and dtype, and where it came from.

    First match: ``overrides[key][dtype]`` (the config's ``[accept.floors]``), ``uniform`` (one
    ``--floor`` for everything), the shipped ``FLOORS``, ``DEFAULT_FLOOR``.
    """
    own = (overrides or {}).get(key or "", {})
    if dtype in own:
        return float(own[dtype]), f"[accept.floors.{key}] {dtype}"
    if uniform is not None:
        return float(uniform), "--floor"
    shipped = FLOORS.get(key or "", {})
    if dtype in shipped:
        return shipped[dtype], "shipped default"
    return DEFAULT_FLOOR, "default"


def parse_floors(text: str) -> "dict[str, dict[str, float]]":
    """``"L40S:fp32=0.4,H100-SXM:bf16=0.7"`` -> {"L40S": {"fp32": 0.4}, ...}.

    Raises ValueError (one line) for an unknown model key or dtype, or a fraction outside
    (0, 1].
    """
    out: dict[str, dict[str, float]] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, _, rest = part.partition(":")
        dtype, _, value = rest.partition("=")
        check_floor(key, dtype, value)
        out.setdefault(key, {})[dtype] = float(value)
    return out


def check_floor(key: str, dtype: str, value: object) -> float:
    """One floor's parts checked; returns the fraction. Raises ValueError saying what is wrong."""
    if key not in PEAKS:
        raise ValueError(f"unknown GPU model {key!r} (known: {', '.join(PEAKS)})")
    if dtype not in DTYPE_COLUMN:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_COLUMN)})")
    try:
        fraction = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{key} {dtype}: {value!r} is not a fraction like 0.6") from None
    if isinstance(value, bool) or not 0 < fraction <= 1:
        raise ValueError(f"{key} {dtype}: the floor must be within (0, 1], not {value!r}")
    return fraction


def format_floors(floors: "dict[str, dict[str, float]]") -> str:
    """The inverse of ``parse_floors`` (for a command line)."""
    return ",".join(f"{k}:{d}={v:g}" for k, table in floors.items() for d, v in table.items())


def model_key(device_name: "str | None") -> "str | None":
    """Return the table key for a device name ("NVIDIA H100 80GB HBM3" -> "H100-SXM") or None."""
    name = (device_name or "").lower()
    for pattern, key in _RULES:
        if re.search(pattern, name):
            return key
    return None


def peak_tflops(device_name: "str | None", dtype: str) -> "float | None":
    """Dense peak TFLOP/s of ``dtype`` on this device, or None (unknown model or no such unit)."""
    key = model_key(device_name)
    if key is None or dtype not in DTYPE_COLUMN:
        return None
    value = PEAKS[key][DTYPE_COLUMN[dtype]]
    return value if isinstance(value, float) else None


def peak_membw(device_name: "str | None") -> "float | None":
    """Datasheet memory bandwidth in GB/s, or None for an unknown model."""
    key = model_key(device_name)
    return None if key is None else PEAKS[key][4]


def has_unit(device_name: "str | None", dtype: str) -> bool:
    """False when the model is known to lack the dtype's unit (V100: no TF32, no BF16)."""
    key = model_key(device_name)
    if key is None:
        return True
    if dtype == "bf16":
        return PEAKS[key][5]
    if dtype == "tf32":
        return PEAKS[key][2] is not None
    return True


# PCIe payload bandwidth per direction, GB/s, x16 (after 128b/130b encoding for gen 3+).
PCIE_X16_GBPS = {1: 4.0, 2: 8.0, 3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}


def pcie_peak(gen: "int | None", width: "int | None") -> "float | None":
    """Theoretical one-direction bandwidth in GB/s of a PCIe link, or None when unknown."""
    if not gen or not width or gen not in PCIE_X16_GBPS:
        return None
    return PCIE_X16_GBPS[gen] * width / 16.0
