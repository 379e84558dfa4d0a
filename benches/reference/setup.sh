#!/usr/bin/env bash
# Installs biopb's own Python server (biopb-tensor-server 0.13.0) into
# benches/reference/.venv, for `benches/run.py --reference`.
#
# The server is not on PyPI as a wheel: it ships inside the biopb 0.13.0 source
# distribution. This script downloads that sdist, unpacks it, makes a Python 3.12
# virtualenv and installs biopb[tensor]==0.13.0 plus the unpacked server directory
# (and zarr, which run.py uses to write the workloads as zarr v2 arrays, and s3fs, the
# fsspec filesystem its server reads `s3://` sources through: benches/objstore.py).
# Idempotent: a finished install (marker file) is left alone; re-run with --force to redo.
set -euo pipefail

VERSION=0.13.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv"
# The unpacked sdist is biopb's whole repository (docs, tests): kept out of this tree.
SDIST_DIR="${TESSERA_REFERENCE_SDIST:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/biopb-sdist}"
MARKER="$VENV/.tessera-reference-ok"
NICE=(nice -n 19)

die() { echo "reference/setup.sh: $*" >&2; exit 1; }

if [[ "${1:-}" == "--force" ]]; then
    rm -rf "$VENV"
elif [[ -f "$MARKER" ]]; then
    echo "reference server already installed in $VENV"
    exit 0
fi

# Python >= 3.12: $PYTHON, else python3.12 on PATH, else pyenv's.
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
    if command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import sys' 2>/dev/null; then
        PY="$(command -v python3.12)"
    elif command -v pyenv >/dev/null 2>&1 && pyenv which python3.12 >/dev/null 2>&1; then
        PY="$(pyenv which python3.12)"
    else
        for cand in "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3; do
            [[ -x "$cand" ]] && PY="$cand" && break
        done
    fi
fi
[[ -n "$PY" ]] || die "no Python >= 3.12 found (set PYTHON=/path/to/python3.12)"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 12))' \
    || die "$PY is older than 3.12"
echo "using $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"

# The sdist, unpacked.
SRC="$SDIST_DIR/biopb-$VERSION"
SERVER_DIR="$SRC/biopb-tensor-server"
if [[ ! -d "$SERVER_DIR" ]]; then
    mkdir -p "$SDIST_DIR"
    tarball="$SDIST_DIR/biopb-$VERSION.tar.gz"
    if [[ ! -f "$tarball" ]]; then
        "$PY" -m pip download --no-binary :all: --no-deps --dest "$SDIST_DIR" "biopb==$VERSION" \
            || die "could not download the biopb $VERSION source distribution"
    fi
    [[ -f "$tarball" ]] || die "expected $tarball after pip download"
    rm -rf "$SRC"
    tar -xzf "$tarball" -C "$SDIST_DIR"
    [[ -d "$SERVER_DIR" ]] || die "$SERVER_DIR is not in the sdist"
fi

# The virtualenv and the installs.
rm -rf "$VENV"
"$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
"${NICE[@]}" "$VPY" -m pip install --quiet --upgrade pip setuptools wheel \
    || die "could not upgrade pip in $VENV"
"${NICE[@]}" "$VPY" -m pip install --prefer-binary "biopb[tensor]==$VERSION" zarr s3fs \
    || die "could not install biopb[tensor]==$VERSION"
# [web]: the server's CLI imports its HTTP front end (fastapi) at start-up, even for
# `serve`, so the command does not run without that extra.
SETUPTOOLS_SCM_PRETEND_VERSION="$VERSION" "${NICE[@]}" "$VPY" -m pip install --prefer-binary "$SERVER_DIR[web]" \
    || die "could not install $SERVER_DIR"

# Smoke checks: the command exists and the packages import.
[[ -x "$VENV/bin/biopb-tensor-server" ]] || die "biopb-tensor-server was not installed"
"$VPY" -c 'import zarr, biopb.tensor' || die "zarr / biopb.tensor do not import"
"$VENV/bin/biopb-tensor-server" --help >/dev/null || die "biopb-tensor-server --help failed"
touch "$MARKER"
echo "reference server installed: $VENV/bin/biopb-tensor-server"
