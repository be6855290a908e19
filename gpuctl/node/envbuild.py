"""The VENV2 environment builder: ``supervisor.py --build-env SPEC.json`` (``build_env``).

Builds a Python ``X.Y`` environment with the job's packages once per content hash
(``env_key``), by the first way the node has: uv (handed pip's package index settings, so a
site's mirror configured for pip serves uv too: ``uv_index_options``), conda/mamba/micromamba,
or ``python -m venv`` with an interpreter on PATH or in pyenv. A file lock serialises builders;
the new environment is probed (its Python version, cloudpickle and distributions) before it is
marked ready. Standard library only, Python 3.6: it runs under the node's system Python.
"""

import configparser
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from typing import Any, Dict, List, Optional, Tuple

from . import jobfiles


def env_key(python_version: str, packages: List[str], system_site_packages: bool = False,
            base_python: Optional[str] = None, requirements: str = "",
            conda_env: str = "") -> str:
    """Content hash naming an environment: the same (Python, packages, files) is built once."""
    blob = json.dumps([str(python_version), sorted(packages), bool(system_site_packages)]
                      + ([base_python] if base_python else [])
                      + ([["requirements", requirements]] if requirements else [])
                      + ([["conda_env", conda_env]] if conda_env else []))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _find_python(version: str) -> Optional[str]:
    """An interpreter of ``version`` (e.g. "3.11"): python3.11 on PATH, else pyenv's."""
    found = shutil.which("python%s" % version)
    if found:
        return found
    base = os.path.expanduser("~/.pyenv/versions")
    try:
        names = sorted(os.listdir(base), reverse=True)
    except OSError:
        names = []
    for name in names:
        if name == version or name.startswith(version + "."):
            candidate = os.path.join(base, name, "bin", "python")
            if os.path.exists(candidate):
                return candidate
    return None


# ``dists``: every distribution's version (pip's name), for the login side to compare with
# the versions of the distributions a payload holds objects of (numpy 1 against 2).
_PROBE = ("import sys, json\n"
          "try:\n import cloudpickle; cp = cloudpickle.__version__\n"
          "except Exception: cp = None\n"
          "try:\n import importlib.metadata as md\n"
          " ds = dict((d.metadata['Name'], d.version) for d in md.distributions()"
          " if d.metadata['Name'])\n"
          "except Exception: ds = {}\n"
          "print(json.dumps({'python': list(sys.version_info[:3]), 'cloudpickle': cp, "
          "'executable': sys.executable, 'dists': ds}))\n")


def probe(python: str) -> Dict[str, Any]:
    """Run a fixed probe in ``python``: its version and cloudpickle version, or an error."""
    try:
        out = subprocess.check_output([python, "-c", _PROBE], stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, timeout=120)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        text = getattr(e, "output", None)
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return {"error": "%s: %s" % (type(e).__name__, e), "output": text or ""}
    try:
        found = json.loads(out.decode().strip().splitlines()[-1])
        return found if isinstance(found, dict) else {"error": "probe printed %r" % (found,)}
    except (ValueError, IndexError):
        return {"error": "probe printed no JSON", "output": out.decode("utf-8", "replace")}


