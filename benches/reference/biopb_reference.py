"""biopb's own Python server (biopb-tensor-server 0.13.0) as the reference beside Tessera.

Used by ``benches/run.py --reference``. Three things live here:

* ``ensure_installed``: runs ``setup.sh`` (next to this file) when the reference
  virtualenv is missing;
* ``write_zarr_v2``: writes a workload's bytes as an uncompressed zarr v2 array
  (``.zarray`` + one raw file per chunk), since the reference server has no ``.npy``
  reader; the chunks follow Tessera's contiguity-first grid (``grid_chunks``), so both
  servers cut the tensor the same way;
* ``ReferenceServer``: starts ``biopb-tensor-server serve`` on a JSON config in a
  scratch folder (its own state, data, config and cache homes), waits until its catalog
  is complete, and stops it; with ``web=True`` it starts ``launch`` instead (the Flight
  server and its FastAPI HTTP sidecar in one process) and also waits for the sidecar's
  ``/readyz`` (``benches/web.py``).

Nothing here imports biopb: the measurement runs in run.py's worker processes with the
same client venv as Tessera's rows.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import socket
import subprocess
import time

HERE = pathlib.Path(__file__).resolve().parent
VENV = HERE / ".venv"
SERVER_BIN = VENV / "bin" / "biopb-tensor-server"
MARKER = VENV / ".tessera-reference-ok"
VERSION = "0.13.0"


def ensure_installed() -> pathlib.Path:
    """The server command; runs setup.sh first when the venv is missing or unfinished."""
    if not (SERVER_BIN.exists() and MARKER.exists()):
        print(f"  reference venv missing: running {HERE / 'setup.sh'}", flush=True)
        subprocess.run(["bash", str(HERE / "setup.sh")], check=True)
    if not SERVER_BIN.exists():
        raise RuntimeError(f"{SERVER_BIN} is missing after setup.sh")
    return SERVER_BIN


# --------------------------------------------------------------------------- zarr v2


def grid_chunks(shape, itemsize: int, target: int) -> tuple:
    """Tessera's grid for a C-order tensor (docs/decisions/0003): `(1, …, 1, k, full, …)`.

    The cut axis is the slowest one whose one-index step fits the target; `k` is
    balanced, `ceil(dim / ceil(dim / per))` with `per = target // step`.
    """
    shape = tuple(int(d) for d in shape)
    if not shape:
        return ()
    steps = []
    step = itemsize
    for d in reversed(shape):
        steps.append(step)
        step *= d
    steps.reverse()  # steps[i]: bytes of one index along axis i
    for axis, (dim, st) in enumerate(zip(shape, steps)):
        if st <= target:
            per = max(1, target // st)
            n = math.ceil(dim / per)
            k = math.ceil(dim / n)
            return (1,) * axis + (k,) + shape[axis + 1:]
    # A single element of the last axis is over the target: cut the last axis by one.
    return (1,) * (len(shape) - 1) + (1,)


def _stamp(npy: pathlib.Path, chunks) -> dict:
    st = npy.stat()
    return {"npy": str(npy), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "chunks": list(chunks), "format": "zarr-v2-raw-1"}


def write_zarr_v2(npy: pathlib.Path, out: pathlib.Path, target: int, state_dir: pathlib.Path) -> tuple:
    """Writes (or reuses) `out` (a `NAME.zarr` directory): the array of `npy`, uncompressed.

    `state_dir` (on the same filesystem, outside the served folder, so the server's scan
    never sees it) holds the store while it is written and a stamp: the store is reused
    when the stamp names the same file, size, mtime and chunks. Returns the chunks.
    """
    import numpy as np

    src = np.load(npy, mmap_mode="r")
    if src.dtype.hasobject or not src.flags.c_contiguous:
        raise ValueError(f"{npy}: only C-order plain dtypes are written as zarr here")
    chunks = grid_chunks(src.shape, src.dtype.itemsize, target)
    state_dir.mkdir(parents=True, exist_ok=True)
    stamp_path = state_dir / (out.name + ".stamp.json")
    want = _stamp(npy, chunks)
    if out.is_dir() and stamp_path.exists():
        try:
            if json.loads(stamp_path.read_text()) == want:
                return chunks
        except ValueError:
            pass
    print(f"  writing {out} (zarr v2, no compressor, chunks {chunks})", flush=True)
    stamp_path.unlink(missing_ok=True)
    tmp = state_dir / (out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    dtype = src.dtype.newbyteorder("<") if src.dtype.byteorder == ">" else src.dtype
    meta = {
        "zarr_format": 2,
        "shape": list(src.shape),
        "chunks": list(chunks),
        "dtype": dtype.str,
        "compressor": None,
        "filters": None,
        "fill_value": 0.0 if dtype.kind == "f" else 0,
        "order": "C",
        "dimension_separator": ".",
    }
    grid = [math.ceil(d / c) for d, c in zip(src.shape, chunks)]
    for index in np.ndindex(*grid):
        region = tuple(slice(i * c, min((i + 1) * c, d)) for i, c, d in zip(index, chunks, src.shape))
        block = np.ascontiguousarray(src[region], dtype=dtype)
        if block.shape != tuple(chunks):  # zarr v2 stores every chunk whole, edge ones padded
            full = np.zeros(chunks, dtype=dtype)
            full[tuple(slice(0, s) for s in block.shape)] = block
            block = full
        with open(tmp / ".".join(map(str, index)), "wb") as f:
            f.write(memoryview(block).cast("B"))
    (tmp / ".zarray").write_text(json.dumps(meta, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    stamp_path.write_text(json.dumps(want))
    return chunks


# --------------------------------------------------------------------------- server


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ReferenceServer:
    """A running `biopb-tensor-server serve` on `host` (127.0.0.1; another address needs
    `token`) serving `data_dir`.

    `scratch` holds its config, log, catalog, uploads and BIOPB_* homes; `cache_dir`
    is its file cache (the segments its mmap fast path hands out). Both are made
    fresh by the caller for a cold server. `sources` and `credentials` replace the config's
    source list (and add its credential profiles), for remote sources such as `s3://`. Ready means health SERVING, no
    registration pending, no full scan running, and `min_sources` sources listed; with
    `web`, also the HTTP sidecar's `/readyz` answering 200 at `http_base`.
    """

    def __init__(self, binary, data_dir, scratch, cache_dir, min_sources, start_timeout=180,
                 web=False, sources=None, credentials=None, extra_env=None, host="127.0.0.1",
                 token=None):
        self.scratch = pathlib.Path(scratch)
        self.cache_dir = pathlib.Path(cache_dir)
        self.scratch.mkdir(parents=True, exist_ok=True)
        homes = {k: self.scratch / k.lower() for k in
                 ("BIOPB_STATE_HOME", "BIOPB_DATA_HOME", "BIOPB_CONFIG_HOME", "BIOPB_CACHE_HOME")}
        for p in homes.values():
            p.mkdir(exist_ok=True)
        config = {
            "server": {"stability_window": 0, "write_dir": str(self.scratch / "uploads")},
            "cache": {"file_cache_dir": str(self.cache_dir)},
            "precache": {"enabled": False},
            "catalog": {"store_path": str(self.scratch / "catalog.duckdb")},
            "sources": sources or [{"url": str(pathlib.Path(data_dir).resolve()), "monitor": True}],
        }
        if credentials:  # remote sources (benches/objstore.py): fsspec profiles
            config["credentials"] = credentials
        self.config_path = self.scratch / "biopb.json"
        self.config_path.write_text(json.dumps(config, indent=2))
        port = _free_port()
        self.location = f"grpc://{host}:{port}"
        self.http_base = None
        command = ["serve"]
        if web:
            web_port = _free_port()
            self.http_base = f"http://127.0.0.1:{web_port}"
            command = ["launch", "--web-host", "127.0.0.1", "--web-port", str(web_port)]
        self.log_path = self.scratch / "server.log"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("BIOPB_") and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
        env.update({k: str(v) for k, v in homes.items()})
        env.update(extra_env or {})
        env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        self._log = open(self.log_path, "w")
        # A bind off loopback (benches/shaped.py) needs a token and the address to hand out.
        self.token = token
        public = ["--token", token, "--external-location", self.location] if token else []
        self.proc = subprocess.Popen(
            [str(binary), *command, "--config", str(self.config_path), "--host", host,
             "--port", str(port), *public],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.started_at = time.monotonic()
        try:
            self.health = self._wait_ready(min_sources, start_timeout)
            if web:
                self._wait_http(start_timeout)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - self.started_at

    @property
    def pid(self):
        return self.proc.pid

    def log_tail(self, n=40) -> str:
        try:
            return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-n:])
        except OSError:
            return ""

    def health_check(self, timeout=2.0) -> dict:
        import pyarrow.flight as flight

        client = flight.FlightClient(self.location)
        try:
            headers = [(b"authorization", f"Bearer {self.token}".encode())] if self.token else []
            opts = flight.FlightCallOptions(timeout=timeout, headers=headers)
            for r in client.do_action(flight.Action("health", b""), options=opts):
                return json.loads(r.body.to_pybytes())
            return {}
        finally:
            client.close()

    def _wait_ready(self, min_sources, timeout) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"biopb-tensor-server exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            try:
                h = self.health_check()
            except Exception as e:  # not listening yet
                last = e
                time.sleep(0.25)
                continue
            last = h
            if (h.get("status") == "SERVING" and not h.get("registration_pending")
                    and not h.get("full_scan_in_progress")
                    and int(h.get("source_count") or 0) >= min_sources):
                return h
            time.sleep(0.25)
        raise RuntimeError(f"biopb-tensor-server not ready after {timeout} s (last health: {last}):\n"
                           + self.log_tail())

    def _wait_http(self, timeout) -> None:
        """Until the sidecar's `/readyz` answers 200 (it dials the Flight server lazily)."""
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"biopb-tensor-server exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            try:
                with urllib.request.urlopen(self.http_base + "/readyz", timeout=5) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError) as e:
                last = e
            time.sleep(0.25)
        raise RuntimeError(f"the HTTP sidecar is not ready after {timeout} s ({last}):\n"
                           + self.log_tail())

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
