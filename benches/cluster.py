#!/usr/bin/env python3
"""Cluster benchmark (issue 32, decision 0036): a dask.distributed job on a node reading a
tensor through a node-local Tessera (`tessera serve grpc://ORIGIN`) whose origin is behind a
1 Gbit/s link, twice, one run, side by side.

The link: benches/shaped_link.py, a network namespace (the origin's) joined to this one (the
node's) by a veth pair, each end's egress a token bucket, ``tbf rate 1gbit``. No delay: this
kernel has no netem qdisc, so the link has a rate and no round trip.

The tensor: ``vol.npy``, u16, ``--shape`` (128 x 2048 x 2048 = 1 GiB by default), uniformly
random values (so nothing on the way could gain by compressing them), written once and
reused by a stamp. The origin Tessera serves it from its folder in the origin's namespace;
the node's Tessera serves ``grpc://ORIGIN`` in this one, with a fresh cache for every pass-1
round; a dask LocalCluster of 4 worker processes (1 thread each) in this namespace reads it
through the unmodified biopb 0.13.0 client, ``TensorFlightClient(node).get_tensor("vol")``,
each block XOR-folded in its worker and compared with the file's fold of the same block (the
bytes are checked on every read, and the driver receives 8 bytes per block, not the tensor).
Both routes: mmap (``chunk_locate``) and do_get (``BIOPB_CACHEFILE_TRANSFER_DISABLED=1``).

Rows, medians of ``--reps``:

* plain TCP through the link (a Python socket sender in the origin's namespace, a receiver
  here): the ceiling;
* dask reading the origin directly, no node (do_get: the origin is not on loopback);
* pass 1: a fresh node, its cache empty: every cell crosses the link; the origin's DoGet
  calls counted from its ``/metrics`` (each origin chunk once);
* pass 2: the same node again (0 DoGets at the origin);
* pass 2 with the origin stopped (SIGSTOP for the whole read: hung connections, not refused
  ones): the same time, no errors;
* a local Tessera serving the file directly, warm: what "local mmap speed" is.

Pass 1 is measured for each ``--fetches`` value (``--upstream-fetches``: 2 is the old
behaviour, every fetch holding one of max(cores, 2) decode permits). Wall time, MiB/s, the
ratio to the link rate (1 Gbit/s = 119.2 MiB/s), CPU of the node, of the origin and of the
4 workers. Needs root (netns, tc) and iproute2.

Usage (from the repository root)::

    .venv/bin/python benches/cluster.py --bin target/debug/tessera          # writes the docs
    .venv/bin/python benches/cluster.py --quick --no-doc                    # 128 MiB, 1 rep
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
# benches/zarr.py is beside this file: keep the folder off the import path (dask imports zarr).
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]


def _load(name, file):
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fb = _load("tessera_format_bench", "format_bench.py")  # results, docs, binary note
bench = fb.bench  # run.py: workers, /proc readings, the launcher
shaped_link = _load("tessera_shaped_link", "shaped_link.py")

median, MiB = fb.median, fb.MiB
LINK_MIB_S = shaped_link.GBIT_MIB_S
MODES = ("mmap", "doget")
WORKERS = 4
STAMP = "tessera-cluster-bench-1"
SECTION = "## Cluster: node-local caches"
ANALYSIS = "### What limits it (hand-written"
NS, HOST_IF, NS_IF = "tsrclus", "tsrch0", "tsrcn0"
HOST_IP, NS_IP = "10.231.9.1", "10.231.9.2"
ORIGIN_PORT, METRICS_PORT, TCP_PORT = 5065, 5066, 5067
# The origin listens off loopback, so it needs a token; the node sends it upstream.
TOKEN = "cluster-bench-token-0123456789"


# --------------------------------------------------------------------------- the tensor


def write_tensor(path: pathlib.Path, stamp: pathlib.Path, shape) -> None:
    """Writes (or reuses) `vol.npy`: u16, uniformly random."""
    import numpy as np

    want = {"format": STAMP, "shape": list(shape)}
    if path.exists() and stamp.exists() and json.loads(stamp.read_text()) == want:
        return
    stamp.unlink(missing_ok=True)
    print(f"  writing {path.name}, {tuple(shape)} u16, random", flush=True)
    out = np.lib.format.open_memmap(path, mode="w+", dtype="<u2", shape=tuple(shape))
    rng = np.random.default_rng(32)
    for z in range(0, shape[0], 8):
        out[z:z + 8] = rng.integers(0, 1 << 16, (min(8, shape[0] - z), *shape[1:]), dtype=np.uint16)
    out.flush()
    del out
    stamp.write_text(json.dumps(want))


# --------------------------------------------------------------------------- in the node's dask driver


def fold(block):
    """The XOR of a block's bytes, 8 at a time (a block's size is a multiple of 8 here)."""
    import numpy as np

    return int(np.bitwise_xor.reduce(np.ascontiguousarray(block).reshape(-1).view(np.uint64)))


def block_slices(chunks):
    """The slices of every block of a dask array's `chunks`, in `to_delayed().ravel()` order."""
    import itertools

    bounds = []
    for axis in chunks:
        starts = [0]
        for n in axis:
            starts.append(starts[-1] + n)
        bounds.append([slice(a, b) for a, b in zip(starts, starts[1:])])
    return list(itertools.product(*bounds))


