"""gpu-burn support: toolkit discovery over install-like trees, output parsing, the runner."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctl.workloads import gpuburn
from gpuctl.workloads.gpuburn import GpuBurnOutput, build_gpu_burn, find_toolkit
from gpuctl_tests.helpers import node_env, wait_until
from gpuctl_tests.workloads import gpuburn_standin

# real burners (or stops of every burner of this user here): these modules share one worker
pytestmark = pytest.mark.burners


def exe(path: Path, body: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def toolkit(root: Path, rel: str) -> Path:
    """A toolkit laid out like a real install: bin/nvcc and include/cuda_runtime.h."""
    top = root / rel
    exe(top / "bin" / "nvcc")
    (top / "include").mkdir(parents=True, exist_ok=True)
    (top / "include" / "cuda_runtime.h").write_text("/* */\n")
    return top


def no_ask(_nvcc: str) -> str | None:
    return None


# -- discovery ------------------------------------------------------------------------------
def test_newest_versioned_toolkit_wins_numerically(tmp_path: Path) -> None:
    for v in ("11.8", "12.4", "12.10", "9.2"):
        toolkit(tmp_path, f"usr/local/cuda-{v}")
    (tmp_path / "usr/local/cuda-extras").mkdir()  # not a version: ignored
    found, looked = find_toolkit({"PATH": ""}, str(tmp_path), no_ask)
    assert found is not None
    assert found.root == str(tmp_path / "usr/local/cuda-12.10")  # 12.10 > 12.4 > 11.8
    assert found.how == "/usr/local/cuda-12.10"
    assert any("/usr/local/cuda:" in line for line in looked)  # looked there first


def test_search_order_path_then_cuda_home_then_fixed_places(tmp_path: Path) -> None:
    on_path = toolkit(tmp_path, "opt/pathcuda")
    home = toolkit(tmp_path, "opt/homecuda")
    real = toolkit(tmp_path, "usr/local/cuda-12.4")
    (tmp_path / "usr/local/cuda").symlink_to(real)
    opt = toolkit(tmp_path, "opt/cuda")
    root = str(tmp_path)
    env = {"PATH": f"/nonexistent:{on_path / 'bin'}", "CUDA_HOME": str(home)}
    assert find_toolkit(env, root, no_ask)[0].root == str(on_path)  # type: ignore[union-attr]
    env["PATH"] = ""
    found = find_toolkit(env, root, no_ask)[0]
    assert found is not None and found.root == str(home) and found.how == "$CUDA_HOME"
    del env["CUDA_HOME"]
    found = find_toolkit(env, root, no_ask)[0]
    assert found is not None and found.how == "/usr/local/cuda"
    assert found.root == str(real)  # the link resolved: CUDAPATH is the real folder
    (tmp_path / "usr/local/cuda").unlink()
    for p in (tmp_path / "usr/local/cuda-12.4").rglob("nvcc"):
        p.unlink()
    found = find_toolkit(env, root, no_ask)[0]
    assert found is not None and found.root == str(opt) and found.how == "/opt/cuda"


def test_nvcc_wrapper_on_path_is_asked_for_its_toolkit(tmp_path: Path) -> None:
    # Like this machine: /usr/local/bin/nvcc is a script exec-ing the real one elsewhere, so
    # /usr/local is not the toolkit. nvcc -dryrun says where it really lives.
    real = toolkit(tmp_path, "usr/local/cuda-13.0")
    exe(
        real / "bin" / "nvcc",
        f"#!/bin/sh\necho '#$ _HERE_={real}/bin'\necho '#$ TOP={real}/bin/..'\n",
    )
    wrapper = exe(tmp_path / "usr/local/bin/nvcc", f'#!/bin/sh\nexec {real}/bin/nvcc "$@"\n')
    env = {"PATH": str(wrapper.parent)}
    found, _ = find_toolkit(env, str(tmp_path / "elsewhere"))
    assert found is not None
    assert found.root == str(real) and found.nvcc == str(wrapper) and found.how == "nvcc on PATH"


def test_nothing_found_says_where_it_looked(tmp_path: Path) -> None:
    exe(tmp_path / "usr/local/cuda-12.1/bin/nvcc")  # nvcc but no headers, nvcc cannot tell
    found, looked = find_toolkit({"PATH": "", "CUDA_HOME": "/nope"}, str(tmp_path), no_ask)
    assert found is None
    text = "\n".join(looked)
    for place in ("$CUDA_HOME", "/usr/local/cuda:", "/usr/local/cuda-12.1", "/opt/cuda"):
        assert place in text
    assert "no include/cuda_runtime.h" in text


def test_real_toolkit_of_this_machine_when_present() -> None:
    if not Path("/usr/local/cuda-13.0/include/cuda_runtime.h").exists():
        pytest.skip("no CUDA toolkit on this machine")
    found, _ = find_toolkit()
    assert found is not None and _has_headers(found.root)


def _has_headers(root: str) -> bool:
    return Path(root, "include", "cuda_runtime.h").is_file()


def test_find_gpu_burn_configured_then_path(tmp_path: Path) -> None:
    a = exe(tmp_path / "a" / "gpu_burn")
    b = exe(tmp_path / "b" / "gpu_burn")
    assert gpuburn.find_gpu_burn(None, {"PATH": f"{tmp_path / 'x'}:{b.parent}"}) == str(b)
    assert gpuburn.find_gpu_burn(str(a.parent), {"PATH": str(b.parent)}) == str(a)
    assert gpuburn.find_gpu_burn(str(tmp_path / "missing"), {"PATH": str(b.parent)}) is None
    assert gpuburn.find_gpu_burn(None, {"PATH": ""}) is None


# -- building: gpu-burn's Makefile shape, the real g++ and ld, a stand-in nvcc ----------------
STANDIN_NVCC = """#!/bin/sh
# stands in for nvcc: "-fatbin X.cu -o Y" writes Y; logs each run, takes STANDIN_NVCC_SECONDS
[ -n "$STANDIN_NVCC_LOG" ] && echo "$PWD $*" >> "$STANDIN_NVCC_LOG"
sleep "${STANDIN_NVCC_SECONDS:-0}"
out=""
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
[ -n "$out" ] && echo fatbin > "$out"
exit 0
"""

# The same targets and flags as gpu-burn's Makefile: the driver compiled by g++ against the
# toolkit's headers, linked with -lcuda -lcublas -lcudart from lib64 and lib64/stubs.
MAKEFILE = """CUDAPATH ?= /usr/local/cuda
CXXFLAGS = -O2 -I$(CUDAPATH)/include
LIBS = -lcuda -L$(CUDAPATH)/lib64 -L$(CUDAPATH)/lib64/stubs -Wl,-rpath=$(CUDAPATH)/lib64 \\
\t-lcublas -lcudart

