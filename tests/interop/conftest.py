"""Fixtures for interop tests: numpy-made tensors and the real `tessera` binary.

The server binary is taken from $TESSERA_BIN, else target/debug/tessera (built by
./run-tests before pytest runs). Each server listens on 127.0.0.1:0; the bound
address is read from its "listening on grpc://ADDR" log line.
"""
import os
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support" / "python"))
from tessera_launcher import TesseraProcess  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    """Remember the run's verdict for `pytest_unconfigure`."""
    session.config._tessera_exitstatus = int(exitstatus)


def pytest_unconfigure(config):
    """Ends the process with pytest's verdict once every report is written, without the
    interpreter's teardown: pyarrow's bundled gRPC can crash in its `event_engine` thread
    while Python finalizes (SIGSEGV in libarrow_flight after every test passed, about one
    run in ten here; apache/arrow#38352), which would turn a passing run into exit 139.
    Test failures and errors still give pytest's own non-zero status."""
    status = getattr(config, "_tessera_exitstatus", None)
    if status is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _client_environment() -> dict:
    return {k: v for k, v in os.environ.items() if k.startswith("BIOPB_")}


@pytest.fixture(autouse=True)
def client_environment_is_left_as_found():
    """Fails a test that changes the biopb client's environment (`BIOPB_*`) for the tests
    after it, and puts it back: one test's `BIOPB_CACHEFILE_TRANSFER_DISABLED=1` left in
    `os.environ` turned every later test's mmap route into do_get without a word. Tests
    change it with `monkeypatch.setenv`, which pytest undoes before this check runs."""
    before = _client_environment()
    yield
    after = _client_environment()
    if after != before:
        for key in set(after) - set(before):
            del os.environ[key]
        os.environ.update(before)
        pytest.fail(f"the test left the client's environment changed: {before} -> {after} "
                    "(use monkeypatch.setenv)")


def tessera_bin() -> str:
    path = os.environ.get("TESSERA_BIN") or str(ROOT / "target" / "debug" / "tessera")
    if not os.path.exists(path):
        pytest.fail(f"server binary {path} is missing: run `cargo build -p tessera-cli` first")
    return path


class Server(TesseraProcess):
    """A running `tessera serve` process (the shared launcher, on the binary under test)."""

    def __init__(self, args, env=None, listen="127.0.0.1:0"):
        super().__init__(tessera_bin(), args, env=env, listen=listen)

    def stop(self):
        return super().stop(timeout=20)


@pytest.fixture
def start_server(tmp_path):
    servers = []

    def start(*paths, extra=(), env=None, cache_dir=None, listen="127.0.0.1:0"):
        cache = cache_dir or (tmp_path / f"cache{len(servers)}")
        # Each server its own state directory unless the test names one (`--state-dir`
        # in `extra` wins over the variable): nothing lands in ~/.local/share/tessera.
        env = {"TESSERA_STATE_DIR": str(tmp_path / f"state{len(servers)}"), **(env or {})}
        server = Server([*paths, "--cache-dir", cache, *extra], env=env, listen=listen)
        servers.append(server)
        return server

    yield start
    for s in servers:
        code = s.stop()
        assert code == 0, "server did not exit cleanly on SIGTERM:\n" + "".join(s.log)


def _fixture_arrays():
    rng = np.random.default_rng(7)
    arrays = {
        "u16_stack": rng.integers(0, 65535, (6, 70, 90), dtype=np.uint16),
        "be_i2": rng.integers(-30000, 30000, (33, 47), dtype="<i2").astype(">i2"),
        "f32_4d": rng.standard_normal((3, 4, 30, 40)).astype("<f4"),
        "f64_1d": rng.standard_normal(5000),
        "u8_rgb": rng.integers(0, 255, (50, 60, 3), dtype="|u1"),
        "c8": (rng.standard_normal((20, 20)) + 1j * rng.standard_normal((20, 20))).astype("<c8"),
        "bool": rng.integers(0, 2, (17, 19)).astype("|b1"),
        "fortran": np.asfortranarray(rng.integers(0, 1000, (25, 35, 7), dtype="<i4")),
    }
    arrays["f32_4d"][0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    return arrays


@pytest.fixture(scope="session")
def arrays():
    return _fixture_arrays()


@pytest.fixture
def fixture_dir(tmp_path, arrays):
    d = tmp_path / "data"
    d.mkdir()
    for name, arr in arrays.items():
        np.save(d / f"{name}.npy", arr)
    return d