def driver_main(conf: dict) -> None:
    """The node's dask job, one LocalCluster for the run; reads JSON commands on stdin and
    answers each with one JSON line on stdout."""
    import resource

    import dask
    import numpy as np
    from biopb.tensor import TensorFlightClient
    from distributed import Client, LocalCluster

    local = np.load(conf["path"], mmap_mode="r")
    expected = {}

    def want(chunks):
        key = json.dumps(chunks)
        if key not in expected:
            expected[key] = [fold(local[s]) for s in block_slices(chunks)]
        return expected[key]

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    out = sys.stdout
    sys.stdout = sys.stderr  # only answers on the real stdout
    with LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=40) as cluster, Client(cluster) as client:
        out.write(json.dumps({"ready": True, "workers": len(client.run(os.getpid))}) + "\n")
        out.flush()
        for line in sys.stdin:
            job = json.loads(line)
            answer = {}
            try:
                before = sum(client.run(cpu).values())
                t0 = time.perf_counter()
                client_of = TensorFlightClient(job["location"], cache_bytes=0, token=job.get("token"))
                tensor = client_of.get_tensor(job["id"])
                parts = [dask.delayed(fold)(b) for b in tensor.to_delayed().ravel()]
                got = list(dask.compute(*parts))
                answer["time"] = time.perf_counter() - t0
                answer["workers_cpu"] = sum(client.run(cpu).values()) - before
                chunks = [list(c) for c in tensor.chunks]
                answer["blocks"] = len(got)
                answer["ok"] = got == want(chunks)
            except Exception as e:  # reported, and the run stops on it
                answer["error"] = f"{type(e).__name__}: {str(e)[:1500]}"
            out.write(json.dumps(answer) + "\n")
            out.flush()


