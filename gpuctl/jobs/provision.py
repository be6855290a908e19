"""VENV2, the interpreter a job's function runs in: provisioned and checked before a submit.

``EnvSpec`` describes a VENV2 for gpuctl to build (Python ``X.Y`` plus packages, cached on the
host by content hash); ``Venv2`` resolves the one a target uses (an existing interpreter, or the
built one), probes it once, and refuses with a ``JobFailed`` report when its Python minor version
or its cloudpickle cannot load this process's pickles. ``RUNNER_FILES`` and ``write_runner``
are the runner (supervisor, worker and the job-folder contract) that every job folder and every
built environment gets.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import re
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from gpuctl import bundle
from gpuctl.core import wire
from gpuctl.jobs.errors import JobFailed
from gpuctl.jobs.hosts import Host
from gpuctl.jobs.job import SUBMITTER_PYTHON
from gpuctl.jobs.records import BuildResult, Probe
from gpuctl.jobs.report import KINDS, REMEDIES, FailureReport, version_remedy
from gpuctl.node import jobfiles
from gpuctl.node.readers import bindings

log = logging.getLogger(__name__)

PACKAGE = Path(__file__).resolve().parent.parent
# Copied into every job folder (path there -> source): the scripts and the contract they import.
RUNNER_FILES = {name: PACKAGE.parent / src for name, src in jobfiles.RUNNER.items()}


def write_runner(host: Host, folder: str, *, nvml: bool = False) -> None:
    """Copy the runner (``jobfiles.RUNNER``: the scripts and the package they import) into
    ``folder``, the supervisor last: a folder holding it is complete. ``nvml`` adds the pynvml
    the bundle carries (330 KB; for a supervisor that picks GPUs, ``gpus=`` outside Slurm, on a
    node whose Python has no pynvml)."""
    package = f"{folder}/{jobfiles.RUNNER_PACKAGE}"
    host.mkdir(package, 0o700)
    host.mkdir(f"{package}/readers", 0o700)
    # the pynvml the bundle carries: the supervisor reads GPUs (gpus=) on a node without one
    vendored = bundle.vendored() if nvml else []
    if vendored:
        host.mkdir(f"{package}/{bindings.VENDOR}", 0o700)
    for name, data in vendored:
        host.write_bytes(f"{package}/{bindings.VENDOR}/{name}", data, 0o600)
    for name, data in _runner_bytes():
        host.write_bytes(f"{folder}/{name}", data, 0o600)


def shared_runner(host: Host, root: str) -> str:
    """The runner for many job folders (a Slurm map's chunks, where Slurm picks the GPUs):
    ``root/runner-<hash of its files>``, written once per version (the supervisor last: a
    folder holding it is complete); returns its path."""
    digest = hashlib.sha256()
    for name, data in sorted(_runner_bytes()):
        digest.update(name.encode() + b"\0" + data + b"\0")
    runner = f"{root}/runner-{digest.hexdigest()[:12]}"
    if not host.touch(runner, when=f"{runner}/{jobfiles.SUPERVISOR_SCRIPT}"):
        host.mkdir(runner, 0o700)
        write_runner(host, runner)
    return runner


@functools.cache
def _runner_bytes() -> tuple[tuple[str, bytes], ...]:
    """The runner's files (name in the folder, content), the supervisor last; read once per
    process (a map writes them into every chunk's folder)."""
    order = sorted(RUNNER_FILES.items(), key=lambda i: i[0] == jobfiles.SUPERVISOR_SCRIPT)
    return tuple((name, src.read_bytes()) for name, src in order)


class EnvSpecError(ValueError):
    """A requirements, pyproject or environment file that cannot be used (one line)."""


@dataclass(frozen=True)
class EnvSpec:
    """A VENV2 to provision on the node: Python ``X.Y`` plus pip packages.

    ``system_site_packages`` lets the environment see the base interpreter's packages (fast to
    build when the node already has them). ``methods`` is the order to try (uv, conda, venv).
    ``requirements`` is the text of a requirements file (``-r``-style lines, installed after
    ``packages``); ``conda_env`` the text of a conda ``environment.yml``, which only
    conda, mamba or micromamba build. Both are part of the environment's content hash. The
    ``from_requirements``, ``from_pyproject`` and ``from_conda`` constructors read them from
    files here (nothing is read on the node).
    """

    python: str = f"{sys.version_info[0]}.{sys.version_info[1]}"
    packages: tuple[str, ...] = ()
    system_site_packages: bool = False
    methods: tuple[str, ...] = ("uv", "conda", "venv")
    base_python: str | None = None  # the interpreter ``venv`` copies (default: python3.X)
    requirements: str = ""
    conda_env: str = ""

    @classmethod
    def from_requirements(cls, path: str | Path, **options: Any) -> EnvSpec:
        """A VENV2 with what ``requirements.txt`` at ``path`` lists (its text travels; a
        ``-r other.txt`` line inside it must name a file that exists on the node)."""
        return cls(requirements=_read(path, "requirements file"), **options)

    @classmethod
    def from_pyproject(
        cls, path: str | Path, extras: Sequence[str] = (), **options: Any
    ) -> EnvSpec:
        """A VENV2 with ``[project] dependencies`` of the ``pyproject.toml`` at ``path``, plus
        its ``optional-dependencies`` named in ``extras``; ``requires-python`` is checked
        against ``python=`` (default this Python)."""
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            import tomli as tomllib

        text = _read(path, "pyproject file")
        try:
            project = tomllib.loads(text).get("project") or {}
        except tomllib.TOMLDecodeError as e:
            raise EnvSpecError(f"{path}: not valid TOML ({e})") from None
        deps = list(project.get("dependencies") or [])
        optional = project.get("optional-dependencies") or {}
        for extra in extras:
            if extra not in optional:
                known = ", ".join(sorted(optional)) or "none"
                raise EnvSpecError(f"{path}: no optional dependencies {extra!r} (has: {known})")
            deps += list(optional[extra])
        spec = cls(**{**options, "packages": (*options.get("packages", ()), *deps)})
        wanted = str(project.get("requires-python") or "")
        if wanted and not _python_ok(spec.python, wanted):
            raise EnvSpecError(
                f"{path} requires Python {wanted}, and the environment asks for Python "
                f"{spec.python}"
            )
        return spec

    @classmethod
    def from_conda(cls, path: str | Path, **options: Any) -> EnvSpec:
        """A VENV2 built by conda, mamba or micromamba (whichever the node has) from the
        ``environment.yml`` at ``path``; cloudpickle is then pip-installed into it, pinned."""
        options.setdefault("methods", ("conda",))
        return cls(conda_env=_read(path, "conda environment file"), **options)

    def pinned_packages(self) -> list[str]:
        """The packages with cloudpickle pinned to this submitter's version (added if absent):
        a payload only loads with the cloudpickle that wrote it."""
        pin = f"cloudpickle=={cloudpickle.__version__}"
        out = [pin if p.strip().lower() == "cloudpickle" else p for p in self.packages]
        if not any(p.strip().lower().startswith("cloudpickle") for p in out):
            out.insert(0, pin)
        return out


def _read(path: str | Path, what: str) -> str:
    try:
        return Path(path).expanduser().read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise EnvSpecError(f"cannot read {what} {path}: {why}") from None


def _python_ok(version: str, spec: str) -> bool:
    """Whether Python ``version`` ("3.11") satisfies ``requires-python`` (">=3.10,<3.13")."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(spec).contains(f"{version}.0", prereleases=True) or SpecifierSet(
            spec
        ).contains(f"{version}.99", prereleases=True)
    except InvalidSpecifier:
        raise EnvSpecError(f"requires-python {spec!r} is not a version specifier") from None


def payload_modules(noted: set[str]) -> set[str]:
    """The modules unpickling a payload imports (``noted`` by ``sources.PayloadPickler``),
    less those pickled by value (the user's, gpuctl's own helpers), which VENV2 never
    imports."""
    by_value = cloudpickle.list_registry_pickle_by_value()
    return {m for m in noted if not any(m == b or m.startswith(b + ".") for b in by_value)}


@functools.cache
def _distributions_of() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def dist_key(name: str) -> str:
    """A distribution's name as pip compares them (``Foo_bar`` -> ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def payload_distributions(modules: set[str]) -> dict[str, list[str]]:
    """Top-level module -> [distribution, version here] for the installed distributions whose
    modules are in ``modules`` (cloudpickle is checked on its own)."""
    found: dict[str, list[str]] = {}
    for top in sorted({m.split(".")[0] for m in modules}):
        for dist in _distributions_of().get(top, ()):
            if dist_key(dist) == "cloudpickle":
                continue
            try:
                found[top] = [dist, importlib.metadata.version(dist)]
            except importlib.metadata.PackageNotFoundError:
                continue
            break
    return found


def _major(version: str) -> str:
    return re.split(r"[.+!-]", version.strip(), maxsplit=1)[0]


# Run in VENV2: which of the modules named on stdin (a JSON list) it cannot find.
_FIND_MODULES = (
    "import importlib.util, json, sys\n"
    "def gone(name):\n"
    "    try:\n"
    "        return importlib.util.find_spec(name) is None\n"
    "    except Exception:\n"
    "        return True\n"
    "print(json.dumps([m for m in json.load(sys.stdin) if gone(m)]))\n"
)


# Prints VENV1's version; Python 2 reads it too (so its version can be named).
VENV1_PROBE = "import sys; print('%d.%d.%d' % tuple(sys.version_info[:3]))"


class Venv2:
    """The VENV2 of one target: ``python`` (an existing interpreter on ``host``) or ``spec`` (one
    to build under ``env_root`` with ``supervisor_python``, VENV1), probed once.

    ``verify=False`` skips the probe and the version checks (only to exercise the node-side
    checks): the probe is then just the path.
    """

    def __init__(
        self,
        host: Host,
        target: str,
        *,
        python: str | None,
        spec: EnvSpec | None,
        env_root: str,
        supervisor_python: str,
        verify: bool,
        probe_venv1: bool = True,
    ) -> None:
        self.host = host
        self.probe_venv1 = probe_venv1
        self.target = target
        self.python = python
        self.spec = spec
        self.env_root = env_root
        self.supervisor_python = supervisor_python
        self.verify = verify
        self._probe: Probe | None = None
        self._unresolved_cache: dict[tuple[str, ...], list[str]] = {}
        self._lock = threading.Lock()

    def probe(self) -> Probe:
        """Resolve (and build if asked) VENV2; return its probe ``{python, cloudpickle, ...}``.

        Raises ``JobFailed`` (env_build_failed, venv2_wont_start, python_mismatch,
        cloudpickle_mismatch, module_missing) with a remedy that says exactly what to do.
        """
        with self._lock:
            if self._probe is not None:
                return self._probe
            if self.spec is not None:
                probe = self._build(self.spec)
            elif not self.verify:
                assert self.python is not None
                probe = {"path": self.python}
            else:
                assert self.python is not None
                probe = self._run_probe(self.python)
            if self.verify:
                self._check_versions(probe)
                if self.probe_venv1:
                    self._check_venv1()
            self._probe = probe
            return probe

    def check_distributions(self, modules: set[str], dists: Mapping[str, list[str]]) -> None:
        """Refuse a payload that will not unpickle in VENV2 for a version's sake: it holds
        objects of a distribution whose major version differs there (``dists``:
        ``payload_distributions``), and a module it names (``modules``: ``payload_modules``) is
        not in that version (numpy 2 here, 1 there: ``numpy._core``). A major version that
        still has them passes (numpy 1 here, 2 there). Raises ``JobFailed``
        (version_mismatch)."""
        if not self.verify or not dists:
            return
        there = self._distributions()
        for top, (dist, here) in sorted(dists.items()):
            theirs = there.get(dist_key(dist))
            if not theirs or _major(theirs) == _major(here):
                continue
            missing = self._unresolved(sorted(m for m in modules if m.split(".")[0] == top))
            if not missing:
                continue
            path = (self._probe or {}).get("path") or self.python or "VENV2"
            raise JobFailed(
                provision_report(
                    "version_mismatch",
                    [
                        f"the payload holds {dist} objects: {dist} {here} here, {theirs} in "
                        f"VENV2 {path} on {self.target}; they refer to {missing[0]!r}, which "
                        f"{dist} {theirs} does not have"
                    ],
                    remedy=version_remedy(dist, here, theirs, str(path)),
                )
            )

    def _unresolved(self, modules: list[str]) -> list[str]:
        """Which of ``modules`` VENV2 cannot find (asked once per list: rare, only for a
        distribution whose major version differs)."""
        key = tuple(modules)
        with self._lock:
            if key not in self._unresolved_cache:
                path = str((self._probe or {}).get("path") or self.python)
                rc, out, _ = self.host.run(
                    [path, "-c", _FIND_MODULES], timeout=120, stdin=json.dumps(modules).encode()
                )
                try:
                    found = json.loads(out.decode().strip().splitlines()[-1]) if rc == 0 else []
                except (ValueError, IndexError):
                    found = []
                self._unresolved_cache[key] = [str(m) for m in found if isinstance(m, str)]
            return self._unresolved_cache[key]

    def _distributions(self) -> dict[str, str]:
        """VENV2's distributions (pip's names -> version), from its probe (probed again when the
        probe predates the field: a VENV2 built by an older gpuctl)."""
        probe = self.probe()
        with self._lock:
            if "dists" not in probe and probe.get("path"):
                probe["dists"] = self._run_probe(str(probe["path"])).get("dists") or {}
            return {dist_key(k): v for k, v in (probe.get("dists") or {}).items()}

    def _check_venv1(self) -> None:
        """VENV1 must be a Python 3.6 or newer: a supervisor that cannot start would leave the job
        "lost" with nothing to say why. Raises ``JobFailed`` (venv1_wont_start)."""
        python = self.supervisor_python
        rc, out, err = self.host.run([python, "-c", VENV1_PROBE], timeout=60)
        if rc == 127:  # not there at all: the start names it, with the setting to change
            return
        lines = out.decode("utf-8", "replace").strip().splitlines()
        version = lines[-1] if lines else ""
        if rc != 0 or not re.fullmatch(r"\d+\.\d+\.\d+", version):
            raise JobFailed(
                provision_report(
                    "venv1_wont_start",
                    [
                        f"VENV1 {python} on {self.target} does not run as a Python: exit {rc}"
                        + (f", printed {version[:80]!r}" if version else ""),
                        *(err.decode("utf-8", "replace").strip().splitlines()[-3:]),
                    ],
                )
            )
        if tuple(int(x) for x in version.split(".")[:2]) < (3, 6):
            raise JobFailed(
                provision_report(
                    "venv1_wont_start",
                    [
                        f"VENV1 {python} on {self.target} is Python {version}: the supervisor "
                        "needs Python 3.6 or newer"
                    ],
                )
            )

    def _run_probe(self, python: str) -> Probe:
        from gpuctl.node.envbuild import _PROBE

        rc, out, err = self.host.run([python, "-c", _PROBE], timeout=120)
        text = out.decode("utf-8", "replace").strip()
        if rc != 0 or not text:
            raise JobFailed(
                provision_report(
                    "venv2_wont_start",
                    [
                        f"{python} on {self.target} does not run: exit {rc}",
                        *(err.decode("utf-8", "replace").strip().splitlines()[-5:]),
                    ],
                )
            )
        probe = wire.parse(Probe, json.loads(text.splitlines()[-1])) or {}
        probe.setdefault("executable", python)
        probe["path"] = python
        return probe

    def _build(self, spec: EnvSpec) -> Probe:
        host = self.host
        root = host.expand(self.env_root)
        host.mkdir(root, 0o700)
        runner = shared_runner(host, root)
        sup = f"{runner}/{jobfiles.SUPERVISOR_SCRIPT}"
        spec_json = {
            "root": root,
            "python": spec.python,
            "packages": spec.pinned_packages(),
            "system_site_packages": spec.system_site_packages,
            "methods": list(spec.methods),
            "base_python": spec.base_python,
            "requirements": spec.requirements,
            "conda_env": spec.conda_env,
        }
        spec_path = f"{root}/spec-{uuid.uuid4().hex[:12]}.json"
        host.write_bytes(spec_path, json.dumps(spec_json).encode())
        try:
            rc, out, err = host.run(
                [self.supervisor_python, sup, "--build-env", spec_path], timeout=3600
            )
        finally:
            host.run(["rm", "-f", spec_path], timeout=30)
        try:
            result = wire.parse(BuildResult, json.loads(out.decode().strip().splitlines()[-1]))
        except (ValueError, IndexError):
            result = None
        if result is None:
            result = {
                "ok": False,
                "error": f"the builder printed nothing (exit {rc})",
                "log_tail": err.decode("utf-8", "replace")[-3000:],
            }
        if not result.get("ok"):
            tail = str(result.get("log_tail") or "").strip().splitlines()[-12:]
            raise JobFailed(
                provision_report(
                    "env_build_failed",
                    [
                        f"building Python {spec.python} with {spec.pinned_packages()}"
                        f" on {self.target}: {result.get('error')}",
                        *(f"| {line}" for line in tail),
                    ],
                    logs={"build log": str(result.get("log", ""))},
                )
            )
        probe = result.get("probe", Probe()).copy()
        probe["path"] = result["python"]
        probe["env_key"] = result.get("key")
        probe["method"] = result.get("method")
        probe["notes"] = list(result.get("notes") or [])
        for note in probe["notes"]:
            log.warning("VENV2 on %s: %s (build log %s)", self.target, note, result.get("log"))
        return probe

    def _check_versions(self, probe: Probe) -> None:
        have = list(probe.get("python") or [])[:2]
        want = list(sys.version_info[:2])
        path = probe.get("path")
        if have != want:
            hv = ".".join(str(x) for x in probe.get("python") or [])
            raise JobFailed(
                provision_report(
                    "python_mismatch",
                    [
                        f"VENV2 {path} on {self.target} runs Python {hv}, this gpuctl runs Python "
                        f"{SUBMITTER_PYTHON}: cloudpickled functions only load on"
                        " the"
                        " same minor version"
                    ],
                    remedy=f"use env=EnvSpec(python='{want[0]}.{want[1]}', packages=[...]) to let "
                    f"gpuctl build a Python {want[0]}.{want[1]} VENV2, or python=<a Python "
                    f"{want[0]}.{want[1]} interpreter on {self.target}>, or run gpuctl itself"
                    " under "
                    f"Python {have[0] if have else '?'}.{have[1] if len(have) > 1 else '?'}",
                )
            )
        cp = probe.get("cloudpickle")
        if not cp:
            raise JobFailed(
                provision_report(
                    "module_missing",
                    [f"VENV2 {path} on {self.target} has no cloudpickle"],
                    remedy=f"{path} -m pip install cloudpickle=={cloudpickle.__version__}, or use "
                    "env=EnvSpec(...) which installs it",
                )
            )
        if str(cp).split(".")[:2] != cloudpickle.__version__.split(".")[:2]:
            raise JobFailed(
                provision_report(
                    "cloudpickle_mismatch",
                    [
                        f"VENV2 {path} has cloudpickle {cp},"
                        f" this gpuctl has {cloudpickle.__version__}"
                    ],
                    remedy=f"{path} -m pip install cloudpickle=={cloudpickle.__version__}",
                )
            )


def provision_report(
    kind: str,
    evidence: list[str],
    *,
    remedy: str | None = None,
    logs: Mapping[str, str] | None = None,
) -> FailureReport:
    """The report of a job refused before it was submitted (phase ``provision``)."""
    assert kind in KINDS
    return FailureReport(
        kind=kind,
        phase="provision",
        evidence=tuple(evidence),
        remedy=remedy or REMEDIES[kind],
        logs=dict(logs or {}),
        job_id="(not submitted)",
    )
