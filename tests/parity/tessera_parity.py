"""A pytest plugin that runs biopb-tensor-server's own test files against Tessera.

Loaded by `tests/parity/run.py` (`-p tessera_parity`) with the biopb sdist's
`biopb-tensor-server/` directory as pytest's rootdir, so its `tests` package and
`conftest.py` are the ones collected. Only the server is swapped: `tests.catalog_server`
(which the biopb fixtures `writable_server`, `client` and `source`, and the tests that
start servers of their own, all call) builds a `TesseraServer` instead of biopb's
in-process `TensorFlightServer`. That object starts a real `tessera serve` on loopback
and offers the part of the biopb server's Python surface a black-box server can honour:

- `port`, `mark_ready()`, `serve()`, `shutdown()`;
- `register_source(name, adapter)`: the adapter's array written as `NAME.npy` into the
  served folder, waited for until Tessera serves it; `unregister_source(name)` removes it;
- `sources.get("scratch")`: a handle while Tessera's catalog lists the scratch source (else
  None), whose `max_upload_ttl = SECONDS or None` restarts the server on the same port and
  state with `--upload-max-ttl` (None → `0`, no cap); `scratch_ttl=N` when built is the
  same flag. biopb's `source` fixture, which clears that cap before any upload, is
  answered the same way (`pytest_fixture_setup`).

Anything else (the registry, the upload manager, the DuckDB catalog, the cache manager)
is the reference server's internals: touching it raises `NeedsBiopbInternals`, and the
runner counts such a test as one that cannot run against another server, not as a
failure. So do tests that use a fixture tuning the reference in-process
(`NEEDS_INTERNALS`).
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import numpy as np
import pytest

# Fixtures that monkeypatch or build the reference server's own objects.
NEEDS_INTERNALS = {"transfer_target", "cache", "epoch", "uploads"}

# Tests that read the reference server's own files under its `write_dir` (its
# `fields/<source>/<name>` stores and their `.zattrs` markers), which another server
# lays out its own way (Tessera: docs/decisions/0019, 0031).
READS_BIOPB_LAYOUT = {
    "scratch_source_test.py::TestItKeepsNoDirectoryOfItsOwn::test_its_tensors_live_where_every_uploaded_field_does",
    "upload_test.py::TestDiscard::test_a_zarr_backed_discard_takes_its_store_with_it",
    "upload_ttl_test.py::TestTheDeadlineIsRecorded::test_both_formats_write_it_beside_the_state[zarr]",
    "upload_ttl_test.py::TestTheDeadlineIsRecorded::test_both_formats_write_it_beside_the_state[cache]",
    "upload_ttl_test.py::TestTheDeadlineIsRecorded::test_publishing_does_not_drop_it",
    "upload_ttl_test.py::TestALabelSetIsAnUploadedTensorToo::test_the_deadline_is_recorded_in_the_sidecar",
    "upload_ttl_test.py::TestItSurvivesARestart::test_one_that_ran_out_while_down_is_never_served",
}

LISTENING = re.compile(r"(?<!, )listening on (grpcs?://[0-9.:]+)")
SCRATCH = "scratch"


class NeedsBiopbInternals(AttributeError):
    """The test reached into the reference server's Python objects."""


def _binary() -> str:
    path = os.environ.get("TESSERA_BIN")
    if not path or not os.path.exists(path):
        raise RuntimeError(f"TESSERA_BIN={path!r} is not a tessera binary")
    return path


_LIVE: list["TesseraServer"] = []


class _ScratchHandle:
    """`sources.get("scratch")`: its upload lifetime cap is the one knob honoured."""

    def __init__(self, server: "TesseraServer"):
        self._server = server

    @property
    def max_upload_ttl(self):
        return self._server.max_upload_ttl

    @max_upload_ttl.setter
    def max_upload_ttl(self, seconds):
        self._server.restart(max_upload_ttl=seconds)

    def __getattr__(self, name):
        raise NeedsBiopbInternals(f"scratch source .{name}")


class _Sources:
    def __init__(self, server: "TesseraServer"):
        self._server = server

    def get(self, source_id):
        """The scratch source's handle when Tessera's catalog lists it, else None."""
        if source_id != SCRATCH:
            raise NeedsBiopbInternals(f"sources.get({source_id!r})")
        from biopb.tensor import TensorFlightClient

        client = TensorFlightClient(self._server.location)
        try:
            rows = client.query("SELECT source_id FROM sources", format="records")
        finally:
            client.close()
        served = any(r["source_id"] == SCRATCH for r in rows)
        return _ScratchHandle(self._server) if served else None

    def __getattr__(self, name):
        raise NeedsBiopbInternals(f"sources.{name}")


