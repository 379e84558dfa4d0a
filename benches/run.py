#!/usr/bin/env python3
"""Tessera benchmark suite (issue 7): one run, one machine, side by side.

Makes the workloads, starts the release server, and measures in the same run:

* the unmodified biopb 0.13.0 client, ``client.get_tensor(id).compute()``, over do_get
  (``BIOPB_CACHEFILE_TRANSFER_DISABLED=1``) and over the mmap fast path, warm and cold
  (cold = fresh cache directory + dropped page cache when permitted);
* the anchors: ``np.load`` of the same file (page cache warm), a plain memcpy of the same
  size into a preallocated, touched array, and loopback TCP throughput;
* GetFlightInfo and warm ``chunk_locate`` round trips (pyarrow.flight);
* server CPU time (``/proc/PID/stat``), peak and private RSS (``VmHWM``,
  ``smaps_rollup``), idle RSS;
* optionally the segments crate's criterion figures and a chunk-target sweep.

Every figure is the median of N repetitions (``--reps``). Client measurements run in
child processes of this script (``--worker``) so each has a clean environment.

Usage (from the repository root)::

    .venv/bin/python benches/run.py                 # full suite, writes docs/guides/performance.md
    .venv/bin/python benches/run.py --quick         # skips the big volume, fewer cold reps
    .venv/bin/python benches/run.py --sweep 4MiB,8MiB,16MiB,32MiB --no-doc
    .venv/bin/python benches/run.py --criterion     # also runs the segments criterion benches
    .venv/bin/python benches/run.py --reference     # also biopb's own server (0.13.0), same bytes, same run
    .venv/bin/python benches/run.py --planes        # also a viewer's plane-wise reads (benches/planes.py)

``--reference`` installs biopb-tensor-server 0.13.0 into benches/reference/.venv on first
use (benches/reference/setup.sh), writes w256 and w64 as uncompressed zarr v2 arrays next
to the workloads, and measures that server with the same client workers: its rows sit
beside Tessera's with the ratio Tessera / reference.

Rows measured through a rate-limited link (network namespace, veth, tc tbf; needs root)
live in their own scripts: benches/shaped.py (issue 33: DoGet at 1 and 10 Gbit/s,
``--wire-compression off`` beside ``auto``, microscopy-like u16, noise, labels, warm and
cold), benches/objstore.py and benches/cluster.py. The first plan of a fresh loopback
client that never maps, and of one that maps, beside biopb's server (decision 0041), is
benches/first_plan.py.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support" / "python"))
from tessera_launcher import TesseraProcess  # noqa: E402
MiB = 1 << 20
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Label suffix of the rows measured on biopb's own server (--reference).
REF_SUFFIX = " (biopb server)"
REF_NAMES = ("w256", "w64")

# Issue 7's targets, keyed like the rows of the results table.
TARGETS = {
    "w256 warm doget": ("339 ms", "<= 170 ms"),
    "w256 warm mmap": ("119 ms", "<= np.load"),
    "w256 cold doget": ("1516 ms", "<= 300 ms"),
    "w64 warm doget": ("146 ms", "<= 70 ms"),
    "w64 warm mmap": ("46 ms", "<= 25 ms"),
}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*", text)
    if not m:
        raise ValueError(f"size {text!r} is not like 8MiB")
    return int(m.group(1)) * {None: 1, "B": 1, "KiB": 1 << 10, "MiB": MiB, "GiB": 1 << 30}[m.group(2)]


def median(xs):
    return statistics.median(xs) if xs else float("nan")


# --------------------------------------------------------------------------- workloads


def make_workloads(work: pathlib.Path, big_bytes: int | None, small_count: int) -> dict:
    """Creates (or reuses) the .npy files; returns {name: path}."""
    import numpy as np

    work.mkdir(parents=True, exist_ok=True)
    specs = {
        "w256": ((8, 4, 2048, 2048), np.uint16),
        "w64": ((4096, 4096), np.float32),
    }
    if big_bytes:
        planes = max(1, big_bytes // (2048 * 2048 * 2))
        specs["big"] = ((planes, 2048, 2048), np.uint16)
    out = {}
    rng = np.random.default_rng(7)
    for name, (shape, dtype) in specs.items():
        path = work / f"{name}.npy"
        out[name] = path
        if path.exists():
            try:
                existing = np.load(path, mmap_mode="r")
                if existing.shape == shape and existing.dtype == dtype:
                    continue
            except ValueError:
                pass
        print(f"  making {path} {shape} {np.dtype(dtype)}", flush=True)
        arr = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
        flat = arr.reshape(shape[0], -1)
        for i in range(shape[0]):
            if np.dtype(dtype).kind == "f":
                flat[i] = rng.standard_normal(flat.shape[1], dtype=np.float32)
            else:
                flat[i] = rng.integers(0, 1 << 16, flat.shape[1], dtype=dtype)
        arr.flush()
        del arr, flat
    small = work / "small"
    small.mkdir(exist_ok=True)
    have = sorted(small.glob("*.npy"))
    if len(have) != small_count:
        for p in have:
            p.unlink()
        print(f"  making {small_count} x 64 KiB tensors in {small}", flush=True)
        for i in range(small_count):
            np.save(small / f"s{i:04d}.npy", rng.integers(0, 1 << 16, 32768, dtype=np.uint16))
    out["small"] = small
    return out


# --------------------------------------------------------------------------- the server


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc/PID/stat."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class ProcStats:
    """CPU time and memory of the process `self.pid`, from /proc."""

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def status_kib(self, key: str) -> int:
        for line in pathlib.Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def smaps(self) -> dict:
        out = {}
        for line in pathlib.Path(f"/proc/{self.pid}/smaps_rollup").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                out[parts[0].rstrip(":")] = int(parts[1])
        return out


class Server(ProcStats, TesseraProcess):
    """A running release `tessera serve` on 127.0.0.1:0 with its own cache directory."""

    def __init__(self, binary, paths, cache_dir, extra=()):
        self.cache_dir = pathlib.Path(cache_dir)
        super().__init__(
            binary,
            [*paths, "--cache-dir", cache_dir, "--cache-max-bytes", "16GiB", *extra],
            start_timeout=120,
        )


class MemorySampler:
    """Samples the server's private and anonymous RSS while a phase runs (max, KiB)."""

    def __init__(self, server: Server, every=0.02):
        self.server, self.every = server, every
        self.private = self.anon = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                s = self.server.smaps()
            except OSError:
                return
            self.private = max(self.private, s.get("Private_Clean", 0) + s.get("Private_Dirty", 0))
            self.anon = max(self.anon, s.get("Anonymous", 0))
            self._stop.wait(self.every)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def drop_page_cache() -> bool:
    try:
        os.sync()
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------- workers


