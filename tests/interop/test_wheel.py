"""The `tessera-server` wheel (packaging/, docs/guides/install.md) on a machine without Rust.

The wheel is built here by packaging/build-wheel from the dev profile, so it holds the very
target/debug/tessera the rest of the suite tests (maturin finds it fresh: no second link);
$TESSERA_WHEEL names a wheel built elsewhere instead (a release artifact, to try it on
another machine). It is installed with `pip install --no-index` into a new venv whose
environment reaches no `cargo` or `rustc`, and the `tessera` it puts on that venv's PATH
serves the shipped samples (the README's first set-up command) to the unmodified biopb
client; numpy compares the bytes with the sample file.

A missing maturin or venv support skips the test, and fails it under CI=true.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from tessera_launcher import TesseraProcess

TOOLCHAIN = ("cargo", "rustc", "rustup")


def missing(what):
    """Skips the test for a missing prerequisite, or fails it under CI."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} (CI must run the wheel test)")
    pytest.skip(what)


def workspace_version():
    """The workspace's version, as Cargo.toml states it: the wheel's version."""
    text = (ROOT / "Cargo.toml").read_text()
    m = re.search(r'^\[workspace\.package\][^\[]*?^version = "([^"]+)"', text, re.M | re.S)
    assert m, "no version in Cargo.toml's [workspace.package]"
    return m.group(1)


def maturin():
    """maturin from $MATURIN, else beside this Python (the test venv), else on PATH."""
    named = os.environ.get("MATURIN")
    if named:
        return named
    beside = pathlib.Path(sys.executable).parent / "maturin"
    if beside.exists():
        return str(beside)
    found = shutil.which("maturin")
    if found is None:
        missing("maturin is not installed: pip install -r tests/interop/requirements.txt")
    return found


def build_wheel(out):
    """The wheel of $TESSERA_WHEEL, else one built from target/debug by packaging/build-wheel."""
    given = os.environ.get("TESSERA_WHEEL")
    if given:
        return pathlib.Path(given)
    done = subprocess.run(
        [ROOT / "packaging" / "build-wheel", out, "--profile", "dev"],
        env={**os.environ, "MATURIN": maturin()},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    wheels = sorted(out.glob("*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {out}: {wheels}\n{done.stderr}"
    return wheels[0]


def clean_path(venv_bin):
    """The venv's bin, then the system's directories, without any holding a Rust toolchain."""
    dirs = [str(venv_bin)]
    for d in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        if not any(os.path.exists(os.path.join(d, tool)) for tool in TOOLCHAIN):
            dirs.append(d)
    return os.pathsep.join(dirs)


def test_the_wheel_installs_and_serves_without_a_rust_toolchain(tmp_path):
    from biopb.tensor import TensorFlightClient

    try:
        import venv  # noqa: F401
        import ensurepip  # noqa: F401
    except ImportError:
        missing("Python venv support (python3-venv) is not installed")

    wheel = build_wheel(tmp_path / "wheels")
    version = workspace_version()
    assert wheel.name.startswith(f"tessera_server-{version}-py3-none-manylinux_"), wheel.name
    assert wheel.name.endswith("_x86_64.whl"), wheel.name

    # The machine of a scientist who never installed Rust: a new venv, a PATH without the
    # toolchain, a home without ~/.cargo and no Cargo or rustup variables.
    venv_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv_dir], check=True, timeout=300)
    venv_bin = venv_dir / "bin"
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": clean_path(venv_bin), "HOME": str(home), "LANG": "C.UTF-8"}
    for tool in TOOLCHAIN:
        assert shutil.which(tool, path=env["PATH"]) is None, f"{tool} is reachable from {env['PATH']}"

    installed = subprocess.run(
        [venv_bin / "python", "-m", "pip", "install", "--no-index", "--disable-pip-version-check", wheel],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr

    tessera = shutil.which("tessera", path=env["PATH"])
    assert tessera == str(venv_bin / "tessera"), f"`tessera` on the clean PATH is {tessera}"
    shown = subprocess.run([tessera, "--version"], env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == ["tessera", version], shown.stdout

    # README's `tessera serve samples`, on a loopback port of its own, with its cache and
    # state under the temporary home.
    server = TesseraProcess(
        tessera,
        [ROOT / "samples", "--cache-dir", tmp_path / "cache", "--http-listen", "off"],
        env={**env, "TESSERA_STATE_DIR": str(tmp_path / "state")},
    )
    try:
        client = TensorFlightClient(server.location)
        got = client.get_tensor("zstack").compute()
        expected = np.load(ROOT / "samples" / "zstack.npy")
        assert got.dtype == expected.dtype
        assert got.shape == expected.shape
        assert got.tobytes() == np.ascontiguousarray(expected).tobytes()
    finally:
        code = server.stop(timeout=20)
        # The installed binary and the wheel are a few hundred MB of the CI machine's disk.
        shutil.rmtree(venv_dir, ignore_errors=True)
        if not os.environ.get("TESSERA_WHEEL"):
            shutil.rmtree(wheel.parent, ignore_errors=True)
    assert code == 0, "server did not exit cleanly on SIGTERM:\n" + "".join(server.log)