class TesseraServer:
    """A `tessera serve` standing in for biopb's `TensorFlightServer`."""

    def __init__(self, location=None, writable=False, write_dir=None, metadata_db=None,
                 scratch_ttl="default", **kw):
        if kw:
            raise NeedsBiopbInternals(f"server options {sorted(kw)}")
        self._root = pathlib.Path(tempfile.mkdtemp(prefix="tessera-parity-"))
        self.data_dir = self._root / "data"
        self.data_dir.mkdir()
        self.state_dir = (pathlib.Path(write_dir) / "tessera-state") if write_dir else self._root / "state"
        self.writable = bool(writable) and write_dir is not None
        self.max_upload_ttl = scratch_ttl
        self.port = 0
        self.log: list[str] = []
        self.proc = None
        self._registered = set()
        self._zero_ttl_understood = True
        try:
            self._start()
        except RuntimeError:
            if "upload-max-ttl" not in "".join(self.log):
                raise
            self._zero_ttl_understood = False
            self._start()
        _LIVE.append(self)

    # -- the process --------------------------------------------------------------

    def _args(self):
        args = [
            _binary(), "serve", str(self.data_dir),
            "--listen", f"127.0.0.1:{self.port}",
            "--cache-dir", str(self._root / "cache"),
            "--state-dir", str(self.state_dir),
            "--watch", "--watch-interval", "100ms", "--settle-window", "1ms",
        ]
        if self.writable:
            args.append("--writable")
        if self.max_upload_ttl != "default":
            off = "0" if self._zero_ttl_understood else "100000h"  # older binaries: no "0"
            args += ["--upload-max-ttl", off if not self.max_upload_ttl else f"{int(self.max_upload_ttl)}s"]
        return args

    def _start(self):
        self.log = []
        self.proc = subprocess.Popen(
            self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")},
        )
        ready = threading.Event()
        found = {}

        def pump():
            for line in self.proc.stderr:
                self.log.append(line)
                m = LISTENING.search(line)
                if m and not ready.is_set():
                    found["location"] = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(60) or "location" not in found:
            self._stop()
            raise RuntimeError("tessera did not start:\n" + "".join(self.log[-20:]))
        self.port = int(found["location"].rsplit(":", 1)[1])

    def _stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self, **settings):
        """Stop, change settings, start again on the same port and state."""
        self._stop()
        for key, value in settings.items():
            setattr(self, key, value)
        for _ in range(50):  # the port is free once the old process is gone
            try:
                self._start()
                return
            except RuntimeError:
                log = "".join(self.log)
                if "upload-max-ttl" in log and self._zero_ttl_understood:
                    self._zero_ttl_understood = False
                elif "in use" not in log:
                    raise
                time.sleep(0.1)
        raise RuntimeError("tessera did not restart:\n" + "".join(self.log[-20:]))

    # -- biopb's TensorFlightServer surface ----------------------------------------

    @property
    def location(self):
        return f"grpc://127.0.0.1:{self.port}"

    def mark_ready(self):
        pass

    def serve(self):
        pass

    def shutdown(self):
        self._stop()
        if self in _LIVE:
            _LIVE.remove(self)
        shutil.rmtree(self._root, ignore_errors=True)

    @property
    def sources(self):
        return _Sources(self)

    def register_source(self, source_id, adapter):
        array = getattr(adapter, "zarr_array", None)
        if array is None:
            raise NeedsBiopbInternals(f"register_source with a {type(adapter).__name__}")
        data = np.asarray(array[...])
        tmp = self.data_dir / f".{source_id}.partial"
        with open(tmp, "wb") as f:
            np.save(f, data)
        os.replace(tmp, self.data_dir / f"{source_id}.npy")
        self._registered.add(source_id)
        self._wait_for(source_id, present=True)
        return adapter

    def unregister_source(self, source_id):
        if source_id not in self._registered:
            raise NeedsBiopbInternals(f"unregister_source({source_id!r}), a source it did not register")
        self._registered.discard(source_id)
        (self.data_dir / f"{source_id}.npy").unlink()
        self._wait_for(source_id, present=False)

    def _wait_for(self, source_id, present):
        from biopb.tensor import TensorFlightClient

        client = TensorFlightClient(self.location)
        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    client.get_descriptor(source_id)
                    served = True
                except Exception:  # not served (yet): the refusal's kind is not the point
                    served = False
                if served == present:
                    return
                time.sleep(0.05)
        finally:
            client.close()
        raise RuntimeError(f"tessera did not {'serve' if present else 'drop'} {source_id!r} in time")

    def __getattr__(self, name):
        raise NeedsBiopbInternals(f"server.{name}")


def _install():
    import tests as biopb_tests  # the sdist's package: rootdir is on sys.path

    biopb_tests.catalog_server = TesseraServer


_install()


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_biopb_internals(why): runs on biopb's server only")


def pytest_collection_modifyitems(config, items):
    for item in items:
        used = set(getattr(item, "fixturenames", ())) & NEEDS_INTERNALS
        if used:
            item.add_marker(pytest.mark.needs_biopb_internals(f"fixture {', '.join(sorted(used))}"))
        elif item.nodeid.split("/", 1)[-1] in READS_BIOPB_LAYOUT:
            item.add_marker(pytest.mark.needs_biopb_internals("reads biopb's files under write_dir"))


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("needs_biopb_internals")
    if marker:
        pytest.skip(f"needs biopb internals: {marker.args[0]}")


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef, request):
    """biopb's `source` fixture clears the scratch source's lifetime cap through the
    registry; here the same knob is the flag, so the server restarts with
    `--upload-max-ttl 0`. The fixture's value, the scratch source's id, is unchanged."""
    if fixturedef.argname != "source" or fixturedef.baseid.endswith("parity"):
        return None
    server = request.getfixturevalue("writable_server")
    if not isinstance(server, TesseraServer):
        return None
    server.restart(max_upload_ttl=None)
    fixturedef.cached_result = (SCRATCH, fixturedef.cache_key(request), None)
    return SCRATCH


def pytest_runtest_teardown(item):
    for server in list(_LIVE):
        server.shutdown()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and _reached_internals(call.excinfo.value):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1], f"needs biopb internals: {call.excinfo.value}")


def _reached_internals(exc, depth=0):
    if exc is None or depth > 10:
        return False
    if isinstance(exc, NeedsBiopbInternals):
        return True
    return _reached_internals(exc.__cause__ or exc.__context__, depth + 1)
