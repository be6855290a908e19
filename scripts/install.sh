#!/bin/sh
# Install gpuctl for this user, from this checkout, into a virtual environment of its own
# (~/.local/share/gpuctl/venv) and link the command into ~/.local/bin. Nothing is installed into
# the system's Python, so this works where pip refuses to (PEP 668: Debian 12, Ubuntu 24.04).
# Running it again upgrades in place.
#
#   sh scripts/install.sh                                   # then: ~/.local/bin/gpuctl demo
#   GPUCTL_PYTHON=/opt/python3.12/bin/python3 sh scripts/install.sh
#
# The login side needs Python 3.10 or newer; the GPU nodes need only their system python3 (3.6+).
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
data=${XDG_DATA_HOME:-$HOME/.local/share}
venv=${GPUCTL_VENV:-$data/gpuctl/venv}
bindir=${GPUCTL_BIN_DIR:-$HOME/.local/bin}

say() { printf 'gpuctl install: %s\n' "$*"; }
die() { printf 'gpuctl install: %s\n' "$*" >&2; exit 1; }

new_enough() {
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' >/dev/null 2>&1
}

# The interpreter: $GPUCTL_PYTHON, else the first Python >= 3.10 on PATH.
python=""
if [ -n "${GPUCTL_PYTHON:-}" ]; then
    command -v "$GPUCTL_PYTHON" >/dev/null 2>&1 || die "GPUCTL_PYTHON=$GPUCTL_PYTHON: no such program"
    new_enough "$GPUCTL_PYTHON" || die "GPUCTL_PYTHON=$GPUCTL_PYTHON is older than Python 3.10"
    python=$(command -v "$GPUCTL_PYTHON")
else
    for candidate in python3 python3.14 python3.13 python3.12 python3.11 python3.10; do
        if command -v "$candidate" >/dev/null 2>&1 && new_enough "$candidate"; then
            python=$(command -v "$candidate")
            break
        fi
    done
fi
if [ -z "$python" ]; then
    found=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo none)
    die "the login side needs Python 3.10 or newer (python3 here: $found). Get one with
  module load python          (an HPC site's environment modules; 'module avail python')
  uv python install 3.12      (uv: https://docs.astral.sh/uv/)
  conda create -n py312 python=3.12
then run again as GPUCTL_PYTHON=/path/to/python3.12 sh scripts/install.sh
(the GPU nodes need only their system python3, 3.6 or newer)"
fi
version=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')

# The venv. A Debian without python3-venv has no ensurepip: make the venv without pip and let
# the system's own pip (>= 22.3) install into it.
pip_outside=""
if [ ! -x "$venv/bin/python" ] || ! new_enough "$venv/bin/python"; then
    say "making $venv (Python $version, $python)"
    mkdir -p "$(dirname "$venv")"
    if ! "$python" -m venv --clear "$venv" >/dev/null 2>&1; then
        "$python" -m venv --clear --without-pip "$venv" \
            || die "$python cannot make a virtual environment: install python3-venv (Debian/Ubuntu) or use pipx/uv"
    fi
fi
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    "$python" -m pip --version >/dev/null 2>&1 \
        || die "$venv has no pip and neither has $python: install python3-venv (apt install python3-venv)"
    pip_outside=1
fi

say "installing gpuctl from $here (about 35 packages, no torch)"
if [ -n "$pip_outside" ]; then
    "$python" -m pip --python "$venv/bin/python" install --quiet --disable-pip-version-check --upgrade "$here"
else
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "$here"
fi

mkdir -p "$bindir"
ln -sf "$venv/bin/gpuctl" "$bindir/gpuctl"
say "installed: $bindir/gpuctl -> $venv/bin/gpuctl ($("$bindir/gpuctl" --version))"
case ":$PATH:" in
    *":$bindir:"*) ;;
    *) say "$bindir is not on your PATH: add it (export PATH=\"$bindir:\$PATH\") or run $bindir/gpuctl" ;;
esac