def run_worker(job: dict, script: str = __file__) -> dict:
    """Runs one client job in a child process (`script --worker JOB`: this file's workers,
    or another bench script's) and returns its JSON answer."""
    env = dict(os.environ)
    env.pop("BIOPB_CACHEFILE_TRANSFER_DISABLED", None)
    if job.get("mode") == "doget":
        env["BIOPB_CACHEFILE_TRANSFER_DISABLED"] = "1"
    res = subprocess.run([sys.executable, script, "--worker", json.dumps(job)],
                         capture_output=True, text=True, env=env, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"worker {job['kind']} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def worker_main(job: dict) -> None:
    import numpy as np
    import pyarrow.flight as flight
    from biopb.tensor import TensorFlightClient

    kind = job["kind"]
    out = {}
    if kind == "read":
        client = TensorFlightClient(job["location"], cache_bytes=0)
        ids = job["ids"]
        if job.get("verify"):
            for i, path in zip(ids, job["paths"]):
                got = client.get_tensor(i).compute()
                want = np.load(path, mmap_mode="r")
                if got.shape != want.shape or not np.array_equal(got, want):
                    raise SystemExit(f"tensor {i} read back different bytes")
        if job.get("count_paths"):
            # Which path the client took (for a server without Tessera's counters): one
            # more untimed read, counting the client's chunk_locate attempts and the
            # chunks they served by mmap. Never active while the clock runs.
            from biopb.tensor import _pool

            original = _pool._try_cachefile_transfer
            counts = {"locate_calls": 0, "mmap_chunks": 0}

            def counting(*a, **k):
                counts["locate_calls"] += 1
                got = original(*a, **k)
                counts["mmap_chunks"] += got is not None
                return got

            _pool._try_cachefile_transfer = counting
            try:
                for i in ids:
                    client.get_tensor(i).compute()
            finally:
                _pool._try_cachefile_transfer = original
            out.update(counts)
        # A cold read measures the server's cold path, not this process's first-call costs
        # (imports, thread pools, allocator arenas, the connection): read another tensor
        # first, then drop the page cache from here, just before the clock starts.
        for i in job.get("warmup_ids", []):
            client.get_tensor(i).compute()
        if job.get("drop_caches"):
            out["page_cache_dropped"] = drop_page_cache()
        if job.get("plan_first"):
            for i in ids:
                client.get_tensor(i)
        import resource

        times = []
        server_cpu0 = process_cpu_seconds(job["cpu_pid"]) if job.get("cpu_pid") else 0.0
        before = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(job["reps"]):
            t0 = time.perf_counter()
            for i in ids:
                client.get_tensor(i).compute()
            times.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_SELF)
        if job.get("cpu_pid"):
            out["server_cpu"] = process_cpu_seconds(job["cpu_pid"]) - server_cpu0
        reps = max(job["reps"], 1)
        out["times"] = times
        # The client's own cost per read: CPU of all its threads, and minor page faults
        # (fresh pages it allocated and touched).
        out["client_cpu"] = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / reps
        out["client_minflt"] = (after.ru_minflt - before.ru_minflt) / reps
    elif kind == "first":
        # The first read of a fresh client process: the client object, its connection,
        # the plan and every chunk are paid inside the clock (imports are not: they cost
        # the same against any server).
        server_cpu0 = process_cpu_seconds(job["cpu_pid"])
        t0 = time.perf_counter()
        got = TensorFlightClient(job["location"], cache_bytes=0).get_tensor(job["id"]).compute()
        out["times"] = [time.perf_counter() - t0]
        out["server_cpu"] = process_cpu_seconds(job["cpu_pid"]) - server_cpu0
        want = np.load(job["path"], mmap_mode="r")
        if got.shape != want.shape or not np.array_equal(got, want):
            raise SystemExit(f"tensor {job['id']} read back different bytes")
    elif kind == "latency":
        from biopb.tensor._session import _read_option, _tensor_read_cmd

        c = flight.FlightClient(job["location"])
        desc = flight.FlightDescriptor.for_command(
            _tensor_read_cmd(job["id"], _read_option(endpoints=True)).SerializeToString())
        info = c.get_flight_info(desc)
        ticket = info.endpoints[0].ticket.ticket
        json.loads(next(c.do_action(flight.Action("chunk_locate", ticket))).body.to_pybytes())
        fi, lo = [], []
        for _ in range(job["reps"]):
            t0 = time.perf_counter()
            c.get_flight_info(desc)
            fi.append(time.perf_counter() - t0)
        for _ in range(job["reps"]):
            t0 = time.perf_counter()
            r = next(c.do_action(flight.Action("chunk_locate", ticket))).body.to_pybytes()
            lo.append(time.perf_counter() - t0)
        if not json.loads(r).get("available"):
            raise SystemExit("chunk_locate answered unavailable")
        # The floor: the cheapest action (no lookup), same client, same connection.
        fl = []
        for _ in range(job["reps"]):
            t0 = time.perf_counter()
            next(c.do_action(flight.Action("health", b""))).body.to_pybytes()
            fl.append(time.perf_counter() - t0)
        out["flight_info"], out["locate"], out["health"] = fi, lo, fl
    elif kind == "ids":
        c = flight.FlightClient(job["location"])
        out["ids"] = sorted(
            f.descriptor.path[0].decode() if f.descriptor.path else "" for f in c.list_flights())
    elif kind == "catalog":
        # biopb's server names a source by a hash of its url: read them from its catalog,
        # and plan each to be sure the source id addresses the tensor.
        client = TensorFlightClient(job["location"], cache_bytes=0)
        rows = client.query("SELECT source_id, source_url FROM sources", format="records")
        out["sources"] = []
        for r in rows:
            entry = {"source_id": r["source_id"], "source_url": r["source_url"]}
            try:
                entry["shape"] = list(client.get_tensor(r["source_id"]).shape)
            except Exception as e:  # e.g. the scratch source
                entry["error"] = str(e)[:200]
            out["sources"].append(entry)
    print(json.dumps(out))


def cache_stats(location: str) -> dict:
    import pyarrow.flight as flight

    c = flight.FlightClient(location)
    return json.loads(next(c.do_action(flight.Action("cache_stats", b""))).body.to_pybytes())


# --------------------------------------------------------------------------- anchors


def anchors(path: pathlib.Path, reps: int) -> dict:
    """np.load (warm), memcpy into a touched array, loopback TCP, for the file's size."""
    import numpy as np

    arr = np.load(path)
    nbytes = arr.nbytes
    load = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.load(path)
        load.append(time.perf_counter() - t0)
    dst = np.empty_like(arr)
    dst.fill(0)
    copy = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, arr)
        copy.append(time.perf_counter() - t0)
    cold = []
    for _ in range(min(reps, 3)):
        if not drop_page_cache():
            break
        t0 = time.perf_counter()
        np.load(path)
        cold.append(time.perf_counter() - t0)
    out = {"bytes": nbytes, "np_load": load, "memcpy": copy, "tcp": loopback_tcp(nbytes, reps)}
    if cold:
        out["np_load_cold"] = cold
    return out


