#!/usr/bin/env bash
# The README's test command: installs everything the tests need on a fresh Debian machine
# (system packages, the package with its test extra, torch's CPU wheel), then runs the linters
# and the whole test suite, and then the release's checks on every Python gpuctl claims:
#
#   - the unit lane under the oldest claimed Python (3.10), in a venv of its own without torch;
#   - a smoke of every command on the demo (gpuctl_tests/test_smoke.py) under each other
#     claimed Python (3.12, 3.13; the full lane runs on the Python torch's CPU wheel fits);
#   - the same smoke with every dependency at its declared floor (uv's lowest-direct
#     resolution, on 3.10): a floor that does not work fails here.
#
# Extra arguments go to the full lane's pytest. GPUCTL_TEST_PYTHONS="3.10 3.12 3.13" chooses
# the other Pythons (empty: none); GPUCTL_TEST_FLOORS=0 leaves the floors out.
#
# ``scripts/test.sh --unit``: the developer's lane. No system packages (no apt, sshd, Slurm or
# browser), no torch, pip only to make a missing venv (any Python 3.10 or newer), the same
# linters, and ``pytest --unit``: the tests that need none of those, nor a real Python 3.6 job,
# nor a slow marker (gpuctl_tests/conftest.py marks them from the fixtures they use); a test
# that needs torch is skipped there with the reason (gpuctl_tests/helpers.need_torch).
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
install_unit_venv() {  # any Python >= 3.10, no torch
    if [ ! -x "$PY" ]; then
        found=""
        for cand in "${GPUCTL_TEST_PYTHON:-python3}" python3.13 python3.12 python3.11 python3.10; do
            command -v "$cand" >/dev/null 2>&1 || continue
            "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || continue
            "$cand" -m venv "$VENV" && found="$cand" && break
        done
        [ -n "$found" ] || { echo "no Python 3.10 or newer here for the test venv" >&2; exit 1; }
    fi
    "$PY" -m pip install -q --disable-pip-version-check -e '.[test]'
}
if [ -n "$UNIT" ] && [ -x "$PY" ] && "$PY" -c "import pytest, ruff, mypy, textual" 2>/dev/null
then
    echo "   (the unit lane takes the venv as it is; the full lane installs into it)"
elif [ -n "$UNIT" ]; then
    install_unit_venv
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
# -- every claimed Python, and the floors (the full lane only) -----------------------------------
FAILED_LANES=""
find_python() {  # find_python 3.10: an interpreter of that version here, or nothing
    for cand in "python$1" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/python; do
        [ -e "$cand" ] || command -v "$cand" >/dev/null 2>&1 || continue
        if "$cand" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$1'.split('.'))))" \
            2>/dev/null; then
            command -v "$cand" 2>/dev/null || echo "$cand"
            return 0
        fi
    done
    return 1
}
other_python() {  # other_python 3.10 unit|smoke: that lane in .venv-py3.10 (no torch)
    version=$1; lane=$2; venv=".venv-py$version"
    if ! interp=$(find_python "$version"); then
        if [ "${CI:-}" = true ]; then
            echo "   Python $version: not found here, and CI must test every claimed Python" >&2
            FAILED_LANES="$FAILED_LANES py$version"
        else
            echo "   Python $version: not found here, skipped (CI fails on this)"
        fi
        return 0
    fi
    echo "== Python $version ($interp): the $lane lane, in $venv"
    [ -x "$venv/bin/python" ] || "$interp" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]'
    if [ "$lane" = unit ]; then
        "$venv/bin/python" -m pytest -q -p no:cacheprovider --unit || FAILED_LANES="$FAILED_LANES py$version"
    else
        "$venv/bin/python" -m pytest -q -p no:cacheprovider gpuctl_tests/test_smoke.py ||
            FAILED_LANES="$FAILED_LANES py$version"
    fi
}
floors() {  # the smoke with every dependency at its declared floor, on the oldest Python
    if ! interp=$(find_python 3.10); then
        echo "   floors: no Python 3.10 here, skipped"
        [ "${CI:-}" != true ] || FAILED_LANES="$FAILED_LANES floors"
        return 0
    fi
    echo "== dependency floors (uv --resolution lowest-direct, Python 3.10), in .venv-floors"
    rm -rf .venv-floors
    "$VENV/bin/uv" venv -q -p "$interp" .venv-floors
    export VIRTUAL_ENV="$PWD/.venv-floors"
    "$VENV/bin/uv" pip install -q --resolution lowest-direct -r pyproject.toml
    "$VENV/bin/uv" pip install -q --no-deps .
    "$VENV/bin/uv" pip install -q pytest pytest-asyncio pytest-timeout pytest-xdist
    unset VIRTUAL_ENV
    .venv-floors/bin/python -m pytest -q -p no:cacheprovider gpuctl_tests/test_smoke.py ||
        FAILED_LANES="$FAILED_LANES floors"
}
if [ -z "$UNIT" ]; then
    for version in ${GPUCTL_TEST_PYTHONS-3.10 3.12 3.13}; do
        if [ "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$version" ]; then
            continue  # the full lane runs on it below
        fi
        if [ "$version" = 3.10 ]; then other_python "$version" unit; else other_python "$version" smoke; fi
    done
    [ "${GPUCTL_TEST_FLOORS:-1}" = 0 ] || floors
fi

echo "== pytest"
# The full lane in pytest-xdist workers (GPUCTL_TEST_WORKERS, default 2 where the machine has two
# cores or more): its tests mostly wait, so two workers on two cores take about half the time.
# A worker takes a module, or every real-Slurm test, whole (gpuctl_tests/lanes.py).
WORKERS="${GPUCTL_TEST_WORKERS:-$([ "$(nproc)" -ge 2 ] && echo 2 || echo 1)}"
PARALLEL=""
[ -n "$UNIT" ] || [ "$WORKERS" -le 1 ] || PARALLEL="-n $WORKERS --dist loadgroup"
# shellcheck disable=SC2086  # PARALLEL is several words or none
status=0
"$PY" -m pytest -q -p no:cacheprovider --durations=15 ${UNIT:+--unit} $PARALLEL "$@" || status=$?
if [ -n "$FAILED_LANES" ]; then
    echo "== failed besides the lane above:$FAILED_LANES" >&2
    [ "$status" != 0 ] || status=1
fi
exit "$status"
