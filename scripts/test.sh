#!/usr/bin/env bash
# The README's test command: installs everything the tests need on a fresh Debian machine
# (system packages, the package with its test extra, torch's CPU wheel), then runs the linters
# and the whole test suite. Extra arguments go to pytest.
#
# ``scripts/test.sh --unit``: the developer's lane. No system packages (no apt, sshd, Slurm or
# browser), pip only to make a missing venv, the same linters, and ``pytest --unit``: the tests
# that need none of those, nor a real Python 3.6 job, nor a slow marker (gpuctl_tests/conftest.py
# marks them from the fixtures they use).
set -euo pipefail
cd "$(dirname "$0")/.."

UNIT=""
if [ "${1:-}" = "--unit" ]; then
    UNIT=1
    shift
fi

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
# Everything Python goes into a virtual environment of the repository (override its place with
# GPUCTL_TEST_VENV), so the tests never depend on, or disturb, what the machine has installed.
VENV="${GPUCTL_TEST_VENV:-.venv}"

# The system packages the full lane needs, one a line.
SYSTEM_PACKAGES="
    openssh-server
    openssh-client
    slurm-wlm
    slurm-client
    munge
    tmux
    tcsh
    gcc
    libc6-dev
    iproute2
    procps
    chromium
    chromium-driver
    prometheus
"
if [ -z "$UNIT" ]; then
    echo "== system packages (OpenSSH server, Slurm, munge, tmux, tcsh, gcc, chromium for gpuctl serve, prometheus)"
    export DEBIAN_FRONTEND=noninteractive
    missing=""
    for pkg in $SYSTEM_PACKAGES; do
        dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null | grep -q '^ii' ||
            missing="$missing $pkg"
    done
    if [ -n "$missing" ]; then  # apt-get update only when something is to be installed
        echo "   installing:$missing"
        $SUDO apt-get update -qq
        # shellcheck disable=SC2086  # one word a package
        $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
    fi
fi

echo "== python packages (into $VENV)"
# torch==2.13.0 must be the CPU wheel these machines carry (pip's find-links), never a CUDA build
# from an index: that wheel is for one Python version. The venv is made with python3 (or
# GPUCTL_TEST_PYTHON) when the wheel fits it, else with the first Python here that it fits.
PY="$VENV/bin/python"
cpu_torch_fits() {  # the venv's Python can install torch 2.13.0 from local wheels alone
    "$PY" -m pip install -q --disable-pip-version-check --dry-run --no-deps --no-index \
        'torch==2.13.0' >/dev/null 2>&1
}
install_venv() {
    if [ ! -x "$PY" ] || ! cpu_torch_fits; then
        found=""
        for cand in "${GPUCTL_TEST_PYTHON:-python3}" python3.11 python3.12 python3.13 python3.10 \
                "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[0-9]*/bin/python; do
            command -v "$cand" >/dev/null 2>&1 || continue
            rm -rf "$VENV"
            "$cand" -m venv "$VENV" || continue
            if cpu_torch_fits; then found="$cand"; break; fi
        done
        if [ -z "$found" ]; then
            echo "no CPU wheel of torch 2.13.0 fits any Python here (pip's find-links):" \
                "refusing to pull a CUDA build" >&2
            exit 1
        fi
        echo "   (the test venv uses $found: torch's CPU wheel here is for $("$PY" -V 2>&1))"
    fi
    "$PY" -m pip install -q --disable-pip-version-check -e '.[test]' 'torch==2.13.0'
}
if [ -n "$UNIT" ] && [ -x "$PY" ] && "$PY" -c "import pytest, ruff, mypy, textual" 2>/dev/null
then
    echo "   (the unit lane takes the venv as it is; the full lane installs into it)"
else
    install_venv
fi

echo "== ruff"
LINTED=$(ls -d gpuctl gpuctl_tests benchmarks 2>/dev/null)
"$PY" -m ruff check $LINTED
"$PY" -m ruff format --check $LINTED
echo "== mypy (strict, login side)"
"$PY" -m mypy
echo "== vermin (gpuctl/node must run on Python 3.6)"
"$VENV/bin/vermin" -q --no-tips --eval-annotations --violations -t=3.6- gpuctl/node
echo "== pytest"
# The full lane in pytest-xdist workers (GPUCTL_TEST_WORKERS, default 2 where the machine has two
# cores or more): its tests mostly wait, so two workers on two cores take about half the time.
# A worker takes a module, or every real-Slurm test, whole (gpuctl_tests/lanes.py).
WORKERS="${GPUCTL_TEST_WORKERS:-$([ "$(nproc)" -ge 2 ] && echo 2 || echo 1)}"
PARALLEL=""
[ -n "$UNIT" ] || [ "$WORKERS" -le 1 ] || PARALLEL="-n $WORKERS --dist loadgroup"
# shellcheck disable=SC2086  # PARALLEL is several words or none
"$PY" -m pytest -q -p no:cacheprovider --durations=15 ${UNIT:+--unit} $PARALLEL "$@"
