"""The stand-in ``libnvidia-ml.so.1``: build it with gcc and script it (see the C file's header).

The real nvidia-ml-py loads it with ``CDLL("libnvidia-ml.so.1")``: a subprocess finds it through
``LD_LIBRARY_PATH`` (``NvmlStub.env()``); inside the test process, where ``LD_LIBRARY_PATH`` was
read at start-up, ``NvmlStub.preload()`` loads it by path first and the dynamic loader hands the
already-loaded library to pynvml because its soname matches.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
from pathlib import Path

from gpuctl_tests.helpers import node_env, require_binary

SOURCE = Path(__file__).with_name("libnvidia_ml_stub.c")
LIB_NAME = "libnvidia-ml.so.1"
CONFIG_ENV = "GPUCTL_NVML_STUB"


def build(cache_root: Path) -> Path:
    """Compile the stub under ``cache_root`` once per source version; returns the folder of
    ``libnvidia-ml.so.1``. Skips the test locally (fails in CI) when gcc is missing."""
    require_binary("gcc")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    out = cache_root / f"nvml-stub-{digest}"
    lib = out / LIB_NAME
    if lib.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{LIB_NAME}.{os.getpid()}"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Werror",
            f"-Wl,-soname,{LIB_NAME}",
            "-o",
            str(tmp),
            str(SOURCE),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    os.replace(tmp, lib)  # atomic: a concurrent build never sees half a library
    return out


class NvmlStub:
    """One scripted stand-in NVML: a built library folder plus this test's config file."""

    def __init__(self, lib_dir: Path, config: Path, text: str = "count 2\n") -> None:
        self.lib_dir = lib_dir
        self.config = config
        self._handle: ctypes.CDLL | None = None
        self.configure(text)

    @property
    def lib(self) -> Path:
        return self.lib_dir / LIB_NAME

    def configure(self, text: str) -> None:
        """Write the script; the library reads it on the next ``nvmlInit``."""
        self.config.write_text(text)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for an agent subprocess that finds this stub as its NVML."""
        env = node_env(extra)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(self.lib_dir), env.get("LD_LIBRARY_PATH")) if p
        )
        env[CONFIG_ENV] = str(self.config)
        return env

    def preload(self) -> None:
        """Load the stub into this process so that pynvml's ``CDLL`` finds it by soname.

        Without ``$GPUCTL_NVML_STUB`` the stub reports "driver not loaded", so later tests in
        this process that expect no NVIDIA driver still see none.
        """
        self._handle = ctypes.CDLL(str(self.lib), mode=ctypes.RTLD_GLOBAL)

    def set(self, gpu: int, field: str, value: int) -> None:
        """Change one reading of a preloaded stub while NVML is open (in-process tests)."""
        assert self._handle is not None, "preload() first"
        fn = self._handle.gpuctl_stub_set
        fn.argtypes = [ctypes.c_uint, ctypes.c_char_p, ctypes.c_longlong]
        if fn(gpu, field.encode(), value) != 0:
            raise ValueError(f"stub has no GPU {gpu} or field {field!r}")

    def calls(self, gpu: int, function: str) -> int:
        """How often the preloaded stub's device ``function`` (its C name, e.g.
        ``"nvmlDeviceGetFanSpeed"``) was called for ``gpu`` since the last ``nvmlInit``."""
        assert self._handle is not None, "preload() first"
        fn = self._handle.gpuctl_stub_calls
        fn.argtypes = [ctypes.c_uint, ctypes.c_char_p]
        fn.restype = ctypes.c_long
        n: int = fn(gpu, function.encode())
        return n