def build_env(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Build (once) the VENV2 environment ``spec`` describes; return a result dict.

    spec: {"root": dir, "python": "3.11", "packages": [...], "system_site_packages": bool,
    "methods": ["uv", "conda", "venv"], "requirements": text of a requirements file,
    "conda_env": text of an environment.yml}. The files are written beside the folder
    (``<key>.requirements.txt``, ``<key>.environment.yml``) for the tools to read. The folder is ``root/<key>``; a file lock serialises
    builders; ``.gpuctl-ready`` marks a build whose probe succeeded. Result: {"ok": true,
    "python": path, "key", "method", "probe"} or {"ok": false, "error", "log"}.
    """
    root = os.path.expanduser(spec["root"])
    version = str(spec["python"])
    packages = list(spec.get("packages") or [])
    ssp = bool(spec.get("system_site_packages"))
    base = spec.get("base_python")
    requirements = str(spec.get("requirements") or "")
    conda_env = str(spec.get("conda_env") or "")
    key = env_key(version, packages, ssp, base, requirements, conda_env)
    os.makedirs(root, exist_ok=True)
    envdir = os.path.join(root, key)
    log_path = envdir + ".log"
    ready = os.path.join(envdir, ".gpuctl-ready")
    result = {"key": key, "dir": envdir, "log": log_path,
              "python": os.path.join(envdir, "bin", "python")}  # type: Dict[str, Any]
    with open(envdir + ".lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if os.path.exists(ready):
            info = jobfiles.read_json(ready, {})
            result.update(ok=True, method=info.get("method"), probe=info.get("probe"),
                          cached=True, notes=info.get("notes") or [])
            return result
        if os.path.isdir(envdir):
            shutil.rmtree(envdir, ignore_errors=True)
        files = {}  # type: Dict[str, str]
        for name, text in (("requirements.txt", requirements), ("environment.yml", conda_env)):
            if text:
                files[name] = "%s.%s" % (envdir, name)
                with open(files[name], "w") as f:
                    f.write(text)
        notes = []  # type: List[str]
        with open(log_path, "w") as log:
            method, ok = _build(envdir, version, packages, ssp, spec.get("methods"), log, base,
                                files.get("requirements.txt"), files.get("environment.yml"),
                                notes)
        if not ok:
            shutil.rmtree(envdir, ignore_errors=True)
            result.update(ok=False, method=method, error="environment build failed (%s)" % method,
                          log_tail=jobfiles.tail(log_path, 3000))
            return result
        info = probe(result["python"])
        want = [int(x) for x in version.split(".")]
        if "error" in info or info.get("python", [])[:len(want)] != want:
            result.update(ok=False, method=method, probe=info,
                          error="probe of the new environment failed: %s" % (
                              info.get("error") or "python %s, wanted %s" % (
                                  info.get("python"), version)),
                          log_tail=jobfiles.tail(log_path, 3000))
            return result
        if notes:
            notes = [n + ": it has cloudpickle %s" % info.get("cloudpickle") for n in notes]
        jobfiles.write_json(ready, {"method": method, "probe": info, "built_at": time.time(),
                                    "spec": spec, "notes": notes})
        result.update(ok=True, method=method, probe=info, cached=False, notes=notes)
        return result


def _step(argv: List[str], log: Any, env: Optional[Dict[str, str]] = None) -> bool:
    log.write("$ %s\n" % " ".join(argv))
    log.flush()
    try:
        rc = subprocess.call(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                             env=dict(os.environ, **env) if env else None)
    except OSError as e:
        log.write("cannot run %s: %s\n" % (argv[0], e))
        rc = 127
    log.write("# exit %d\n" % rc)
    log.flush()
    return rc == 0


def _tool(name: str) -> Optional[str]:
    """``name`` on PATH, else where its installer puts it (a non-login shell over SSH often lacks
    ``~/.local/bin`` on PATH)."""
    found = shutil.which(name)
    if found:
        return found
    for folder in ("~/.local/bin", "~/.cargo/bin", "~/micromamba/bin", "~/miniforge3/bin",
                   "~/mambaforge/bin", "~/miniconda3/bin", "~/anaconda3/bin"):
        candidate = os.path.join(os.path.expanduser(folder), name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


CONDA_TOOLS = ("micromamba", "mamba", "conda")


def conda_create_argv(tool: str, envdir: str, version: str,
                      env_file: Optional[str]) -> List[str]:
    """The command that makes a conda environment at ``envdir``: from ``env_file`` (an
    environment.yml) when there is one, else Python ``version`` and pip."""
    name = os.path.basename(tool)
    if env_file:
        if name == "micromamba":
            return [tool, "create", "-y", "-q", "-p", envdir, "-f", env_file]
        return [tool, "env", "create", "-q", "-p", envdir, "-f", env_file]
    return [tool, "create", "-y", "-q", "-p", envdir, "python=%s" % version, "pip"]


def _build(envdir: str, version: str, packages: List[str], ssp: bool,
           methods: Optional[List[str]], log: Any,
           base_python: Optional[str] = None, requirements: Optional[str] = None,
           conda_env: Optional[str] = None,
           notes: Optional[List[str]] = None) -> Tuple[str, bool]:
    """Build the environment with the first method of ``methods`` this node has; uv that
    cannot install (its index unreachable, say) hands over to the next method. ``notes``
    gathers what the user should hear about (a relaxed pin)."""
    methods = list(methods or ("uv", "conda", "venv"))
    notes = notes if notes is not None else []
    py = os.path.join(envdir, "bin", "python")
    extra = ["-r", requirements] if requirements else []
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    tried = []  # type: List[str]
    failed = None  # type: Optional[str]
    if conda_env:
        methods = [m for m in methods if m == "conda"]
        if not methods:
            tried.append("an environment.yml needs the conda method")
    for method in methods:
        uv = _tool("uv") if method == "uv" else None
        if uv:
            wanted = os.path.expanduser(base_python) if base_python else version
            argv = [uv, "venv", "-q", "--python", wanted, envdir]
            if ssp:
                argv.insert(2, "--system-site-packages")
            flags, env, lines = uv_index_options(dict(os.environ))
            for line in lines:
                log.write(line + "\n")
            ok = _step(argv, log) and (not (packages or extra) or _install(
                [uv, "pip", "install", "-q", "--python", py] + flags, packages, extra, log,
                notes, env))
            if ok:
                return "uv", True
            failed = "uv"
            tried.append("uv failed (above)")
            log.write("# uv could not build the environment: trying the next way\n")
            shutil.rmtree(envdir, ignore_errors=True)
            continue
        conda = None
        if method == "conda":
            conda = next((t for t in map(_tool, CONDA_TOOLS) if t), None)
        if conda:
            # The env's own bin/python installs pip packages: no `conda run`, no activation.
            ok = _step(conda_create_argv(conda, envdir, version, conda_env), log) and (
                not (packages or extra) or _install(pip, packages, extra, log, notes))
            return os.path.basename(conda), ok
        if method == "venv":
            base = os.path.expanduser(base_python) if base_python else _find_python(version)
            if base is None:
                tried.append("no python%s on PATH or in ~/.pyenv" % version)
                continue
            argv = [base, "-m", "venv", envdir]
            if ssp:
                argv.insert(3, "--system-site-packages")
            ok = _step(argv, log) and (not (packages or extra) or _install(
                pip, packages, extra, log, notes))
            return "venv", ok
        tried.append("%s not found" % ("/".join(CONDA_TOOLS) if method == "conda" else method))
    log.write("no way to build Python %s here: %s\n" % (version, "; ".join(tried)))
    return failed or "none", False

# --- pip's configuration, for uv ---------------------------------------------------------------

# pip's settings that say where packages come from, and the `uv pip install` flag of each.
PIP_TO_UV = (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"),
             ("find-links", "--find-links"), ("trusted-host", "--allow-insecure-host"),
             ("constraint", "--constraint"))
# What says that uv was configured for this site itself: then pip's settings are not handed on.
UV_OWN = ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS",
          "UV_NO_INDEX", "UV_CONFIG_FILE")


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def other_tools_config_dirs(environ: Dict[str, str]) -> Tuple[str, str, List[str]]:
    """Where the node's own tools (pip, uv: not gpuctl, whose files ``gpuctl.paths`` places)
    read their configuration, by the XDG base directory rules: (home, the user's config
    folder, the system's config folders)."""
    home = environ.get("HOME") or os.path.expanduser("~")
    config_home = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    dirs = [d for d in (environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":") if d]
    return home, config_home, dirs


def pip_config_files(environ: Dict[str, str], etc: str = "/etc") -> List[str]:
    """The configuration files ``pip install`` reads, in pip's order (a later one wins): the
    global ones, the user's (unless PIP_CONFIG_FILE names a file that exists), PIP_CONFIG_FILE;
    none at all when PIP_CONFIG_FILE is os.devnull."""
    named = environ.get("PIP_CONFIG_FILE")
    if named == os.devnull:
        return []
    home, config_home, dirs = other_tools_config_dirs(environ)
    files = [os.path.join(d, "pip", "pip.conf") for d in dirs] + [os.path.join(etc, "pip.conf")]
    if not (named and os.path.exists(named)):
        files += [os.path.join(home, ".pip", "pip.conf"),
                  os.path.join(config_home, "pip", "pip.conf")]
    if named:
        files.append(named)
    return files


def pip_settings(environ: Dict[str, str], etc: str = "/etc") -> Dict[str, str]:
    """pip's configuration for ``pip install`` as pip itself resolves it: the files' [global]
    sections, then their [install] sections, then the PIP_* variables (names as in pip.conf)."""
    parsers = []
    for path in pip_config_files(environ, etc):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        parsers.append(parser)
    settings = {}  # type: Dict[str, str]
    for section in ("global", "install"):
        for parser in parsers:
            if parser.has_section(section):
                for key, value in parser.items(section):
                    settings[key.replace("_", "-")] = value
    for name, value in environ.items():
        if name.startswith("PIP_") and name != "PIP_CONFIG_FILE":
            settings[name[4:].lower().replace("_", "-")] = value
    return settings


def uv_own_settings(environ: Dict[str, str], etc: str = "/etc") -> List[str]:
    """Where uv has index settings of its own (UV_* variables, a uv.toml): named, for the log."""
    found = [name for name in UV_OWN if environ.get(name)]
    _, config_home, dirs = other_tools_config_dirs(environ)
    places = [config_home] + dirs + [etc]
    found += [p for p in (os.path.join(d, "uv", "uv.toml") for d in places) if os.path.exists(p)]
    return found


def uv_index_options(environ: Dict[str, str], etc: str = "/etc"
                     ) -> Tuple[List[str], Dict[str, str], List[str]]:
    """pip's package sources as ``uv pip install`` flags, so that a site whose mirror is
    configured for pip gets the same packages through uv. Returns (flags, environment, lines
    for the build log). Nothing is handed on when uv has settings of its own. ``etc``: where
    the system-wide pip.conf and uv/uv.toml are."""
    own = uv_own_settings(environ, etc)
    if own:
        return [], {}, ["# uv has package index settings of its own (%s): pip's are not handed "
                        "to it" % ", ".join(own)]
    settings = pip_settings(environ, etc)
    flags = []  # type: List[str]
    env = {}  # type: Dict[str, str]
    for key, flag in PIP_TO_UV:
        for value in (settings.get(key) or "").split():
            flags += [flag, value]
    if _truthy(settings.get("no-index", "")):
        flags.append("--no-index")
    # pip takes the best version over all its indexes; uv by default only looks at the first
    # index that has the package (an old mirror's copy would hide the version asked for)
    if settings.get("extra-index-url") and not environ.get("UV_INDEX_STRATEGY"):
        flags += ["--index-strategy", "unsafe-best-match"]
    if settings.get("cert") and not environ.get("SSL_CERT_FILE"):
        env["SSL_CERT_FILE"] = settings["cert"]
    if settings.get("client-cert") and not environ.get("SSL_CLIENT_CERT"):
        env["SSL_CLIENT_CERT"] = settings["client-cert"]
    lines = ["# pip's configuration handed to uv: %s" % " ".join(flags)] if flags else []
    lines += ["# pip's %s handed to uv as %s" % (k, v) for k, v in sorted(env.items())]
    return flags, env, lines


_PIN = re.compile(r"^cloudpickle==(\d+)\.(\d+)(\.[0-9A-Za-z.+-]*)?$")


def _install(argv: List[str], packages: List[str], extra: List[str], log: Any,
             notes: List[str], env: Optional[Dict[str, str]] = None) -> bool:
    """Install ``packages`` (and ``extra``: ``-r FILE``) with ``argv``. When the exact
    cloudpickle pin (the submitter's version) is not on the node's index, take the same minor
    release (a pickle of cloudpickle X.Y loads with any X.Y release) and say so."""
    start = log.tell()
    if _step(argv + packages + extra, log, env):
        return True
    pins = [p for p in packages if _PIN.match(p.strip())]
    if not pins:
        return False
    try:
        with open(log.name) as f:
            f.seek(start)
            said = f.read()
    except (OSError, AttributeError, TypeError):
        said = ""
    pin = pins[0].strip()
    if pin not in said:  # the install failed for another reason
        return False
    m = _PIN.match(pin)
    assert m is not None
    relaxed = "cloudpickle==%s.%s.*" % (m.group(1), m.group(2))
    log.write("# %s is not on this node's package index: taking the same minor release "
              "(%s)\n" % (pin, relaxed))
    notes.append("%s is not on the node's package index: VENV2 got the same minor release "
                 "(%s)" % (pin, relaxed))
    return _step(argv + [relaxed if p is pins[0] else p for p in packages] + extra, log, env)
