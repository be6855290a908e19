#!/bin/sh
# The GPU checks of issue 27 (agent NVML cost, burner vs bare GEMM, one-GPU DDP SKIP), < 7 min:
#   sh scripts/gpu_check.sh            (outputs also under $OUT when it is set)
cd "$(dirname "$0")/.." && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec python3 benchmarks/gpu_check.py "$@"