def loopback_tcp(nbytes: int, reps: int) -> list:
    """Seconds to move `nbytes` through one loopback TCP connection (sendall / recv_into)."""
    payload = memoryview(bytearray(os.urandom(1 << 20)) * (nbytes >> 20))
    sink = bytearray(4 << 20)
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    times = []

    def send():
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(payload)
        s.close()

    for _ in range(reps):
        t = threading.Thread(target=send)
        t.start()
        conn, _ = lsock.accept()
        view = memoryview(sink)
        got = 0
        t0 = time.perf_counter()
        while got < len(payload):
            n = conn.recv_into(view)
            if n == 0:
                break
            got += n
        times.append(time.perf_counter() - t0)
        conn.close()
        t.join()
    lsock.close()
    return times


# --------------------------------------------------------------------------- phases


def measure_reads(server, ids, paths, mode, reps, label, results, sampler=True):
    """Warm reads: one verified untimed read, then `reps` timed reads; server CPU per read."""
    before_stats = cache_stats(server.location)
    run_worker({"kind": "read", "location": server.location, "ids": ids, "paths": list(map(str, paths)),
                "mode": mode, "reps": 0, "verify": True})
    cpu0 = server.cpu_seconds()
    mid_stats = cache_stats(server.location)
    with MemorySampler(server) as mem:
        r = run_worker({"kind": "read", "location": server.location, "ids": ids, "mode": mode,
                        "reps": reps})
    cpu = (server.cpu_seconds() - cpu0) / max(reps, 1)
    after = cache_stats(server.location)
    row = {"times": r["times"], "cpu": cpu, "private_kib": mem.private, "anon_kib": mem.anon,
           "client_cpu": r.get("client_cpu"), "client_minflt": r.get("client_minflt"),
           "locates": after["locates"] - mid_stats["locates"],
           "do_gets": after["do_gets"] - mid_stats["do_gets"]}
    if mode == "mmap" and row["locates"] == 0:
        raise RuntimeError(f"{label}: the mmap fast path was not used")
    if mode == "doget" and row["locates"] != 0:
        raise RuntimeError(f"{label}: do_get mode used chunk_locate")
    del before_stats
    results[label] = row
    print(f"  {label:28s} median {median(r['times']) * 1e3:8.1f} ms  server CPU {cpu * 1e3:7.1f} ms/read"
          f"  private {mem.private / 1024:6.1f} MiB  anon {mem.anon / 1024:6.1f} MiB"
          f"  client CPU {r['client_cpu'] * 1e3:7.1f} ms/read, {r['client_minflt']:.0f} faults/read", flush=True)
    return row