class Driver:
    """The dask driver process of one route (its environment chooses it)."""

    def __init__(self, mode, path, log):
        env = dict(os.environ)
        env.pop("BIOPB_CACHEFILE_TRANSFER_DISABLED", None)
        if mode == "doget":
            env["BIOPB_CACHEFILE_TRANSFER_DISABLED"] = "1"
        self.proc = subprocess.Popen([sys.executable, __file__, "--driver", json.dumps({"path": str(path)})],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                     env=env)
        hello = json.loads(self.proc.stdout.readline() or "{}")
        if hello.get("workers") != WORKERS:
            raise RuntimeError(f"the dask cluster did not start: {hello}")

    def read(self, location, array_id="vol", token=None):
        self.proc.stdin.write(json.dumps({"location": location, "id": array_id, "token": token}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline() or '{"error": "the driver ended"}')
        if "error" in answer or not answer.get("ok"):
            raise RuntimeError(f"a read of {location} failed: {answer}")
        return answer

    def stop(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --------------------------------------------------------------------------- plain TCP


def tcp_send(conf: dict) -> None:
    """In the origin's namespace: sends `bytes` to host:port, 4 MiB at a time."""
    block = memoryview(os.urandom(4 << 20))
    with socket.create_connection((conf["host"], conf["port"])) as s:
        left = conf["bytes"]
        while left > 0:
            n = min(left, len(block))
            s.sendall(block[:n])
            left -= n


def tcp_ceiling(link, nbytes, reps) -> dict:
    """Seconds (from the first byte) and receiver CPU of `nbytes` through the link, one
    connection each."""
    times, cpus = [], []
    with socket.create_server((HOST_IP, TCP_PORT)) as lsock:
        for _ in range(reps):
            sender = subprocess.Popen(link.in_namespace(
                [sys.executable, __file__, "--tcp-send", json.dumps(
                    {"host": HOST_IP, "port": TCP_PORT, "bytes": nbytes})]))
            conn, _ = lsock.accept()
            sink = memoryview(bytearray(4 << 20))
            got = conn.recv_into(sink)
            c0, t0 = time.process_time(), time.perf_counter()
            while got < nbytes:
                n = conn.recv_into(sink)
                if n == 0:
                    break
                got += n
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            conn.close()
            sender.wait(60)
            if got != nbytes:
                raise RuntimeError(f"TCP through the link: {got} of {nbytes} bytes")
    return {"times": times, "client_cpu": median(cpus)}


# --------------------------------------------------------------------------- servers


class Tessera(bench.ProcStats, bench.TesseraProcess):
    """`tessera serve` with its own empty cache and state directories."""

    def __init__(self, binary, source, work, tag, extra=(), listen="127.0.0.1:0", env=None):
        cache, state = work / f"{tag}-cache", work / f"{tag}-state"
        for d in (cache, state):
            subprocess.run(["rm", "-rf", str(d)], check=True)
        super().__init__(binary, [source, "--cache-dir", cache, "--cache-max-bytes", "16GiB",
                                  "--state-dir", state, "--http-listen", "127.0.0.1:0", *extra],
                         start_timeout=120, listen=listen, env=env)


def origin_wrapper(work, link, binary) -> pathlib.Path:
    """A script that runs the binary in the origin's namespace (`ip netns exec` execs, so
    the process keeps the pid the launcher sees: CPU and SIGSTOP reach the server)."""
    path = work / "origin-tessera.sh"
    path.write_text("#!/bin/sh\nexec " + " ".join(link.in_namespace([pathlib.Path(binary).resolve()]))
                    + ' "$@"\n')
    path.chmod(0o755)
    return path


def origin_do_gets() -> int:
    """DoGet calls the origin answered OK, from its /metrics."""
    req = urllib.request.Request(f"http://{NS_IP}:{METRICS_PORT}/metrics",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    total = 0
    for line in text.splitlines():
        if line.startswith("tessera_grpc_calls_total{") and 'method="DoGet"' in line and 'code="OK"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def wait_for(server, array_id="vol", tries=100):
    for _ in range(tries):
        ids = bench.run_worker({"kind": "catalog", "location": server.location})["sources"]
        if any(s["source_id"] == array_id for s in ids):
            return
        time.sleep(0.3)
    raise RuntimeError(f"{array_id} is not served:\n" + "".join(server.log[-20:]))


def locates(server) -> int:
    return bench.cache_stats(server.location).get("locates", 0)


def check_route(server, mode, before, label):
    n = locates(server) - before
    if (mode == "mmap") != (n > 0):
        raise RuntimeError(f"{label}: {n} chunk_locate calls on the {mode} route")


# --------------------------------------------------------------------------- phases


def one_read(driver, server, origin, location=None):
    """One timed read; the CPU of the server read from, of the origin, and of the workers."""
    s0 = server.cpu_seconds() if server else 0.0
    o0 = origin.cpu_seconds()
    d0 = origin_do_gets()
    r = driver.read(location or server.location, token=TOKEN if location else None)
    return {"time": r["time"], "workers_cpu": r["workers_cpu"], "blocks": r["blocks"],
            "server_cpu": (server.cpu_seconds() - s0) if server else None,
            "origin_cpu": origin.cpu_seconds() - o0, "origin_do_gets": origin_do_gets() - d0}


def add_row(res, label, reads, nbytes, **extra):
    pick = lambda k: None if reads[0].get(k) is None else median([r[k] for r in reads])  # noqa: E731
    row = {"times": [r["time"] for r in reads], "bytes": nbytes, "server_cpu": pick("server_cpu"),
           "origin_cpu": pick("origin_cpu"), "client_cpu": pick("workers_cpu"),
           "origin_do_gets": [r["origin_do_gets"] for r in reads], "blocks": reads[0]["blocks"], **extra}
    if "read_aheads" in reads[0]:
        row["read_aheads"] = [r["read_aheads"] for r in reads]
    res.add(label, row)


def stopped_state(pid, timeout=5.0):
    """Waits until process `pid` is stopped (state T in /proc)."""
    deadline = time.monotonic() + timeout
    while pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} did not stop")
        time.sleep(0.01)
    time.sleep(0.1)  # its last tick accounted


def node_rounds(args, driver, mode, origin, res, work, nbytes, fetches, outage):
    """`--reps` rounds of a fresh node: pass 1, then pass 2; with `outage`, the last round
    also reads pass 2 with the origin stopped."""
    p1, p2, stopped = [], [], []
    for i in range(args.reps):
        node = Tessera(args.bin, f"grpc://{NS_IP}:{ORIGIN_PORT}", work, "node",
                       extra=("--upstream-fetches", str(fetches), *args.node_args.split()), env={"TESSERA_UPSTREAM_TOKEN": TOKEN})
        try:
            wait_for(node)
            l0 = locates(node)
            p1.append(one_read(driver, node, origin))
            p1[-1]["read_aheads"] = bench.cache_stats(node.location).get("read_aheads", 0)
            p2.append(one_read(driver, node, origin))
            check_route(node, mode, l0, f"node {mode}")
            if outage and i == args.reps - 1:
                os.kill(origin.pid, signal.SIGSTOP)
                try:
                    stopped_state(origin.pid)
                    o0, t0 = origin.cpu_seconds(), time.perf_counter()
                    for _ in range(args.reps):
                        s0 = node.cpu_seconds()
                        r = driver.read(node.location)
                        stopped.append({"time": r["time"], "workers_cpu": r["workers_cpu"],
                                        "blocks": r["blocks"], "server_cpu": node.cpu_seconds() - s0,
                                        "origin_cpu": 0.0, "origin_do_gets": 0})
                    stopped_for = time.perf_counter() - t0
                    if origin.cpu_seconds() != o0:
                        raise RuntimeError("the origin ran while stopped")
                finally:
                    os.kill(origin.pid, signal.SIGCONT)
                errors = [line for line in node.log if " ERROR " in line]
                res.info[f"outage_{mode}"] = {"stopped_s": stopped_for, "node_errors": errors[-5:]}
        finally:
            node.stop()
    tag = f"{fetches} upstream fetches"
    add_row(res, f"pass 1 {mode}, node ({tag})", p1, nbytes, link=True, fetches=fetches)
    add_row(res, f"pass 2 {mode}, node ({tag})", p2, nbytes, fetches=fetches)
    if stopped:
        add_row(res, f"pass 2 {mode}, node, origin stopped", stopped, nbytes)


def warm_rounds(args, origin, res, work, nbytes, fetches):
    """Pass 1 by the Rust client instead of dask: `tessera warm NODE vol` (4 chunks at once,
    every one through `chunk_locate`) on a fresh node, `--reps` rounds per fetches value."""
    for f in fetches:
        reads = []
        for _ in range(args.reps):
            node = Tessera(args.bin, f"grpc://{NS_IP}:{ORIGIN_PORT}", work, "node",
                           extra=("--upstream-fetches", str(f), *args.node_args.split()),
                           env={"TESSERA_UPSTREAM_TOKEN": TOKEN})
            try:
                wait_for(node)
                s0, o0, d0 = node.cpu_seconds(), origin.cpu_seconds(), origin_do_gets()
                c0 = os.times()
                t0 = time.perf_counter()
                subprocess.run([args.bin, "warm", node.location, "vol"], check=True, capture_output=True)
                t = time.perf_counter() - t0
                c1 = os.times()
                reads.append({"time": t, "server_cpu": node.cpu_seconds() - s0,
                              "origin_cpu": origin.cpu_seconds() - o0, "origin_do_gets": origin_do_gets() - d0,
                              "workers_cpu": c1.children_user + c1.children_system
                              - c0.children_user - c0.children_system, "blocks": None})
            finally:
                node.stop()
        add_row(res, f"pass 1 by tessera warm, node ({f} upstream fetches)", reads, nbytes, link=True, fetches=f)


def run(args, res, work, path, nbytes):
    link = shaped_link.ShapedLink(NS, HOST_IF, NS_IF, HOST_IP, NS_IP)
    origin = None
    drivers = {}
    log = open(work / "dask.log", "ab")
    try:
        link.shape("1gbit")
        res.info["qdiscs"] = link.qdiscs()
        print(f"  link: {res.info['qdiscs']}", flush=True)
        print("plain TCP through the link:", flush=True)
        r = tcp_ceiling(link, args.tcp_bytes, args.reps)
        res.add("plain TCP, 1 connection", {"times": r["times"], "bytes": args.tcp_bytes, "link": True,
                                            "client_cpu": r["client_cpu"]})
        origin = Tessera(origin_wrapper(work, link, args.bin), path.parent, work, "origin",
                         extra=("--metrics-listen", f"{NS_IP}:{METRICS_PORT}"), listen=f"{NS_IP}:{ORIGIN_PORT}",
                         env={"TESSERA_TOKEN": TOKEN})
        fetches = [int(f) for f in args.fetches.split(",")]
        # The origin's first read fills its cache from the file: done before any row.
        subprocess.run([args.bin, "warm", origin.location, "vol", "--token", TOKEN], check=True, capture_output=True)
        print("pass 1 by `tessera warm` (no dask)", flush=True)
        warm_rounds(args, origin, res, work, nbytes, fetches)
        for mode in args.modes.split(","):
            print(f"{mode}: starting the dask cluster", flush=True)
            drivers[mode] = driver = Driver(mode, path, log)
            if mode == "doget":
                print("  dask reading the origin directly", flush=True)
                reads = [one_read(driver, None, origin, location=origin.location) for _ in range(args.reps)]
                add_row(res, "dask, origin directly (do_get)", reads, nbytes, link=True)
            print("  a local Tessera, warm", flush=True)
            local = Tessera(args.bin, path.parent, work, "local")
            try:
                l0 = locates(local)
                driver.read(local.location)
                reads = [one_read(driver, local, origin) for _ in range(args.reps)]
                check_route(local, mode, l0, f"local {mode}")
                add_row(res, f"warm {mode}, local Tessera", reads, nbytes)
            finally:
                local.stop()
            for f in fetches:
                print(f"  node, --upstream-fetches {f}", flush=True)
                node_rounds(args, driver, mode, origin, res, work, nbytes, f, outage=f == fetches[-1])
            driver.stop()
            del drivers[mode]
    finally:
        for driver in drivers.values():
            driver.stop()
        if origin is not None:
            os.kill(origin.pid, signal.SIGCONT)
            origin.stop()
        log.close()
        link.down()


# --------------------------------------------------------------------------- report


def mib_s(row):
    return row["bytes"] / median(row["times"]) / MiB


def table(res) -> str:
    lines = ["| read | wall (s) | MiB/s | × link | origin DoGets | node CPU (s) | origin CPU (s) "
             "| workers CPU (s) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, r in res.rows.items():
        cpu = lambda k: "" if r.get(k) is None else f"{r[k]:.1f}"  # noqa: E731
        gets = r.get("origin_do_gets")
        gets = "" if gets is None else ", ".join(str(g) for g in gets)
        lines.append(f"| {label} | {median(r['times']):.2f} | {mib_s(r):.0f} | "
                     f"{f'{mib_s(r) / LINK_MIB_S:.3f}' if r.get('link') else ''} | {gets} | "
                     f"{cpu('server_cpu')} | {cpu('origin_cpu')} | {cpu('client_cpu')} |")
    return "\n".join(lines)


def goals(res) -> str:
    rows, out = res.rows, ["| figure | result | goal |", "|---|---|---|"]
    fetches = res.info["fetches"]
    tcp = rows.get("plain TCP, 1 connection")
    for mode in MODES:
        for f in fetches:
            p1 = rows.get(f"pass 1 {mode}, node ({f} upstream fetches)")
            if p1:
                extra = f" (plain TCP {mib_s(tcp) / LINK_MIB_S:.3f}×)" if tcp else ""
                out.append(f"| pass 1, {mode}, `--upstream-fetches {f}` | {mib_s(p1) / LINK_MIB_S:.3f}× the link"
                           f"{extra} | ≥ 0.9× |")
    for f in fetches:
        w = rows.get(f"pass 1 by tessera warm, node ({f} upstream fetches)")
        if w:
            out.append(f"| pass 1 by `tessera warm` (Rust client, 4 at once, no dask), `--upstream-fetches {f}` | "
                       f"{mib_s(w) / LINK_MIB_S:.3f}× the link | (≥ 0.9×) |")
    last = fetches[-1]
    for mode in MODES:
        p1 = rows.get(f"pass 1 {mode}, node ({last} upstream fetches)")
        if p1:
            blocks = rows.get("dask, origin directly (do_get)", {}).get("blocks")
            out.append(f"| origin DoGets, pass 1, {mode} | {', '.join(map(str, p1['origin_do_gets']))} "
                       f"(origin chunks: {blocks}) | each chunk once |")
    for mode in MODES:
        p2 = rows.get(f"pass 2 {mode}, node ({last} upstream fetches)")
        loc = rows.get(f"warm {mode}, local Tessera")
        if p2 and loc:
            out.append(f"| pass 2, {mode}: wall / a local server's warm read | "
                       f"{median(p2['times']):.2f} / {median(loc['times']):.2f} s = "
                       f"{median(p2['times']) / median(loc['times']):.2f}×; origin DoGets "
                       f"{', '.join(map(str, p2['origin_do_gets']))} | ≤ 1.2×, 0 DoGets |")
    for mode in MODES:
        s = rows.get(f"pass 2 {mode}, node, origin stopped")
        p2 = rows.get(f"pass 2 {mode}, node ({last} upstream fetches)")
        o = res.info.get(f"outage_{mode}", {})
        if s and p2:
            out.append(f"| pass 2, {mode}, origin SIGSTOPped | {median(s['times']):.2f} s "
                       f"({median(s['times']) / median(p2['times']):.2f}× pass 2), "
                       f"{len(o.get('node_errors', []))} errors | same time, no errors |")
    return "\n".join(out)


def section(res) -> str:
    i = res.info
    return f"""{SECTION}

(Issue 32, decision 0036; generated by `benches/cluster.py`, which replaces this section on
each run and keeps the hand-written analysis below it.) One run on {i['when']}, {i['machine']};
binary: {i['binary']}
An origin Tessera in a network namespace serving `vol.npy` (u16 {tuple(i['shape'])},
{i['bytes'] / MiB:.0f} MiB, uniformly random values), joined to the node's namespace by a veth
pair whose ends' egress are token buckets (`{i['qdiscs']}`; no delay: this kernel has no
netem). On the node: `tessera serve grpc://ORIGIN` and a dask.distributed LocalCluster of
{WORKERS} worker processes (1 thread each) reading the tensor through the biopb 0.13.0 client
(`get_tensor("vol")`, every block XOR-folded in its worker and checked against the file),
mmap route and do_get route (`BIOPB_CACHEFILE_TRANSFER_DISABLED=1`). Medians of {i['reps']};
pass 1 on a fresh node (empty cache) each time, pass 2 right after on the same node. "× link" is
the rate over 1 Gbit/s ({LINK_MIB_S:.1f} MiB/s); origin DoGets per read (from its `/metrics`);
CPU per read (workers: the 4 dask processes together). Plain TCP: one Python socket connection
through the same link, {i['tcp_bytes'] / MiB:.0f} MiB. "pass 1 by tessera warm": the Rust client
instead of dask (`tessera warm NODE vol`, 4 chunks at once through `chunk_locate`), on a fresh
node, timed as a process (its start and plan included; its CPU in the workers column).

{goals(res)}

{table(res)}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "target" / "debug" / "tessera"))
    ap.add_argument("--shape", default="128,2048,2048", help="z,y,x of the u16 tensor")
    ap.add_argument("--quick", action="store_true", help="16 x 2048 x 2048 (128 MiB), one rep")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fetches", default="2,8",
                    help="--upstream-fetches values of pass 1, the last one also pass 2 and the outage")
    ap.add_argument("--modes", default=",".join(MODES), help="routes measured: mmap, doget")
    ap.add_argument("--node-args", default="", help="more flags of the node's server")
    ap.add_argument("--tcp-bytes", type=int, default=512 * MiB)
    ap.add_argument("--work", default="/tmp/tessera-cluster-bench")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "guides" / "performance.md"))
    ap.add_argument("--report-only", action="store_true", help="rewrite the docs from WORK's results.json")
    ap.add_argument("--driver", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tcp-send", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.driver:
        driver_main(json.loads(args.driver))
        return
    if args.tcp_send:
        tcp_send(json.loads(args.tcp_send))
        return
    work = pathlib.Path(args.work) / ("quick" if args.quick else "full")
    res = fb.Results(work / "results.json")
    if args.report_only:
        res.load()
        report(res, args)
        return
    if args.quick:
        args.reps, args.tcp_bytes = 1, 128 * MiB
    shape = (16, 2048, 2048) if args.quick else tuple(int(x) for x in args.shape.split(","))
    (work / "data").mkdir(parents=True, exist_ok=True)
    path = work / "data" / "vol.npy"
    write_tensor(path, work / "vol.stamp.json", shape)
    nbytes = 2 * shape[0] * shape[1] * shape[2]
    res.info = {"when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "machine": bench.machine(), "binary": fb.binary_note(args.bin), "shape": list(shape),
                "bytes": nbytes, "reps": args.reps, "tcp_bytes": args.tcp_bytes,
                "fetches": [int(f) for f in args.fetches.split(",")]}
    run(args, res, work, path, nbytes)
    res.save()
    report(res, args)


def report(res, args):
    print()
    print(goals(res))
    print()
    print(table(res))
    if not args.no_doc:
        fb.write_performance(pathlib.Path(args.doc), SECTION, ANALYSIS, section(res))


if __name__ == "__main__":
    main()
