#!/usr/bin/env python3
"""Run biopb-tensor-server 0.13.0's own test files against Tessera and count the results.

    TESSERA_BIN=target/debug/tessera python tests/parity/run.py [-- PYTEST_ARGS...]

The tests come from the biopb 0.13.0 sdist: `$BIOPB_SDIST` (its unpacked directory),
else the sdist `pip download`s into `~/.cache/tessera-parity/`. Their conftest imports the
reference server's package, so the interpreter running this needs what that package
imports beyond tests/interop/requirements.txt (`pip install -r
tests/parity/requirements.txt`); the reference server itself is never started.
`tessera_parity.py` (beside this file) swaps the server: see its docstring for what is
honoured and what counts as "needs biopb internals" (reported as skipped).

The files are those of the biopb server's suite whose tests drive a live server through
the biopb client (`FILES`); the last line is the count: `N passed, N failed, N skipped`.
"""
import os
import pathlib
import subprocess
import sys
import tarfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VERSION = "0.13.0"
FILES = [
    "get_array_test.py",
    "scratch_source_test.py",
    "upload_lifecycle_test.py",
    "upload_plan_test.py",
    "upload_status_flight_info_test.py",
    "upload_test.py",
    "upload_ttl_test.py",
]


def sdist() -> pathlib.Path:
    if os.environ.get("BIOPB_SDIST"):
        return pathlib.Path(os.environ["BIOPB_SDIST"])
    cache = pathlib.Path.home() / ".cache" / "tessera-parity"
    unpacked = cache / f"biopb-{VERSION}"
    if not unpacked.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "-d", str(cache), f"biopb=={VERSION}"],
            check=True,
        )
        with tarfile.open(cache / f"biopb-{VERSION}.tar.gz") as tar:
            tar.extractall(cache, filter="data")
    return unpacked


def main(argv):
    binary = os.environ.get("TESSERA_BIN") or str(ROOT / "target" / "debug" / "tessera")
    if not os.path.exists(binary):
        sys.exit(f"error: no tessera binary at {binary}: `cargo build -p tessera-cli`, or set TESSERA_BIN")
    server_dir = sdist() / "biopb-tensor-server"
    env = {
        **os.environ,
        "TESSERA_BIN": os.path.abspath(binary),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(server_dir), os.environ.get("PYTHONPATH", "")]),
    }
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    cmd = [
        sys.executable, "-m", "pytest", "-p", "tessera_parity", "-p", "no:cacheprovider",
        "-q", "-rs", "--tb=line", *[f"tests/{f}" for f in FILES], *extra,
    ]
    return subprocess.run(cmd, cwd=server_dir, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