def measure_rust_cli(binary, server, name, path, mode, reps, results):
    """The Rust client through `tessera get`, end to end: process start, connect, plan and
    read into one output buffer. One untimed read writes the `.npy` to tmpfs and is
    compared with numpy; the timed reads write it to /dev/null (no copy), so the row is
    the library's read, like the biopb rows' `compute()`. Client CPU and faults come
    from the child's rusage."""
    import numpy as np

    check = pathlib.Path("/dev/shm") / f"tessera-bench-{os.getpid()}.npy"
    base = [binary, "get", server.location, name] + (["--no-mmap"] if mode == "doget" else [])
    try:
        subprocess.run(base + ["-o", str(check)], check=True, capture_output=True)
        got, want = np.load(check), np.load(path, mmap_mode="r")
        if got.shape != want.shape or not np.array_equal(got, want):
            raise RuntimeError(f"tessera get {name} ({mode}) read back different bytes")
        del got, want
    except subprocess.CalledProcessError as e:
        print(f"  rust client {name} {mode}: failed: {e.stderr.decode()[-500:]}", flush=True)
        return
    finally:
        check.unlink(missing_ok=True)
    times, cpus, faults = [], [], []
    for _ in range(reps):
        with tempfile.TemporaryFile() as err:
            t0 = time.perf_counter()
            proc = subprocess.Popen(base + ["-o", "/dev/null"], stdout=subprocess.DEVNULL, stderr=err)
            _, status, usage = os.wait4(proc.pid, 0)
            times.append(time.perf_counter() - t0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode != 0:
                err.seek(0)
                raise RuntimeError(f"tessera get {name} ({mode}) failed: {err.read().decode()[-500:]}")
        cpus.append(usage.ru_utime + usage.ru_stime)
        faults.append(usage.ru_minflt)
    label = f"{name} warm {mode} Rust client (tessera get)"
    results[label] = {"times": times, "cpu": float("nan"), "private_kib": 0, "anon_kib": 0,
                      "client_cpu": median(cpus), "client_minflt": median(faults)}
    print(f"  {label:28s} median {median(times) * 1e3:8.1f} ms  client CPU {median(cpus) * 1e3:7.1f} ms,"
          f" {median(faults):.0f} faults", flush=True)


def measure_cold(binary, files, name, mode, reps, work, results, extra=()):
    """Cold reads: a new server with an empty cache directory per repetition; the client
    process first reads another tensor (so its own first-call costs are paid), then drops
    the page cache, plans, and times the read. Server CPU is that of the timed read."""
    times, cpus, privs, anons = [], [], [], []
    dropped = True
    warmup = "w64" if name != "w64" else "w256"
    for i in range(reps):
        cache = work / f"cold-cache-{name}-{mode}"
        shutil.rmtree(cache, ignore_errors=True)
        server = Server(binary, [files[name], files[warmup]], cache, extra)
        try:
            with MemorySampler(server) as mem:
                r = run_worker({"kind": "read", "location": server.location, "ids": [name],
                                "mode": mode, "reps": 1, "plan_first": True,
                                "warmup_ids": [warmup], "drop_caches": True,
                                "cpu_pid": server.pid})
            dropped = r.get("page_cache_dropped", False) and dropped
            times += r["times"]
            cpus.append(r["server_cpu"])
            privs.append(mem.private)
            anons.append(mem.anon)
        finally:
            server.stop()
            shutil.rmtree(cache, ignore_errors=True)
    label = f"{name} cold {mode}"
    results[label] = {"times": times, "cpu": median(cpus), "private_kib": max(privs),
                      "anon_kib": max(anons), "page_cache_dropped": dropped}
    print(f"  {label:28s} median {median(times) * 1e3:8.1f} ms  server CPU {median(cpus) * 1e3:7.1f} ms"
          f"  (page cache {'dropped' if dropped else 'NOT dropped'})", flush=True)


def first_read_rows(start, array_id, path, name, mode, reps, results, suffix="", fine_warm=None):
    """The first read of a fresh client process, on a fresh server (empty cache, source in
    the page cache) and on a warm one (the same tensor read once by another process before):
    `start()` starts a server and returns it; the caller's `finally` stops nothing here.
    `fine_warm()`, when given, starts a server over a cache that holds the tensor on the fine
    grid only (what socket readers leave), for one more row of the mapped reads."""
    states = ("cold", "warm", "fine-warm") if fine_warm and mode == "mmap" else ("cold", "warm")
    for state in states:
        times, cpus = [], []
        for _ in range(reps):
            server = fine_warm() if state == "fine-warm" else start()
            try:
                if state == "warm":
                    run_worker({"kind": "read", "location": server.location, "ids": [array_id],
                                "mode": mode, "reps": 1})
                r = run_worker({"kind": "first", "location": server.location, "id": array_id,
                                "path": str(path), "mode": mode, "cpu_pid": server.pid})
                times += r["times"]
                cpus.append(r["server_cpu"])
            finally:
                server.stop()
        label = f"{name} first read of a fresh process, {state} server, {mode}{suffix}"
        results[label] = {"times": times, "cpu": median(cpus), "private_kib": 0, "anon_kib": 0}
        print(f"  {label:60s} median {median(times) * 1e3:8.1f} ms  server CPU {median(cpus) * 1e3:7.1f} ms",
              flush=True)


# --------------------------------------------------------------------------- reference


def reference_module():
    """benches/reference/biopb_reference.py: install, zarr writer, server launcher."""
    here = str(ROOT / "benches" / "reference")
    if here not in sys.path:
        sys.path.insert(0, here)
    import biopb_reference

    return biopb_reference


def planes_module():
    """benches/planes.py: the plane-wise reader's cold session (issue 37)."""
    spec = importlib.util.spec_from_file_location("tessera_bench_planes", ROOT / "benches" / "planes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start_reference(ref, binary, data, scratch, cache):
    """A fresh biopb server (scratch and cache emptied) with run.py's /proc readings."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    cls = type("ReferenceProcess", (ProcStats, ref.ReferenceServer), {})
    return cls(binary, data, scratch, cache, min_sources=len(REF_NAMES))


def reference_ids(server, files, tries=20) -> dict:
    """{workload name: array id} from the server's catalog (ids are hashes of the url)."""
    import numpy as np

    want = {n: tuple(np.load(files[n], mmap_mode="r").shape) for n in REF_NAMES}
    for _ in range(tries):
        sources = run_worker({"kind": "catalog", "location": server.location})["sources"]
        ids = {}
        for n in REF_NAMES:
            for src in sources:
                url = (src.get("source_url") or "").rstrip("/")
                if url.endswith(f"/{n}.zarr") and tuple(src.get("shape") or ()) == want[n]:
                    ids[n] = src["source_id"]
        if len(ids) == len(REF_NAMES):
            return ids
        time.sleep(0.5)
    raise RuntimeError(f"biopb server does not list {sorted(set(REF_NAMES) - set(ids))}: {sources}\n"
                       + server.log_tail())


def measure_reads_reference(server, name, array_id, path, mode, reps, results):
    """Warm reads on biopb's server, as `measure_reads` does for Tessera's: one verified
    untimed read, one untimed read that counts the client's chunk_locate attempts and mmap
    hits (that server has no locate counter), then `reps` timed reads."""
    v = run_worker({"kind": "read", "location": server.location, "ids": [array_id],
                    "paths": [str(path)], "mode": mode, "reps": 0, "verify": True,
                    "count_paths": True})
    label = f"{name} warm {mode}{REF_SUFFIX}"
    if mode == "mmap" and v["mmap_chunks"] == 0:
        raise RuntimeError(f"{label}: the mmap fast path was not used ({v})")
    if mode == "mmap" and v["mmap_chunks"] < v["locate_calls"]:
        print(f"  {label}: only {v['mmap_chunks']} of {v['locate_calls']} chunks came by mmap", flush=True)
    if mode == "doget" and v["locate_calls"] != 0:
        raise RuntimeError(f"{label}: do_get mode used chunk_locate")
    cpu0 = server.cpu_seconds()
    with MemorySampler(server) as mem:
        r = run_worker({"kind": "read", "location": server.location, "ids": [array_id], "mode": mode,
                        "reps": reps})
    cpu = (server.cpu_seconds() - cpu0) / max(reps, 1)
    row = {"times": r["times"], "cpu": cpu, "private_kib": mem.private, "anon_kib": mem.anon,
           "client_cpu": r.get("client_cpu"), "client_minflt": r.get("client_minflt"),
           "locate_calls": v["locate_calls"], "mmap_chunks": v["mmap_chunks"]}
    results[label] = row
    print(f"  {label:28s} median {median(r['times']) * 1e3:8.1f} ms  server CPU {cpu * 1e3:7.1f} ms/read"
          f"  private {mem.private / 1024:6.1f} MiB  anon {mem.anon / 1024:6.1f} MiB"
          f"  client CPU {r['client_cpu'] * 1e3:7.1f} ms/read, {r['client_minflt']:.0f} faults/read", flush=True)
    return row


def measure_cold_reference(ref, binary, data, ids, name, mode, reps, work, results):
    """Cold reads on biopb's server, as `measure_cold` does for Tessera's: a new server
    (empty file cache, empty catalog) per repetition; the client reads the other tensor,
    drops the page cache, plans, and times the read. Server CPU is that of the timed read."""
    times, cpus, privs, anons, hwms, ready = [], [], [], [], [], []
    dropped = True
    warmup = "w64" if name != "w64" else "w256"
    scratch, cache = work / "ref-cold", work / "ref-cold-cache"
    for _ in range(reps):
        server = start_reference(ref, binary, data, scratch, cache)
        try:
            ready.append(server.ready_seconds)
            with MemorySampler(server) as mem:
                r = run_worker({"kind": "read", "location": server.location, "ids": [ids[name]],
                                "mode": mode, "reps": 1, "plan_first": True,
                                "warmup_ids": [ids[warmup]], "drop_caches": True,
                                "cpu_pid": server.pid})
            dropped = r.get("page_cache_dropped", False) and dropped
            times += r["times"]
            cpus.append(r["server_cpu"])
            privs.append(mem.private)
            anons.append(mem.anon)
            hwms.append(server.status_kib("VmHWM"))
        finally:
            server.stop()
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)
    label = f"{name} cold {mode}{REF_SUFFIX}"
    results[label] = {"times": times, "cpu": median(cpus), "private_kib": max(privs),
                      "anon_kib": max(anons), "hwm_kib": max(hwms), "page_cache_dropped": dropped,
                      "ready_s": ready}
    print(f"  {label:28s} median {median(times) * 1e3:8.1f} ms  server CPU {median(cpus) * 1e3:7.1f} ms"
          f"  VmHWM {max(hwms) / 1024:6.1f} MiB  (page cache {'dropped' if dropped else 'NOT dropped'};"
          f" start-up {median(ready):.1f} s)", flush=True)


def reference_phase(args, files, work, reps, cold_reps, res) -> dict:
    """biopb's own server on the same bytes (zarr v2, no compressor), warm then cold."""
    ref = reference_module()
    binary = ref.ensure_installed()
    target = parse_size(args.chunk_target) if args.chunk_target else 8 * MiB
    data = work / "reference-zarr"
    data.mkdir(parents=True, exist_ok=True)
    chunks = {n: ref.write_zarr_v2(files[n], data / f"{n}.zarr", target, work / "reference-state")
              for n in REF_NAMES}
    stray = sorted(p.name for p in data.iterdir() if p.name not in {f"{n}.zarr" for n in REF_NAMES})
    if stray:
        raise RuntimeError(f"{data} holds more than the workloads ({stray}); remove them")
    version = subprocess.run([str(binary), "version"], capture_output=True, text=True).stdout.strip()
    info = {"chunks": chunks, "version": " ".join(version.split()) or ref.VERSION}
    print(f"  biopb server: {info['version']}; zarr chunks "
          + ", ".join(f"{n} {tuple(c)}" for n, c in chunks.items()), flush=True)
    scratch, cache = work / "ref-warm", work / "ref-warm-cache"
    server = start_reference(ref, binary, data, scratch, cache)
    try:
        info["ready_s"] = server.ready_seconds
        ids = reference_ids(server, files)
        info["ids"] = ids
        time.sleep(0.5)
        sm = server.smaps()
        info["idle"] = {"rss": server.status_kib("VmRSS"),
                        "private": sm.get("Private_Clean", 0) + sm.get("Private_Dirty", 0)}
        print(f"  biopb server ready after {server.ready_seconds:.1f} s; ids {ids}; idle VmRSS "
              f"{info['idle']['rss'] / 1024:.1f} MiB, private {info['idle']['private'] / 1024:.1f} MiB",
              flush=True)
        for name in REF_NAMES:
            for mode in ("doget", "mmap"):
                measure_reads_reference(server, name, ids[name], files[name], mode, reps, res)
        info["hwm"] = server.status_kib("VmHWM")
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    for name in REF_NAMES:
        for mode in ("doget", "mmap"):
            measure_cold_reference(ref, binary, data, ids, name, mode, cold_reps, work, res)
    scratch, cache = work / "ref-first", work / "ref-first-cache"

    def fresh_reference():
        server = start_reference(ref, binary, data, scratch, cache)
        reference_ids(server, files)
        return server

    try:
        for mode in ("doget", "mmap"):
            first_read_rows(fresh_reference, ids["w256"], files["w256"], "w256", mode, cold_reps, res,
                            REF_SUFFIX)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    return info


def reference_table(res) -> str:
    """Tessera beside biopb's server, row by row (ratio of the medians: < 1 is Tessera faster)."""
    lines = ["| read | Tessera ms | biopb server ms | Tessera / biopb | server CPU ms/read, Tessera | "
             "biopb | server private RSS peak MiB, Tessera | biopb | server anon RSS peak MiB, Tessera | biopb |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, theirs in res.items():
        if not label.endswith(REF_SUFFIX):
            continue
        base = label[: -len(REF_SUFFIX)]
        ours = res.get(base)
        t_ref = median(theirs["times"])
        t_ours = median(ours["times"]) if ours else float("nan")
        ratio = f"{t_ours / t_ref:.2f}×" if ours else ""

        def mib(row, k):
            return f"{row[k] / 1024:.1f}" if row and row.get(k) else ""

        def cpu(row):
            return f"{row['cpu'] * 1e3:.1f}" if row and row["cpu"] == row["cpu"] else ""

        lines.append(f"| {base} | {fmt_ms(t_ours)} | {fmt_ms(t_ref)} | {ratio} | {cpu(ours)} | {cpu(theirs)} | "
                     f"{mib(ours, 'private_kib')} | {mib(theirs, 'private_kib')} | "
                     f"{mib(ours, 'anon_kib')} | {mib(theirs, 'anon_kib')} |")
    return "\n".join(lines)


def criterion_figures(run: bool) -> list:
    if run:
        # The reads above leave gigabytes of dirty segment pages; writing them back first
        # keeps the kernel's dirty throttling out of the append figures.
        os.sync()
        print("running cargo bench -p tessera-segments --bench segments -- --quick", flush=True)
        subprocess.run(["cargo", "bench", "-p", "tessera-segments", "--bench", "segments", "--", "--quick"],
                       cwd=ROOT, check=True)
    rows = []
    base = ROOT / "target" / "criterion"
    for est in sorted(base.glob("**/new/estimates.json")):
        bench = est.parent.parent.relative_to(base).as_posix()
        data = json.loads(est.read_text())
        point = data["median"]["point_estimate"] / 1e9
        bench_json = est.parent / "benchmark.json"
        thr = None
        if bench_json.exists():
            t = json.loads(bench_json.read_text()).get("throughput") or {}
            if "Bytes" in t:
                thr = t["Bytes"] / point / 1e9
        rows.append((bench, point, thr))
    return rows


# --------------------------------------------------------------------------- report


def fmt_duration(s):
    """A criterion median in the unit that reads best (ns, µs or ms)."""
    if s < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    return f"{s * 1e3:.2f} ms"


def fmt_ms(s):
    """Milliseconds: one decimal, two below 1 ms (the round-trip targets are 0.15–0.3 ms)."""
    if s != s:
        return "n/a"
    return f"{s * 1e3:.2f}" if s < 1e-3 else f"{s * 1e3:.1f}"


def machine() -> str:
    model = "unknown CPU"
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = pathlib.Path("/proc/meminfo").read_text().split()[1]
    return (f"{os.cpu_count()} cores ({model}), {int(mem) // (1 << 20)} GiB RAM, "
            f"Linux {platform.release()}, Python {platform.python_version()}")


def headline(res) -> str:
    """What the tensors are, and Tessera against biopb's server in one line: each row both
    measured, with the rows where Tessera is slower named (never only the good ones)."""
    text = ("**Headline.** *w256* is a 256 MiB `uint16` tensor of shape (8, 4, 2048, 2048) and "
            "*w64* a 64 MiB `float32` one of (4096, 4096), both `.npy` for Tessera and uncompressed "
            "Zarr v2 for biopb's server; *small* is many tiny tensors, read one by one.")
    pairs = [(label, median(res[label]["times"]) / median(res[label + REF_SUFFIX]["times"]))
             for label in res if not label.endswith(REF_SUFFIX) and label + REF_SUFFIX in res]
    if not pairs:
        return text + " This run did not measure biopb's server (`--reference`)."
    slower = [f"{label} ({ratio:.2f}×)" for label, ratio in pairs if ratio > 1.0]
    ratios = sorted(r for _, r in pairs)
    text += (f" Against biopb's server on the same machine and run, Tessera's time is "
             f"{ratios[0]:.2f}× to {ratios[-1]:.2f}× of biopb's over {len(pairs)} paired rows "
             f"(median {ratios[len(ratios) // 2]:.2f}×); ")
    text += ("slower in " + ", ".join(slower) + "." if slower else "it is slower in none of them.")
    return text


def results_table(res, anchors_by_name, reps) -> str:
    # With --reference, a column of Tessera / biopb server (ratio of the medians), and each
    # biopb server row right below the Tessera row it answers.
    with_ref = any(label.endswith(REF_SUFFIX) for label in res)
    vs_ref = [" Tessera / biopb server |"] if with_ref else []
    lines = ["| measurement | median ms |" + "".join(vs_ref) + " MB/s | vs np.load | vs memcpy | vs loopback TCP | server CPU ms/read | client CPU ms/read | client page faults/read | server private RSS peak MiB | server anon RSS peak MiB | reference | target |",
             "|---|---:|" + "---:|" * len(vs_ref) + "---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    order = []
    for label in res:
        if not label.endswith(REF_SUFFIX):
            order.append(label)
            if label + REF_SUFFIX in res:
                order.append(label + REF_SUFFIX)
    order += [label for label in res if label not in order]
    for label in order:
        row = res[label]
        name = label.split()[0]
        a = anchors_by_name.get(name)
        t = median(row["times"])
        if a:
            nb = a["bytes"]
            mbs = f"{nb / t / 1e6:.0f}"
            ratios = [f"{t / median(a[k]):.2f}×" if k in a else "" for k in ("np_load", "memcpy", "tcp")]
        else:
            mbs, ratios = "", ["", "", ""]
        ref, target = TARGETS.get(label, ("", ""))
        cpu = "" if row["cpu"] != row["cpu"] else f"{row['cpu'] * 1e3:.1f}"
        priv = f"{row['private_kib'] / 1024:.1f}" if row["private_kib"] else ""
        anon = f"{row['anon_kib'] / 1024:.1f}" if row["anon_kib"] else ""
        ccpu = f"{row['client_cpu'] * 1e3:.1f}" if row.get("client_cpu") is not None else ""
        cflt = f"{row['client_minflt']:.0f}" if row.get("client_minflt") is not None else ""
        vs = ""
        if with_ref:
            theirs = res.get(label + REF_SUFFIX)
            vs = f" {t / median(theirs['times']):.2f}× |" if theirs else "  |"
        lines.append(f"| {label} | {fmt_ms(t)} |{vs} {mbs} | {' | '.join(ratios)} | {cpu} | {ccpu} | {cflt} | {priv} | {anon} | {ref} | {target} |")
    for name, a in anchors_by_name.items():
        nb = a["bytes"]
        for k, title in (("np_load", "np.load (warm)"), ("memcpy", "memcpy (touched dst)"),
                         ("tcp", "loopback TCP"), ("np_load_cold", "np.load (page cache dropped)")):
            if k not in a:
                continue
            t = median(a[k])
            lines.append(f"| {name} anchor: {title} | {fmt_ms(t)} |" + " |" * len(vs_ref)
                         + f" {nb / t / 1e6:.0f} | | | | | | | | | | |")
    return "\n".join(lines)


COPY_TABLE = """\
| route | copies | where |
|---|---:|---|
| source → segment (cold), contiguous range of a C-order source, chunk under 2 MiB | **1** | `copy_file_range(2)`: source page cache → segment page cache inside the kernel (0 on filesystems that share extents); the crc32c reads the segment's pages through a transient mapping (a read pass, not a copy). The source is never mapped. The disk read into the page cache comes on top when the source is cold. |
| source → segment (cold), contiguous chunk of 2 MiB or more (the default 8 MiB grid) | 2 | `pread` into a pooled buffer (**1**), one `pwritev` into the segment (**2**): one copy more than `copy_file_range`, paid once per chunk, so the segment's page cache gets 2 MiB folios that every mapped read faults in one per 2 MiB instead of one per 64 KiB (decision 0009) |
| cached chunks of the other grid → segment (a cell whose bytes the cache holds on the tensor's other grid, decision 0024) | **1** | one vectored write from slices of those chunks' segment mappings into the new segment; no source read, no buffer |
| source → segment (cold), other regions (strided slab, Fortran order) | 2 (3 for Fortran) | `pread` into a pooled buffer (Fortran: into scratch, then a gather), then one `pwritev` into the segment |
| segment → biopb/pyarrow client via do_get | **4** | server: none in user space: the reply body is the gRPC framing followed by the chunk's `Bytes` slice of the segment mapping, written by h2 with a vectored write (`server/src/wire/flight/chunk_get.rs`, decision 0006; tonic's encoder used to copy it into its frame buffer); kernel: `send` copies into socket buffers (**1**), `recv` copies into gRPC's slices (**2**); client: Arrow C++ joins a body that arrived in several gRPC slices into one buffer (**3**, always for MiB messages); biopb hands out zero-copy `np.frombuffer` views and dask's block assembly copies every chunk into the result (**4**; skipped for a one-chunk tensor) |
| segment → biopb client via mmap (`chunk_locate`) | **1** | no server copy, no socket: the client maps the segment and reads the IPC message in place (a view on the page cache); dask's block assembly copies each chunk into the result (**1**; 0 for a one-chunk tensor) |
| segment → Rust client (`tessera get`, `tessera_client::Client::read`) via do_get | **4** | server as above; kernel: `send` (**1**), `recv` into h2's read buffer (**2**); tonic gathers a message's frames into its decode buffer (**3**); the client decodes the batch in place (`client/src/ipc.rs`; arrow-flight's own decoder copies every body that is not 64-byte aligned, which was one more copy and 8 MiB of fresh pages per chunk) and scatters it into the output array (**4**) |
| segment → Rust client via mmap (`chunk_locate`) | **1** | maps the segment, decodes the batch in place, scatters it into the output array (**1**; runs of 8 MiB or more split across up to four threads); the output is allocated once, with `MADV_HUGEPAGE` |
| np.load (anchor) | 1 | `read(2)` from the page cache into a fresh array (plus the page faults of fresh memory) |
"""


ANALYSIS_HEADING = "## Analysis (hand-written"


def reference_block(res, reference) -> str:
    """The doc's paragraph and table on biopb's own server ("" without --reference)."""
    if not reference:
        return ""
    chunks = ", ".join(f"{n} `{tuple(c)}`" for n, c in reference["chunks"].items())
    colds = [r for label, r in res.items() if label.endswith(REF_SUFFIX) and "hwm_kib" in r]
    cold_hwm = max((r["hwm_kib"] for r in colds), default=0)
    ready = [reference.get("ready_s", float("nan"))] + [t for r in colds for t in r.get("ready_s", [])]
    idle = reference.get("idle", {})
    return f"""

**Reference server, same run** (`--reference`): biopb's own server ({reference['version']};
installed by `benches/reference/setup.sh`), `biopb-tensor-server serve` on a JSON config
with `server.stability_window` 0 and `precache.enabled` false, a fresh `cache.file_cache_dir`
and fresh `BIOPB_*_HOME` folders. It has no `.npy` reader, so it serves the same bytes
written as uncompressed zarr v2 arrays (`compressor: null`) on Tessera's chunk grid
({chunks}), which is also the transfer grid it picks for them. Its rows, marked *(biopb
server)*, are measured by the same client workers and protocol as Tessera's (warm: one
verified read, then one untimed read that counts the client's `chunk_locate` attempts and
mmap hits to prove the path, then the timed reads; cold: a new server with an empty file
cache and catalog per repetition, timed from the client's read after its warm-up read and
the page-cache drop). *Tessera / biopb server* is the ratio of the medians: below 1,
Tessera is faster. Start-up to a complete catalog took {fmt_s(median(ready))} (median).
Idle: VmRSS {idle.get('rss', 0) / 1024:.1f} MiB, private {idle.get('private', 0) / 1024:.1f} MiB;
peak (VmHWM) {reference.get('hwm', 0) / 1024:.1f} MiB after the warm reads,
{cold_hwm / 1024:.1f} MiB at most in the cold servers.

{reference_table(res)}"""


def fmt_s(s):
    return "n/a" if s != s else f"{s:.1f} s"


def write_doc(path, res, anchors_by_name, reps, crit, latency, idle, extra_notes, reference=None):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lat = ""
    if latency:
        lat = ("| round trip | median ms | p90 ms | reference | target |\n|---|---:|---:|---|---|\n"
               f"| GetFlightInfo (w256, pyarrow.flight) | {fmt_ms(median(latency['flight_info']))} | "
               f"{fmt_ms(sorted(latency['flight_info'])[int(len(latency['flight_info']) * 0.9)])} | 1.4–1.7 ms | ≤ 0.3 ms |\n"
               f"| chunk_locate, warm | {fmt_ms(median(latency['locate']))} | "
               f"{fmt_ms(sorted(latency['locate'])[int(len(latency['locate']) * 0.9)])} | 0.5–0.6 ms | ≤ 0.15 ms |\n"
               f"| health action (the floor of a pyarrow action round trip) | {fmt_ms(median(latency['health']))} | "
               f"{fmt_ms(sorted(latency['health'])[int(len(latency['health']) * 0.9)])} | | |\n")
    crit_tab = ""
    if crit:
        crit_tab = "| criterion benchmark (`segments`) | median | throughput |\n|---|---:|---:|\n" + "".join(
            f"| {b} | {fmt_duration(p)} | {'' if t is None else f'{t:.2f} GB/s'} |\n" for b, p, t in crit)
    text = f"""# Performance

Generated by `benches/run.py` on {now}. Re-run it to refresh every figure below
(`.venv/bin/python benches/run.py [--quick] [--reps N] [--criterion]`).

{headline(res)}

**Machine:** {machine()}. Shared and noisy (other builds ran at the same time): compare
the rows of one run with each other, not with another run.

**Method.** Release server (`cargo build --release -p tessera-cli`), file cache in a
fresh directory, default chunk target unless noted. Each figure is the median of
{reps} repetitions. Client rows call the unmodified `biopb==0.13.0` client exactly as a user
does, `TensorFlightClient(location, cache_bytes=0).get_tensor(id).compute()`, in a separate
process per measurement: *do_get* sets `BIOPB_CACHEFILE_TRANSFER_DISABLED=1`, *mmap* leaves
the fast path on (the runner checks the server's `locates` counter to prove which path ran).
*Warm*: chunks already in the segment cache and page cache (one verified, untimed read
first). *Cold*: a new server with an empty cache directory per repetition; the client
process first reads another tensor of that server (so its own first-call costs, imports,
thread pools, allocator arenas and the connection, are paid), then runs
`echo 1 > /proc/sys/vm/drop_caches` (so the source comes from disk) and plans the tensor
before the clock starts; server CPU is that of the timed read. *First read of a fresh
process*: one `get_tensor(id).compute()` in a new client process, timed whole, on a new
server (*cold server*), on one another process read the tensor from once (*warm server*),
and, over mmap, on a server restarted over a cache that holds the tensor on the fine grid
only (*fine-warm server*: a server planning loopback reads there read it over do_get, as
socket readers leave it). Anchors, same run, same bytes:
`np.load` of the same file (page cache warm; it allocates a fresh array each time),
`np.copyto` into a preallocated touched array (memcpy), one loopback TCP connection
(`sendall`/`recv_into`). Server CPU is user+system time from `/proc/PID/stat` over the
timed repetitions, divided by the repetitions; client CPU and page faults are the biopb
process's own (`getrusage`: user+system time of all its threads, minor faults) per warm read. The *Rust client* rows time the `tessera get`
command end to end (process start, connect, plan, and the read into one output buffer; one
untimed read is compared with numpy, the timed ones write the `.npy` to `/dev/null`), with
the command's own CPU and faults (`wait4`). Private RSS is the peak of
`Private_Clean + Private_Dirty` in `/proc/PID/smaps_rollup` sampled every 20 ms while the
reads ran (mapped segment pages the server alone touches count as private-clean).

## Results

{results_table(res, anchors_by_name, reps)}{reference_block(res, reference)}

Idle server: VmRSS {idle.get('rss', 0) / 1024:.1f} MiB, private {idle.get('private', 0) / 1024:.1f} MiB
(reference 118 MiB, target ≤ 20 MiB). Peak over the whole run: VmHWM {idle.get('hwm', 0) / 1024:.1f} MiB.

{lat}
{extra_notes}

## How many times each route copies a chunk's bytes

{COPY_TABLE}

## Segment store micro benchmarks

{crit_tab or '(not run in this pass: `benches/run.py --criterion`)'}
"""
    # The hand-written analysis below the generated part survives a re-run.
    if path.exists():
        old = path.read_text()
        at = old.find(ANALYSIS_HEADING)
        if at >= 0:
            text = text.rstrip("\n") + "\n\n" + old[at:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")


# --------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="skip the big volume; 3 cold repetitions")
    ap.add_argument("--reps", type=int, default=7, help="repetitions per measurement (median reported)")
    ap.add_argument("--big", default="2GiB", help="size of the big u16 volume (default 2GiB)")
    ap.add_argument("--small-count", type=int, default=1000, help="number of 64 KiB tensors")
    ap.add_argument("--work", default="/tmp/tessera-bench", help="where workloads and caches live")
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "tessera"))
    ap.add_argument("--no-build", action="store_true", help="do not run cargo build --release")
    ap.add_argument("--chunk-target", help="pass --chunk-target to the server")
    ap.add_argument("--sweep", help="comma list of chunk targets: w256/w64 warm+cold reads per target, then exit")
    ap.add_argument("--criterion", action="store_true", help="also run the segments criterion benches")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "guides" / "performance.md"))
    ap.add_argument("--no-doc", action="store_true", help="print only; do not rewrite the doc")
    ap.add_argument("--planes", action="store_true",
                    help="also the plane-wise reader of benches/planes.py (a viewer reading a (40, 2048, 2048) "
                         "volume a z-plane at a time, cold); with --reference, on biopb's server too")
    ap.add_argument("--reference", action="store_true",
                    help="also measure biopb's own server (biopb-tensor-server 0.13.0) on the same bytes; "
                         "installs it into benches/reference/.venv on first use")
    args = ap.parse_args()
    if args.worker:
        worker_main(json.loads(args.worker))
        return

    work = pathlib.Path(args.work)
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "-p", "tessera-cli"], cwd=ROOT, check=True)
    print("workloads:", flush=True)
    files = make_workloads(work, None if args.quick else parse_size(args.big), args.small_count)
    reps = args.reps
    cold_reps = 3 if args.quick else reps
    extra = ["--chunk-target", args.chunk_target] if args.chunk_target else []

    if args.sweep:
        if args.reference:
            print("--reference is ignored with --sweep", flush=True)
        sweep(args, files, work, reps, cold_reps)
        return

    print("anchors:", flush=True)
    anchors_by_name = {n: anchors(files[n], reps) for n in ("w256", "w64")}
    for n, a in anchors_by_name.items():
        print(f"  {n}: np.load {fmt_ms(median(a['np_load']))} ms, memcpy {fmt_ms(median(a['memcpy']))} ms, "
              f"loopback TCP {fmt_ms(median(a['tcp']))} ms", flush=True)
    if "big" in files:
        anchors_by_name["big"] = {"bytes": os.path.getsize(files["big"]) - 128}

    res = {}
    cache = work / "warm-cache"
    shutil.rmtree(cache, ignore_errors=True)
    served = [files["w256"], files["w64"], files["small"]] + ([files["big"]] if "big" in files else [])
    server = Server(args.bin, served, cache, extra)
    idle = {}
    try:
        time.sleep(0.5)
        sm = server.smaps()
        idle = {"rss": server.status_kib("VmRSS"), "private": sm.get("Private_Clean", 0) + sm.get("Private_Dirty", 0)}
        print(f"idle server: VmRSS {idle['rss'] / 1024:.1f} MiB, private {idle['private'] / 1024:.1f} MiB", flush=True)
        print("warm reads:", flush=True)
        for name in ("w256", "w64"):
            for mode in ("doget", "mmap"):
                measure_reads(server, [name], [files[name]], mode, reps, f"{name} warm {mode}", res)
        for name in ("w256", "w64"):
            for mode in ("doget", "mmap"):
                measure_rust_cli(args.bin, server, name, files[name], mode, reps, res)
        if "big" in files:
            for mode in ("doget", "mmap"):
                measure_reads(server, ["big"], [files["big"]], mode, max(3, reps // 2), f"big warm {mode}", res)
        ids = [i for i in run_worker({"kind": "ids", "location": server.location})["ids"] if i.startswith("s")]
        small_ids = sorted(i for i in ids if i not in ("w256", "w64"))[: args.small_count]
        small_paths = [files["small"] / f"{i.split('s', 1)[-1]}.npy" for i in small_ids]
        for mode in ("doget", "mmap"):
            run_worker({"kind": "read", "location": server.location, "ids": small_ids, "mode": mode, "reps": 0})
            cpu0 = server.cpu_seconds()
            r = run_worker({"kind": "read", "location": server.location, "ids": small_ids, "mode": mode,
                            "reps": 3})
            per = [t / len(small_ids) for t in r["times"]]
            res[f"small warm {mode} (per tensor)"] = {
                "times": per, "cpu": (server.cpu_seconds() - cpu0) / 3 / len(small_ids),
                "private_kib": 0, "anon_kib": 0}
            print(f"  small warm {mode}: {median(per) * 1e3:.2f} ms per 64 KiB tensor", flush=True)
        del small_paths
        latency = run_worker({"kind": "latency", "location": server.location, "id": "w256", "reps": 300})
        print(f"  GetFlightInfo {fmt_ms(median(latency['flight_info']))} ms, chunk_locate "
              f"{fmt_ms(median(latency['locate']))} ms", flush=True)
        idle["hwm"] = server.status_kib("VmHWM")
    finally:
        server.stop()
        shutil.rmtree(cache, ignore_errors=True)

    print("cold reads:", flush=True)
    for name in ("w256", "w64"):
        for mode in ("doget", "mmap"):
            measure_cold(args.bin, files, name, mode, cold_reps, work, res, extra)
    if "big" in files:
        measure_cold(args.bin, files, "big", "doget", 1, work, res, extra)
    print("first reads of a fresh client process:", flush=True)
    first_cache = work / "first-cache"

    def fresh_tessera():
        shutil.rmtree(first_cache, ignore_errors=True)
        return Server(args.bin, [files["w256"]], first_cache, extra)

    def fine_warm_tessera():
        # Socket readers leave the tensor on the fine grid: a server that plans loopback reads
        # there reads it once over do_get; the measured server starts over that cache and cuts
        # its coarse cells from the fine chunks (decision 0024).
        shutil.rmtree(first_cache, ignore_errors=True)
        first = Server(args.bin, [files["w256"]], first_cache, [*extra, "--loopback-plans", "socket"])
        try:
            run_worker({"kind": "read", "location": first.location, "ids": ["w256"], "mode": "doget",
                        "reps": 1})
        finally:
            first.stop()
        return Server(args.bin, [files["w256"]], first_cache, extra)

    for mode in ("doget", "mmap"):
        first_read_rows(fresh_tessera, "w256", files["w256"], "w256", mode, cold_reps, res,
                        fine_warm=fine_warm_tessera)
    shutil.rmtree(first_cache, ignore_errors=True)

    reference = None
    if args.reference:
        print("reference server (biopb-tensor-server):", flush=True)
        reference = reference_phase(args, files, work, reps, cold_reps, res)

    if args.planes:
        planes_module().planes_phase(args.bin, work, cold_reps, res, reference=args.reference, extra=extra)

    crit = criterion_figures(args.criterion)
    table = results_table(res, anchors_by_name, reps)
    print()
    print(table)
    if reference:
        print()
        print(reference_table(res))
    notes = ""
    if any(not r.get("page_cache_dropped", True) for r in res.values()):
        notes = "**Note:** the page cache could not be dropped here; cold rows read the source from the page cache."
    if not args.no_doc:
        write_doc(pathlib.Path(args.doc), res, anchors_by_name, reps, crit, latency, idle, notes, reference)


def sweep(args, files, work, reps, cold_reps):
    rows = []
    for target in args.sweep.split(","):
        res = {}
        cache = work / f"sweep-{target}"
        shutil.rmtree(cache, ignore_errors=True)
        server = Server(args.bin, [files["w256"], files["w64"]], cache, ["--chunk-target", target])
        try:
            for name in ("w256", "w64"):
                for mode in ("doget", "mmap"):
                    measure_reads(server, [name], [files[name]], mode, reps, f"{name} warm {mode}", res)
        finally:
            server.stop()
            shutil.rmtree(cache, ignore_errors=True)
        measure_cold(args.bin, files, "w256", "doget", cold_reps, work, res, ["--chunk-target", target])
        measure_cold(args.bin, files, "w256", "mmap", cold_reps, work, res, ["--chunk-target", target])
        rows.append((target, res))
    cols = ["w256 warm doget", "w256 warm mmap", "w256 cold doget", "w256 cold mmap", "w64 warm doget", "w64 warm mmap"]
    print()
    print("| chunk target | " + " | ".join(f"{c} ms" for c in cols)
          + " | w256 warm do_get server CPU ms | w256 warm do_get client CPU ms"
          + " | w256 warm mmap client CPU ms | w256 warm do_get server anon RSS MiB |")
    print("|---|" + "---:|" * (len(cols) + 4))
    for target, res in rows:
        cells = [fmt_ms(median(res[c]["times"])) if c in res else "" for c in cols]
        w, m = res["w256 warm doget"], res["w256 warm mmap"]
        print(f"| {target} | " + " | ".join(cells) + f" | {w['cpu'] * 1e3:.0f}"
              + f" | {w['client_cpu'] * 1e3:.0f} | {m['client_cpu'] * 1e3:.0f}"
              + f" | {w['anon_kib'] / 1024:.0f} |")


if __name__ == "__main__":
    main()