gpu_burn: gpu_burn-drv.o compare.fatbin
\tg++ -o $@ $< $(LIBS)

%.o: %.cpp
\tg++ $(CXXFLAGS) -c $<

%.fatbin: %.cu
\t$(CUDAPATH)/bin/nvcc -I$(CUDAPATH)/include -fatbin $< -o $@
"""

# The driver: includes what the real one includes, then runs the stand-in gpu_burn.
DRIVER = """#include "cublas_v2.h"
#include <cuda.h>
#include <unistd.h>
#include <vector>
int main(int argc, char **argv) {{
    std::vector<char *> args;
    args.push_back((char *)"{python}");
    args.push_back((char *)"{standin}");
    for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    execv(args[0], args.data());
    return 127;
}}
"""


def cuda_toolkit(root: Path, rel: str = "usr/local/cuda-12.4") -> Path:
    """A toolkit tree: the stand-in nvcc, headers, and libcuda/libcublas/libcudart built by gcc."""
    top = toolkit(root, rel)
    exe(top / "bin" / "nvcc", STANDIN_NVCC)
    for header in ("cuda.h", "cublas_v2.h"):
        (top / "include" / header).write_text("/* stand-in */\n")
    empty = root / "empty.c"
    empty.write_text("int gpuctl_stand_in;\n")
    for lib in ("lib64/stubs/libcuda.so", "lib64/libcublas.so", "lib64/libcudart.so"):
        (top / lib).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-shared", "-o", str(top / lib), str(empty)], check=True)
    return top


def burn_source(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "Makefile").write_text(MAKEFILE)
    (folder / "compare.cu").write_text("// the compare kernel\n")
    standin = Path(gpuburn_standin.__file__).resolve()
    (folder / "gpu_burn-drv.cpp").write_text(DRIVER.format(python=sys.executable, standin=standin))
    return folder


def test_build_runs_make_with_cudapath_and_reports_each_step(tmp_path: Path) -> None:
    src = burn_source(tmp_path / "src" / "gpu-burn")
    top = cuda_toolkit(tmp_path)
    builds = tmp_path / "builds"
    steps: list[str] = []
    env = {"PATH": os.environ["PATH"]}
    binary = build_gpu_burn(
        str(src), steps.append, env=env, root=str(tmp_path), ask_nvcc=no_ask, build_root=str(builds)
    )
    folder = Path(binary).parent
    assert folder.parent == builds and folder.name.startswith("gpu-burn-")
    assert (folder / "compare.fatbin").read_text() == "fatbin\n"
    assert not (src / "gpu_burn").exists()  # the source folder is left as it was
    assert steps[0].startswith(f"CUDA toolkit {top} (found by /usr/local/cuda-12.4")
    assert steps[1].startswith(f"building: make CUDAPATH={top} in {builds}/")
    assert steps[2] == f"built {binary}"
    proc = subprocess.run([binary, "-l"], capture_output=True, text=True, timeout=30)
    assert proc.stdout.startswith("ID 0: NVIDIA H100"), proc  # the binary g++ linked runs


def test_build_is_reused_and_redone_when_source_or_toolkit_change(tmp_path: Path) -> None:
    src = burn_source(tmp_path / "gpu-burn")
    cuda_toolkit(tmp_path)
    log = tmp_path / "nvcc.log"
    env = {"PATH": os.environ["PATH"], "STANDIN_NVCC_LOG": str(log)}
    kw: dict[str, Any] = {"env": env, "root": str(tmp_path), "ask_nvcc": no_ask}
    kw["build_root"] = str(tmp_path / "builds")
    first = build_gpu_burn(str(src), print, **kw)
    steps: list[str] = []
    assert build_gpu_burn(str(src), steps.append, **kw) == first
    assert steps[-1] == f"using {first} (built before from {src})"
    assert len(log.read_text().splitlines()) == 1
    with (src / "gpu_burn-drv.cpp").open("a") as f:
        f.write("// changed\n")
    second = build_gpu_burn(str(src), print, **kw)
    assert second != first and len(log.read_text().splitlines()) == 2
    other = cuda_toolkit(tmp_path, "opt/cuda-12.6")
    kw["env"] = {**env, "CUDA_HOME": str(other)}
    third = build_gpu_burn(str(src), print, **kw)
    assert third not in (first, second) and len(log.read_text().splitlines()) == 3


def test_concurrent_builds_on_one_node_build_once(tmp_path: Path) -> None:
    # One wrapper per GPU, all started together with the same source: one build, all run it.
    src = burn_source(tmp_path / "gpu-burn")
    top = cuda_toolkit(tmp_path)
    log = tmp_path / "nvcc.log"
    env = node_env({"STANDIN_NVCC_LOG": str(log), "STANDIN_NVCC_SECONDS": "2"})
    env["PATH"] = f"{top / 'bin'}{os.pathsep}{env['PATH']}"
    argv = [sys.executable, "-m", "gpuctl.workloads.gpuburn", "run", "--source", str(src)]
    argv += ["--build-dir", str(tmp_path / "builds"), "--duration", "1", "--stts", "0"]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(4)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        lines = [json.loads(x) for x in out.splitlines()]
        assert p.returncode == 0 and lines[-1]["verdict"] == "OK", (out, err)
    assert len(log.read_text().splitlines()) == 1  # nvcc ran once: one build
    msgs = [json.loads(x) for out, _ in results for x in out.splitlines()]
    steps = [m["message"] for m in msgs if m["type"] == "step"]
    assert sum(m.startswith("built ") for m in steps) == 1
    assert sum(m.startswith("using ") for m in steps) == 3  # they waited for it, or found it


@pytest.mark.parametrize(
    ("remove", "cause"),
    [
        (
            "include/cublas_v2.h",
            "gpu_burn-drv.cpp:1:10: fatal error: cublas_v2.h: No such file or directory",
        ),
        ("lib64/stubs/libcuda.so", "cannot find -lcuda"),
    ],
)
def test_build_error_shows_the_compilers_cause(tmp_path: Path, remove: str, cause: str) -> None:
    src = burn_source(tmp_path / "gpu-burn")
    top = cuda_toolkit(tmp_path)
    (top / remove).unlink()
    with pytest.raises(gpuburn.BuildError) as err:
        build_gpu_burn(
            str(src),
            print,
            env={"PATH": os.environ["PATH"]},
            root=str(tmp_path),
            ask_nvcc=no_ask,
            build_root=str(tmp_path / "builds"),
        )
    text = str(err.value)
    assert text.startswith(f"make in {src} failed (exit 2): ")
    assert cause in text, text
    assert "compilation terminated" not in text and "ld returned" not in text
    log = text.rsplit("(full log: ", 1)[1].rstrip(")")
    assert cause in Path(log).read_text()
    # nothing half-built is left to be picked up next time
    assert [p.name for p in (tmp_path / "builds").iterdir() if p.is_dir()] == []


def test_build_failures_are_one_line(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    kw: dict[str, Any] = {"env": {"PATH": os.environ["PATH"]}, "root": str(tmp_path)}
    kw["build_root"] = str(tmp_path / "builds")
    with pytest.raises(gpuburn.BuildError, match="not a gpu-burn source folder"):
        build_gpu_burn(str(src), print, **kw)
    (src / "Makefile").write_text("gpu_burn:\n\t@echo 'nvcc fatal   : no cuda.h' >&2; false\n")
    with pytest.raises(gpuburn.BuildError, match="no CUDA toolkit found"):
        build_gpu_burn(str(src), print, ask_nvcc=no_ask, **kw)
    toolkit(tmp_path, "opt/cuda")
    with pytest.raises(gpuburn.BuildError) as err:
        build_gpu_burn(str(src), print, ask_nvcc=no_ask, **kw)
    assert "failed (exit 2): nvcc fatal   : no cuda.h (full log: " in str(err.value)
    assert "\n" not in str(err.value)


# -- parsing --------------------------------------------------------------------------------
HEAD = (
    "Using compare file: compare.fatbin\n"
    "Burning for 30 seconds.\n"
    "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0b1c)\n"
    "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-77aa)\n"
    "Initialized device 0 with 81559 MB of memory (80886 MB available, using 72797 MB of it), "
    "using FLOATS\n"
    "Initialized device 1 with 81559 MB of memory (80886 MB available, using 72797 MB of it), "
    "using FLOATS\n"
)


def prog(
    pct: float, a: str, b: str, ea: str = "0", eb: str = "0", ta: str = "45 C", tb: str = "47 C"
) -> str:
    return f"\r{pct:.1f}%  proc'd: {a} - {b}   errors: {ea} - {eb}   temps: {ta} - {tb} "


SUMMARY = "\n\tSummary at:   Sat Nov 21 23:59:59 UTC 2026\n\n"
END = "\nKilling processes with SIGTERM (soft kill)\ndone\n\nTested 2 GPUs:\n"

RECORDED_OK = (
    HEAD
    + prog(3.3, "1868 (48211 Gflop/s)", "1736 (47987 Gflop/s)")
    + prog(6.7, "3740 (48302 Gflop/s)", "3480 (48101 Gflop/s)", ta="--")
    + prog(10.0, "5611 (48299 Gflop/s)", "5216 (48050 Gflop/s)")
    + SUMMARY
    + prog(100.0, "56110 (48290 Gflop/s)", "52160 (48040 Gflop/s)", ta="71 C", tb="73 C")
    + END
    + "\tGPU 0: OK\n\tGPU 1: OK\n"
)

RECORDED_FAULTY = (
    HEAD
    + prog(10.0, "5611 (48299 Gflop/s)", "5216 (48050 Gflop/s)", eb="3 (WARNING!)")
    + SUMMARY
    # the counters reset after a summary; the FAULTY flag stays
    + prog(100.0, "56110 (48290 Gflop/s)", "52160 (48040 Gflop/s)", eb="0")
    + END
    + "\tGPU 0: OK\n\tGPU 1: FAULTY\n"
)

RECORDED_DIED = (
    HEAD
    + prog(10.0, "5611 (48299 Gflop/s)", "5216 (48050 Gflop/s)")
    + prog(20.0, "11222 (48299 Gflop/s)", "-1 (0 Gflop/s)", eb="0 (DIED!)", tb="--")
    + END
    + "\tGPU 0: OK\n\tGPU 1: OK\n"  # gpu-burn lists the dead worker as OK
)

RECORDED_CUT = HEAD + prog(10.0, "5611 (48299 Gflop/s)", "5216 (48050 Gflop/s)") + SUMMARY


def parse(text: str, chunk: int = 0) -> GpuBurnOutput:
    out = GpuBurnOutput()
    if chunk:
        for i in range(0, len(text), chunk):
            out.feed(text[i : i + chunk])
    else:
        out.feed(text)
    out.finish()
    return out


@pytest.mark.parametrize("chunk", [0, 1, 7, 64])
def test_parse_ok_run_in_any_chunking(chunk: int) -> None:
    out = parse(RECORDED_OK, chunk)
    assert out.percent == 100.0 and out.tested == 2 and out.initialized == 2
    g0, g1 = out.gpus[0], out.gpus[1]
    assert (g0.iterations, g0.gflops, g0.temp) == (56110, 48290.0, 71)
    assert (g1.iterations, g1.gflops, g1.temp) == (52160, 48040.0, 73)
    assert g0.samples == 4 and g0.gflops_sum == 48211 + 48302 + 48299 + 48290
    verdicts = out.verdicts(stopped=False, returncode=0)
    assert [(v["gpu"], v["verdict"], v["errors"]) for v in verdicts] == [(0, "OK", 0), (1, "OK", 0)]


def test_temperature_dash_is_unknown() -> None:
    out = GpuBurnOutput()
    out.feed(HEAD + prog(6.7, "3740 (48302 Gflop/s)", "3480 (48101 Gflop/s)", ta="--") + "\r")
    assert out.gpus[0].temp is None and out.gpus[1].temp == 47


def test_parse_faulty_keeps_errors_across_the_counter_reset() -> None:
    out = parse(RECORDED_FAULTY)
    assert out.gpus[1].errors == 3  # 3 before the summary + 0 after
    v = out.verdicts(stopped=False, returncode=0)
    assert v[0]["verdict"] == "OK"
    assert v[1]["verdict"] == "FAULTY" and v[1]["errors"] == 3
    assert "gpu-burn says FAULTY" in v[1]["reason"]


def test_parse_died_worker_listed_ok_is_died() -> None:
    out = parse(RECORDED_DIED)
    assert out.gpus[1].died and not out.gpus[0].died
    assert out.gpus[1].iterations == 5216  # the -1 does not erase the count
    v = out.verdicts(stopped=False, returncode=0)
    assert v[0]["verdict"] == "OK"
    assert v[1]["verdict"] == "DIED" and "listed it as OK" in v[1]["reason"]


def test_run_cut_off_before_the_summary_is_a_failure() -> None:
    out = parse(RECORDED_CUT)
    v = out.verdicts(stopped=False, returncode=0)
    assert all(x["verdict"] == "DIED" for x in v)
    assert "without its final summary (exit code 0)" in v[0]["reason"]
    # The same run stopped on purpose is not a failure, but not a pass either.
    v = out.verdicts(stopped=True, returncode=-15)
    assert [x["verdict"] for x in v] == [None, None]
    assert v[0]["reason"] == "stopped before gpu-burn's final summary"


def test_no_clients_alive_and_exit_codes() -> None:
    out = parse(HEAD)
    out.stderr_line("No clients are alive!  Aborting")
    v = out.verdicts(stopped=False, returncode=123, stderr_tail="No clients are alive!  Aborting")
    assert all(x["verdict"] == "DIED" for x in v)
    out = parse("Burning for 10 seconds.\n")
    out.stderr_line("Couldn't init a GPU test: out of memory")
    v = out.verdicts(stopped=False, returncode=124, stderr_tail=out.failures[-1])
    assert v[0]["reason"] == (
        "gpu-burn ended without its final summary (a gpu-burn worker failed to set up its GPU)"
        ": Couldn't init a GPU test: out of memory"
    )


def test_time_is_the_last_argument() -> None:
    argv = gpuburn.gpu_burn_argv("/x/gpu_burn", 60.4, 0.9, "fp64")
    assert argv == ["/x/gpu_burn", "-m", "90%", "-d", "-stts", "3", "60"]
    assert gpuburn.gpu_burn_argv("g", 5, 0.5, "tf32")[-4:] == ["-tc", "-stts", "3", "5"]


def test_tensor_cores_only_for_tf32_and_the_dtype_really_used() -> None:
    for dtype, flags, used in (
        ("fp64", ["-d"], "fp64"),
        ("tf32", ["-tc"], "tf32"),
        ("fp32", [], "fp32"),
        ("bf16", [], "fp32"),  # gpu-burn has floats and doubles only
        ("fp16", [], "fp32"),
        (None, [], "fp32"),
    ):
        assert gpuburn.gpu_burn_argv("g", 5, 0.5, dtype) == [
            "g",
            "-m",
            "50%",
            *flags,
            "-stts",
            "3",
            "5",
        ]
        assert gpuburn.burn_dtype(dtype) == used
    out = parse(HEAD.replace("using FLOATS\n", "using FLOATS, using Tensor Cores\n", 1))
    assert out.gpus[0].dtype == "tf32" and out.gpus[1].dtype == "fp32"


# Recorded in gpu-burn's own format (shared/notes/gpu-burn.md): worker 1 dies during compute.
# Its proc'd count turns -1 (its rate stays the last one), its error counter becomes its count
# plus -1 with " (DIED!)", gpu-burn spins on its closed pipe printing "read[1] error 0" to stderr
# without a newline, and its final block says FAULTY (the counter is not 0) or OK (after a reset).
DIED_STDOUT = (
    HEAD
    + prog(10.0, "5611 (48299 Gflop/s)", "5216 (48050 Gflop/s)", eb="2 (WARNING!)")
    + prog(13.3, "7482 (48301 Gflop/s)", "-1 (48050 Gflop/s)", eb="1  (DIED!)")
    + prog(13.3, "7482 (48301 Gflop/s)", "-1 (48050 Gflop/s)", eb="1  (DIED!)")
    + prog(100.0, "56110 (48290 Gflop/s)", "-1 (48050 Gflop/s)", eb="-1  (DIED!)", tb="--")
    + END
    + "\tGPU 0: OK\n\tGPU 1: FAULTY\n"
)
COMPUTE_FAILURE = (
    'Failure during compute: Error in "SGEMM" (gpu_burn-drv.cpp:197): an illegal memory access '
    "was encountered"
)
DIED_STDERR = COMPUTE_FAILURE + "\n" + "read[1] error 0" * 5000


def test_a_dead_workers_counter_is_not_errors_and_its_cuda_error_is_kept() -> None:
    out = parse(DIED_STDOUT, 13)
    for i in range(0, len(DIED_STDERR), 4096):
        out.stderr(DIED_STDERR[i : i + 4096])
    out.stderr_finish()
    g1 = out.gpus[1]
    assert g1.died and g1.errors == 2  # "-1  (DIED!)" is not 1 error, nor -1: 2 before it died
    assert g1.iterations == 5216 and g1.gflops == 48050.0
    assert len(out._err_pending) <= gpuburn.STDERR_PENDING_MAX
    v = out.verdicts(stopped=False, returncode=0)
    assert v[0]["verdict"] == "OK"
    assert v[1]["verdict"] == "DIED"
    assert v[1]["reason"] == f"worker died: {COMPUTE_FAILURE} (after 2 errors)"


def test_a_worker_that_dies_without_errors_has_none() -> None:
    text = HEAD + prog(20.0, "5611 (48299 Gflop/s)", "-1 (48050 Gflop/s)", eb="-1  (DIED!)")
    out = parse(text + END + "\tGPU 0: OK\n\tGPU 1: FAULTY\n")
    assert out.gpus[1].died and out.gpus[1].errors == 0
    assert out.verdicts(stopped=False, returncode=0)[1]["reason"] == "worker died"


def test_init_failure_keeps_the_cuda_error_not_just_no_clients_alive() -> None:
    # One worker (the agent's case): it cannot allocate, gpu-burn sees its pipe close and gives up.
    head = HEAD.split("GPU 1:")[0]
    out = parse(head + "\r0.0%  proc'd: -1 (0 Gflop/s)   errors: 0  (DIED!)   temps: -- ")
    failure = 'Couldn\'t init a GPU test: Error in "C alloc" (gpu_burn-drv.cpp:221): out of memory'
    out.stderr(failure + "\nread[0] error 0\n\nNo clients are alive!  Aborting\n")
    v = out.verdicts(stopped=False, returncode=123, stderr_tail=out.failures[-1])
    assert [x["verdict"] for x in v] == ["DIED"]
    assert v[0]["reason"] == f"worker died: {failure}"


SMI_HEAD = "Using compare file: compare.fatbin\nBurning for 30 seconds.\n" + "".join(
    f"GPU {k}: NVIDIA H100 80GB HBM3 (UUID: GPU-{k}aaa-{k})\n" for k in range(4)
)


def temps_line(workers: int, temps: list[str]) -> str:
    procd = " - ".join("100 (48000 Gflop/s)" for _ in range(workers))
    errors = " - ".join("0" for _ in range(workers))
    return f"\r10.0%  proc'd: {procd}   errors: {errors}   temps: {' - '.join(temps)} \r"


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, [40, 41, 42, 43]),  # every GPU, PCI order: column j is GPU j
        ("3,2,1,0", [43, 42, 41, 40]),  # worker i burns the i-th visible GPU
        ("GPU-2aaa,GPU-0aaa,GPU-3aaa,GPU-1aaa", [42, 40, 43, 41]),  # UUIDs (prefixes)
    ],
)
def test_temperatures_map_to_the_physical_gpu(visible: str | None, expected: list[int]) -> None:
    out = GpuBurnOutput(devices=gpuburn.worker_devices(visible))
    out.feed(SMI_HEAD + temps_line(4, ["40 C", "41 C", "42 C", "43 C"]))
    assert [out.gpus[i].temp for i in range(4)] == expected
    assert [out.label(i) for i in range(4)] == (visible.split(",") if visible else [0, 1, 2, 3])


def test_temperatures_of_fewer_gpus_than_the_node_has_are_unknown() -> None:
    # gpu-burn rotates all 4 GPUs' readings through its one slot: it is nobody's temperature.
    out = GpuBurnOutput(devices=gpuburn.worker_devices("2"))
    out.feed(SMI_HEAD + temps_line(1, ["43 C"]))
    assert out.gpus[0].temp is None and out.label(0) == "2"
    # -i 3 under CUDA_VISIBLE_DEVICES=4,5,6,7: one worker, listed as GPU 0, burning GPU 7
    out = GpuBurnOutput(devices=gpuburn.worker_devices("4,5,6,7", pinned=3), pinned=3)
    out.feed(
        SMI_HEAD
        + "Initialized device 3 with 81559 MB of memory (80886 MB available, using 72797 MB of "
        "it), using DOUBLES\n" + temps_line(1, ["41 C"])
    )
    assert out.label(0) == "7" and out.gpus[0].dtype == "fp64" and out.gpus[0].temp is None


# -- the runner, end to end, over the stand-in gpu_burn (gpuburn_standin.py) -------------------
@pytest.fixture
def standin(tmp_path: Path) -> Path:
    return Path(gpuburn_standin.install(tmp_path / "gpu-burn"))


def wrapper_argv(binary: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpuctl.workloads.gpuburn", "run", "--binary", str(binary), *args]


def standin_env(binary: Path, **extra: str) -> dict[str, str]:
    return node_env({"STANDIN_RECORD": str(binary.parent / "record.json"), **extra})


def run_wrapper(binary: Path, *args: str, **env: str) -> tuple[int, list[dict[str, Any]]]:
    proc = subprocess.run(
        wrapper_argv(binary, *args),
        capture_output=True,
        text=True,
        timeout=60,
        env=standin_env(binary, **env),
    )
    return proc.returncode, [json.loads(x) for x in proc.stdout.splitlines()]


def recorded(binary: Path) -> dict[str, Any]:
    """What the stand-in gpu_burn was started with: argv, CUDA_VISIBLE_DEVICES, its pid."""
    return dict(json.loads((binary.parent / "record.json").read_text()))


def test_runner_ok_end_to_end(standin: Path) -> None:
    rc, lines = run_wrapper(standin, "--duration", "1", "--dtype", "fp64", "--stts", "1")
    assert rc == 0, lines
    assert recorded(standin)["argv"] == ["-m", "90%", "-d", "-stts", "1", "1"]
    progress = [m for m in lines if m["type"] == "progress"]
    assert progress and progress[0]["engine"] == "gpu-burn"
    summary = lines[-1]
    assert summary["type"] == "summary" and summary["verdict"] == "OK", summary
    assert summary["reason"] is None and summary["errors"] == 0
    assert summary["iterations"] > 0 and summary["tflops"] > 0
    assert summary["elapsed"] == 1.0  # gpu-burn's own clock: 100 % of its TIME


def test_short_stts_lets_the_summary_come_and_is_passed_before_time(standin: Path) -> None:
    # Without -stts gpu-burn sleeps 30 s between its TIME and its summary.
    rc, lines = run_wrapper(standin, "--duration", "1")
    assert recorded(standin)["argv"] == ["-m", "90%", "-stts", "3", "1"]
    steps = [m["message"] for m in lines if m["type"] == "step"]
    assert "gpu-burn's time is up: it stops its workers, its summary follows in 3 s" in steps
    assert rc == 0 and lines[-1]["verdict"] == "OK", lines[-1]


def test_stop_during_gpu_burns_end_waits_for_its_summary(standin: Path) -> None:
    proc = subprocess.Popen(
        wrapper_argv(standin, "--duration", "1", "--stts", "2"),
        stdout=subprocess.PIPE,
        text=True,
        env=standin_env(standin),
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            msg = json.loads(line)
            if msg["type"] == "step" and "time is up" in msg["message"]:
                break
        proc.send_signal(signal.SIGTERM)  # the agent's stop at the duration limit
        rest = [json.loads(x) for x in proc.stdout]
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()
    assert rest[-1]["type"] == "summary" and rest[-1]["verdict"] == "OK", rest


def test_runner_faulty_and_died(standin: Path) -> None:
    rc, lines = run_wrapper(standin, "--duration", "1", "--stts", "1", STANDIN_FAULTY="0")
    assert rc == 1 and lines[-1]["verdict"] == "FAULTY" and lines[-1]["errors"] > 0
    assert "gpu-burn says FAULTY" in lines[-1]["reason"]
    rc, lines = run_wrapper(standin, "--duration", "5", "--stts", "1", STANDIN_DIE="0")
    assert rc == 3 and lines[-1]["verdict"] == "DIED", lines[-1]
    assert lines[-1]["reason"] == (
        'worker died: Failure during compute: Error in "SGEMM" (gpu_burn-drv.cpp:197): '
        "an illegal memory access was encountered"
    )
    # gpu-burn exits without killing its temperature reader: the wrapper ends the group
    group = recorded(standin)["pid"]
    wait_until(lambda: not group_members(group), 10, "what gpu-burn left behind to be killed")


def test_runner_on_part_of_a_node_labels_and_temperatures(standin: Path) -> None:
    # A node of 4 GPUs; the job sees them in another order, or only one of them.
    rc, lines = run_wrapper(
        standin, "--duration", "1", "--stts", "0", STANDIN_GPUS="4", CUDA_VISIBLE_DEVICES="3,2,1,0"
    )
    summaries = [m for m in lines if m["type"] == "summary"]
    assert rc == 0 and [m["verdict"] for m in summaries] == ["OK"] * 4
    assert [(m["gpu"], m["temp"]) for m in summaries] == [
        ("3", 43),
        ("2", 42),
        ("1", 41),
        ("0", 40),
    ]
    rc, lines = run_wrapper(
        standin, "--duration", "1", "--stts", "0", STANDIN_GPUS="4", CUDA_VISIBLE_DEVICES="2"
    )
    assert rc == 0 and lines[-1]["gpu"] == "2" and lines[-1]["temp"] is None


def test_runner_bf16_burns_fp32_and_says_so(standin: Path) -> None:
    rc, lines = run_wrapper(standin, "--duration", "1", "--stts", "0", "--dtype", "bf16")
    assert rc == 0 and recorded(standin)["argv"] == ["-m", "90%", "-stts", "0", "1"]
    steps = [m["message"] for m in lines if m["type"] == "step"]
    assert (
        "gpu-burn has no bf16 GEMM: it burns fp32 (the torch engine burns bf16 and fp16)" in steps
    )
    assert {m["dtype"] for m in lines if m["type"] in ("progress", "summary")} == {"fp32"}
    rc, lines = run_wrapper(standin, "--duration", "1", "--stts", "0", "--dtype", "tf32")
    assert recorded(standin)["argv"] == ["-m", "90%", "-tc", "-stts", "0", "1"]
    assert lines[-1]["dtype"] == "tf32"  # from its "using Tensor Cores" line


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            out.append(int(entry))
    return out


def test_runner_without_compare_file_or_binary_says_so(tmp_path: Path) -> None:
    lonely = Path(gpuburn_standin.install(tmp_path / "lonely", compare=False))
    rc, lines = run_wrapper(lonely)
    assert rc == 3 and "no compare.fatbin or compare.ptx next to" in lines[-1]["reason"]
    rc, lines = run_wrapper(tmp_path / "nothing")
    assert rc == 3 and "is not an executable gpu_burn" in lines[-1]["reason"]


def test_stopping_the_runner_kills_the_whole_gpu_burn_group(standin: Path) -> None:
    proc = subprocess.Popen(
        wrapper_argv(standin, "--duration", "600"),
        stdout=subprocess.PIPE,
        text=True,
        env=standin_env(standin),
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if json.loads(line)["type"] == "progress":
                break
        group = recorded(standin)["pid"]
        assert len(group_members(group)) == 3  # gpu-burn, its worker, its temperature reader
        proc.send_signal(signal.SIGTERM)
        rest = [json.loads(x) for x in proc.stdout]
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()
    assert rest[-1]["verdict"] is None
    assert rest[-1]["reason"] == "stopped before gpu-burn's final summary"
    wait_until(lambda: not group_members(group), 10, "gpu-burn's group to be gone")


def test_runner_builds_from_source_reporting_each_step(tmp_path: Path) -> None:
    # No gpu_burn anywhere: the runner finds the toolkit (nvcc on PATH), builds, then runs.
    src = burn_source(tmp_path / "gpu-burn-src")
    top = cuda_toolkit(tmp_path, "opt/cuda-12.6")
    env = node_env({"HOME": str(tmp_path / "home")})
    env["PATH"] = f"{top / 'bin'}{os.pathsep}{env['PATH']}"
    argv = [sys.executable, "-m", "gpuctl.workloads.gpuburn", "run", "--source", str(src)]
    proc = subprocess.run(
        [*argv, "--duration", "1", "--stts", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    steps = [m["message"] for m in lines if m["type"] == "step"]
    builds = tmp_path / "home" / ".cache" / "gpuctl" / "gpu-burn"
    assert steps[0] == f"CUDA toolkit {top} (found by nvcc on PATH: {top}/bin/nvcc)"
    assert steps[1].startswith(f"building: make CUDAPATH={top} in {builds}/gpu-burn-")
    assert steps[2].startswith(f"built {builds}/gpu-burn-")
    binary = steps[2].removeprefix("built ")
    assert steps[3] == f"running {binary} -m 90% -stts 1 1"
    assert proc.returncode == 0 and lines[-1]["verdict"] == "OK", proc.stderr
