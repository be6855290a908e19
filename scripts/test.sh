#!/usr/bin/env bash
# The README's test command: installs everything the tests need on a fresh Debian machine
# (system packages, the package with its test extra, torch's CPU wheel), then runs the linters
# and the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
# Everything Python goes into a virtual environment of the repository (override its place with
# GPUCTL_TEST_VENV), so the tests never depend on, or disturb, what the machine has installed.
VENV="${GPUCTL_TEST_VENV:-.venv}"

echo "== system packages (OpenSSH server, Slurm, munge, tmux, tcsh, gcc)"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    openssh-server openssh-client slurm-wlm slurm-client munge tmux tcsh gcc libc6-dev \
    iproute2 procps >/dev/null

echo "== python packages (into $VENV)"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
# torch==2.13.0 is the CPU wheel these machines carry; never pull a CUDA build into tests.
"$PY" -m pip install -q --disable-pip-version-check -e '.[test]' 'torch==2.13.0'

echo "== ruff"
LINTED=$(ls -d gpuctl gpuctl_tests benchmarks 2>/dev/null)
"$PY" -m ruff check $LINTED
"$PY" -m ruff format --check $LINTED
echo "== mypy (strict, login side)"
"$PY" -m mypy
echo "== vermin (gpuctl/node must run on Python 3.6)"
"$VENV/bin/vermin" -q --no-tips --eval-annotations --violations -t=3.6- gpuctl/node
echo "== pytest"
"$PY" -m pytest -q -p no:cacheprovider --durations=15 "$@"
