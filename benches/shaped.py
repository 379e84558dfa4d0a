#!/usr/bin/env python3
"""Shaped-link rows of issue 33 (wire compression, docs/decisions/0039): whole tensors read
over DoGet by the unmodified biopb 0.13.0 client through a rate-limited link, Tessera
`--wire-compression off` beside `auto` and `zstd`, one run.

The link: benches/shaped_link.py, a network namespace joined to this one by a veth pair,
each end's egress a token bucket (``tbf rate 1gbit``, then ``10gbit``); no delay (this
kernel has no netem). The servers listen on this namespace's end of the pair; the client
runs in the other namespace (``ip netns exec``), so its source address is not loopback and
``auto`` judges it by its measured delivery rate. The ``lo`` "link" is loopback: servers
on 127.0.0.1 and the client in this namespace (``auto`` never compresses for it). The client: ``TensorFlightClient(server, cache_bytes=0)
.get_tensor(id).compute()`` with ``BIOPB_CACHEFILE_TRANSFER_DISABLED=1`` (the do_get
route), every read compared with numpy's bytes (outside the timing).

The tensors (~256 MiB each, written once into ``--work`` and reused):

* ``micro``: microscopy-like u16, (64, 1024, 2048): Gaussian cells on a 100-count
  background under Poisson noise (benches/wire.py's generator);
* ``noise``: uniform u16 of the same shape (zstd cannot shrink it);
* ``micro/@labels/cells``: a u16 label set of ``micro`` (each cell's disc its id, 0
  elsewhere), uploaded through the biopb client (``setup_array_upload``/``upload_array``)
  into each server.

For each link rate, three fresh servers (one per mode, side by side, each with an empty cache
and state directory): per tensor, the cold read (the first read of a fresh server: the
source decoded into the cache and, under ``auto``, every chunk compressed on its first
reply), then ``--reps`` warm reads alternating the servers (median). Per row: wall time,
MiB/s of decoded tensor, the ratio to the link rate (1 Gbit/s = 119.2 MiB/s), the bytes the
server sent (``tessera_do_get_body_bytes_total``), server CPU (``/proc/PID/stat``) and
client CPU (``getrusage`` of the client process) per read. A plain TCP row (one Python
socket connection from this namespace into the client's) gives each link's ceiling.
After the table, per link and tensor, `auto`'s wall and server CPU over `off`'s per round
(the two read back to back in each round; median and range of the ratios): the comparison
least moved by other load on a shared machine. ``--modes off,auto`` runs those two servers
only.
With ``--pyarrow``, warm rows of pyarrow's own ``do_get(...).read_all()`` of the same chunks
(2 threads, nothing assembled) beside biopb's: the link and the server without the client's
handling.

With ``--timeline``, each read on a shaped link is also cut where its bytes were on the wire
(this end's ``tx_bytes``, sampled every ~1 ms, against the client's ``CLOCK_MONOTONIC``
timestamps): the time before the first byte, the bytes' time on the wire (the tensor's MiB/s
over it is what the server and the link delivered) and the client's work after the last
byte (biopb's ``compute()`` assembling the array).

With ``--reference``, biopb's own server (benches/reference/setup.sh) on the same bytes of
micro and noise (uncompressed zarr v2 on Tessera's 8 MiB grid), fresh per link: cold and
warm rows beside Tessera's (no label set: it takes no upload of ours; no bytes counted).

Needs root (netns, tc) and iproute2. The binary is whatever ``--bin`` names (the dev binary
by default: a release binary compresses and decodes faster).

    /work/main/.venv/bin/python benches/shaped.py [--bin target/debug/tessera] [--reps 3]
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import pathlib
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
# benches/zarr.py is beside this file: keep the folder off the import path (dask imports zarr).
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT / "tests" / "support" / "python"))


def _load(name, file):
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MiB = 1 << 20
NS, HOST_IF, NS_IF = "tsrshape", "tsrsh0", "tsrsn0"
HOST_IP, NS_IP = "10.231.11.1", "10.231.11.2"
PORTS = {"off": 5071, "auto": 5072, "zstd": 5076}
METRICS = {"off": 5073, "auto": 5074, "zstd": 5077}
TCP_PORT = 5075
#: What `WireClock.split` adds to a read.
WIRE_KEYS = ("head", "wire", "tail")
MODES = ("off", "auto", "zstd")
LOOPBACK = "lo"
TOKEN = "shaped-bench-token_0123456789abcdef"
LABELS = "micro/@labels/cells"
TENSORS = ("micro", "noise", LABELS)
SHAPE = (64, 1024, 2048)
STAMP = "tessera-shaped-bench-1"
#: Link rate -> (tc rate, tbf burst): a burst must hold at least rate / HZ.
LINKS = {1: ("1gbit", "256kb"), 10: ("10gbit", "4mb")}


# --------------------------------------------------------------------------- the tensors


def write_tensors(work: pathlib.Path) -> None:
    """`src/micro.npy`, `src/noise.npy` (served) and `labels.npy` (uploaded), once."""
    import numpy as np

    stamp = work / "stamp.json"
    want = {"format": STAMP, "shape": list(SHAPE)}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return
    (work / "src").mkdir(parents=True, exist_ok=True)
    print("writing the tensors", flush=True)
    planes, h, w = SHAPE
    rng = np.random.default_rng(39)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    micro = np.lib.format.open_memmap(work / "src" / "micro.npy", mode="w+", dtype="<u2", shape=SHAPE)
    labels = np.lib.format.open_memmap(work / "labels.npy", mode="w+", dtype="<u2", shape=SHAPE)
    for z in range(planes):
        plane = np.full((h, w), 100.0, dtype=np.float32)
        lab = np.zeros((h, w), dtype="<u2")
        cells = zip(rng.uniform(0, h, 60), rng.uniform(0, w, 60), rng.uniform(200, 2000, 60))
        for i, (cy, cx, a) in enumerate(cells, start=1):
            y0, y1, x0, x1 = int(max(cy - 60, 0)), int(min(cy + 60, h)), int(max(cx - 60, 0)), int(min(cx + 60, w))
            d2 = (yy[y0:y1, x0:x1] - cy) ** 2 + (xx[y0:y1, x0:x1] - cx) ** 2
            plane[y0:y1, x0:x1] += a * np.exp(-d2 / 400.0)
            lab[y0:y1, x0:x1][d2 < 400.0] = i
        micro[z] = rng.poisson(plane).clip(0, 65535)
        labels[z] = lab
    micro.flush()
    labels.flush()
    del micro, labels
    noise = np.lib.format.open_memmap(work / "src" / "noise.npy", mode="w+", dtype="<u2", shape=SHAPE)
    for z in range(0, planes, 8):
        noise[z:z + 8] = rng.integers(0, 1 << 16, (8, h, w), dtype=np.uint16)
    noise.flush()
    del noise
    stamp.write_text(json.dumps(want))


def expected_path(work: pathlib.Path, tensor: str) -> pathlib.Path:
    return work / "labels.npy" if tensor == LABELS else work / "src" / f"{tensor}.npy"


# --------------------------------------------------------------------------- the client (in the namespace)


def worker_main() -> None:
    """The client process, in the link's far namespace: one JSON command per stdin line,
    one JSON answer per stdout line."""
    import numpy as np
    from biopb.tensor import TensorFlightClient

    assert os.environ.get("BIOPB_CACHEFILE_TRANSFER_DISABLED") == "1"
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "read":
            client = TensorFlightClient(cmd["location"], token=cmd.get("token", TOKEN), cache_bytes=0)
            tensor = client.get_tensor(cmd["id"])
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            m0, t0 = time.monotonic(), time.perf_counter()
            got = tensor.compute()
            wall = time.perf_counter() - t0
            m1 = time.monotonic()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
            expected = np.load(cmd["expect"], mmap_mode="r")
            same = got.dtype == expected.dtype and got.shape == expected.shape and bool(np.array_equal(got, expected))
            del got
            out = {"wall": wall, "cpu": cpu, "same": same, "t0": m0, "t1": m1}
        elif cmd["op"] == "catalog":
            client = TensorFlightClient(cmd["location"], token=TOKEN, cache_bytes=0)
            rows = client.query("SELECT source_id, source_url FROM sources", format="records")
            out = {"sources": [{"id": r["source_id"], "url": r["source_url"]} for r in rows]}
        elif cmd["op"] == "flight":
            out = flight_read(cmd["location"], cmd["id"], cmd["threads"])
        elif cmd["op"] == "tcp":
            sink = memoryview(bytearray(4 << 20))
            with socket.create_connection((cmd["host"], TCP_PORT)) as s:
                got = s.recv_into(sink)
                t0, c0 = time.perf_counter(), time.process_time()
                while got < cmd["bytes"]:
                    n = s.recv_into(sink)
                    if n == 0:
                        break
                    got += n
                out = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "bytes": got}
        else:
            out = {"error": f"unknown op {cmd['op']}"}
        print(json.dumps(out), flush=True)


def flight_read(location, array_id, threads) -> dict:
    """The tensor's chunks read with pyarrow's own `do_get(...).read_all()`, `threads` at a
    time, nothing assembled: what the link and the server give without biopb's handling."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.flight as flight
    from biopb.tensor import descriptor_pb2

    client = flight.connect(location)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    read = descriptor_pb2.TensorReadOption(array_id=array_id)
    read.fields.paths.append("endpoints")
    request = descriptor_pb2.FlightRequest(tensor_read=read)
    info = client.get_flight_info(flight.FlightDescriptor.for_command(request.SerializeToString()), options)
    tickets = [ep.ticket for ep in info.endpoints]
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    m0, t0 = time.monotonic(), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        got = sum(pool.map(lambda t: client.do_get(t, options).read_all().nbytes, tickets))
    wall = time.perf_counter() - t0
    m1 = time.monotonic()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    client.close()
    return {"wall": wall, "cpu": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
            "bytes": got, "same": True, "t0": m0, "t1": m1}


class Worker:
    """The client process in the namespace."""

    def __init__(self, link, threads=None):
        """In `link`'s namespace; in this one when `link` is None."""
        env = {**os.environ, "BIOPB_CACHEFILE_TRANSFER_DISABLED": "1"}
        if threads:
            env["DASK_NUM_WORKERS"] = str(threads)  # dask's threaded scheduler's pool
        argv = [sys.executable, __file__, "--worker"]
        self.proc = subprocess.Popen(
            link.in_namespace(argv) if link else argv,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the client process ended")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)


# --------------------------------------------------------------------------- the servers (here)


def server_cpu(pid) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def body_bytes(server) -> int:
    request = urllib.request.Request(
        f"http://{server.metrics}/metrics", headers={"authorization": f"Bearer {TOKEN}"})
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    return sum(int(float(line.split()[-1])) for line in text.splitlines()
               if line.startswith("tessera_do_get_body_bytes_total{"))


def start_servers(binary, work: pathlib.Path, tag: str, host: str) -> dict:
    """One fresh server per mode, on `host` (this namespace's end of the pair, or
    loopback), each with the label set uploaded (from this namespace, unshaped)."""
    import numpy as np
    from biopb.tensor import TensorFlightClient
    from tessera_launcher import TesseraProcess

    servers = {}
    for mode in MODES:
        server = TesseraProcess(
            binary,
            [work / "src", "--cache-dir", work / f"{tag}-{mode}-cache", "--writable",
             "--wire-compression", mode, "--metrics-listen", f"127.0.0.1:{METRICS[mode]}",
             "--http-listen", "off"],
            env={"TESSERA_STATE_DIR": str(work / f"{tag}-{mode}-state"), "TESSERA_TOKEN": TOKEN},
            listen=f"{host}:{PORTS[mode]}",
        )
        server.metrics = f"127.0.0.1:{METRICS[mode]}"
        servers[mode] = server
    labels = np.load(work / "labels.npy")
    for mode, server in servers.items():
        client = TensorFlightClient(server.location, token=TOKEN, cache_bytes=0)
        desc = client.setup_array_upload(f"zarr://{LABELS}", labels, chunk_shape=(8, 512, 1024))
        state = client.upload_array(desc, labels)["state"]
        if state != "READY":
            raise RuntimeError(f"label upload into the {mode} server: {state}")
    time.sleep(1.5)  # the settle window of files written just now
    return servers


class WireClock:
    """Samples the bytes a network device has sent (``tx_bytes``), about every millisecond,
    while a read runs: when the first and the last of its bytes left this end of the link.
    ``CLOCK_MONOTONIC`` is one clock for every namespace, so the client's timestamps
    compare with these."""

    def __init__(self, dev):
        self.path = f"/sys/class/net/{dev}/statistics/tx_bytes"
        self.samples = []
        self.done = threading.Event()

    def _run(self):
        with open(self.path) as f:
            while not self.done.is_set():
                f.seek(0)
                self.samples.append((time.monotonic(), int(f.read())))
                time.sleep(0.001)

    def __enter__(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        time.sleep(0.02)
        self.done.set()
        self.thread.join()

    def split(self, t0, t1) -> dict:
        """The read's wall [t0, t1] cut at the first and the last byte on the wire: `head`
        (the request until 64 KiB left), `wire` (until the last packet left) and `tail`
        (the client's work after that)."""
        base, end = self.samples[0][1], self.samples[-1][1]
        first = next(t for t, b in self.samples if b - base > 64 * 1024)
        last = next(t for t, b in self.samples if b >= end - 4096)
        return {"head": first - t0, "wire": last - first, "tail": t1 - last}


def measured_read(worker, server, work, tensor, pyarrow_threads=0, wire_dev=None) -> dict:
    """One whole read by biopb's client (or, with `pyarrow_threads`, pyarrow's do_get of
    its chunks), with the server's CPU and bytes sent; with `wire_dev` (this end of the
    link) also the read's time on the wire (`WireClock`)."""
    cpu0, sent0 = server_cpu(server.pid), body_bytes(server)
    clock = WireClock(wire_dev) if wire_dev else contextlib.nullcontext()
    with clock:
        if pyarrow_threads:
            out = worker.ask(op="flight", location=server.location, id=tensor, threads=pyarrow_threads)
        else:
            out = worker.ask(op="read", location=server.location, id=tensor,
                             expect=str(expected_path(work, tensor)))
    if wire_dev:
        out.update(clock.split(out["t0"], out["t1"]))
    out["server_cpu"] = server_cpu(server.pid) - cpu0
    out["sent"] = body_bytes(server) - sent0
    if not out["same"]:
        raise RuntimeError(f"{tensor}: the read differs from numpy")
    return out


def reference_rows(args, worker, work, gbit) -> list:
    """biopb's own server (benches/reference) on the same bytes of micro and noise (zarr v2,
    uncompressed, Tessera's 8 MiB grid), fresh for this link: its first read of each is the
    cold one, then `--reps` warm reads. It compresses label replies only, and has no
    `.npy` reader nor our label upload, so labels are not measured on it."""
    sys.path.insert(0, str(HERE / "reference"))
    import biopb_reference as ref

    binary = ref.ensure_installed()
    data = work / "reference-zarr"
    data.mkdir(exist_ok=True)
    names = [t for t in args.tensors if t != LABELS]
    for name in names:
        ref.write_zarr_v2(work / "src" / f"{name}.npy", data / f"{name}.zarr", 8 * MiB, work / "reference-state")
    scratch, cache = work / f"g{gbit}-ref-scratch", work / f"g{gbit}-ref-cache"
    server = ref.ReferenceServer(binary, data, scratch, cache, min_sources=len(names), host=HOST_IP,
                                 token=TOKEN)
    rows = []
    try:
        ids = {}
        for src in worker.ask(op="catalog", location=server.location)["sources"]:
            for name in names:
                if (src["url"] or "").rstrip("/").endswith(f"/{name}.zarr"):
                    ids[name] = src["id"]
        for name in names:
            def once():
                cpu0 = server_cpu(server.proc.pid)
                out = worker.ask(op="read", location=server.location, id=ids[name],
                                 expect=str(expected_path(work, name)))
                out["server_cpu"] = server_cpu(server.proc.pid) - cpu0
                out["sent"] = float("nan")
                if not out["same"]:
                    raise RuntimeError(f"{name} from biopb's server differs from numpy")
                return out
            cold = once()
            warm = [once() for _ in range(args.reps)]
            med = {k: statistics.median(r[k] for r in warm) for k in ("wall", "cpu", "server_cpu")}
            med["sent"] = float("nan")
            rows.append({"link": gbit, "tensor": name, "mode": "biopb server", "cold": cold, "warm": med})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        server.stop()
    return rows


def tcp_ceiling(worker, nbytes, reps, host) -> dict:
    block = memoryview(os.urandom(4 << 20))
    walls, cpus = [], []
    with socket.create_server((host, TCP_PORT)) as lsock:
        for _ in range(reps):
            answer = {}
            t = threading.Thread(target=lambda: answer.update(worker.ask(op="tcp", bytes=nbytes, host=host)))
            t.start()
            conn, _ = lsock.accept()
            left = nbytes
            while left > 0:
                n = min(left, len(block))
                conn.sendall(block[:n])
                left -= n
            conn.close()
            t.join()
            if answer.get("bytes") != nbytes:
                raise RuntimeError(f"TCP through the link: {answer}")
            walls.append(answer["wall"])
            cpus.append(answer["cpu"])
    return {"wall": statistics.median(walls), "cpu": statistics.median(cpus)}


def run(args) -> list:
    shaped_link = _load("tessera_shaped_link", "shaped_link.py")
    work = pathlib.Path(args.work)
    write_tensors(work)
    nbytes = 2 * SHAPE[0] * SHAPE[1] * SHAPE[2]
    rows = []
    link = shaped_link.ShapedLink(NS, HOST_IF, NS_IF, HOST_IP, NS_IP)
    try:
        shaped_worker = Worker(link, args.client_threads)
        local_worker = Worker(None, args.client_threads) if LOOPBACK in args.links else None
        try:
            for gbit in args.links:
                if gbit == LOOPBACK:
                    worker, host = local_worker, "127.0.0.1"
                    print("link: loopback", flush=True)
                else:
                    worker, host = shaped_worker, HOST_IP
                    rate, burst = LINKS[gbit]
                    link.shape(rate, burst=burst, latency=args.tbf_latency)
                    print(f"link {rate}: {link.qdiscs()}", flush=True)
                tcp = tcp_ceiling(worker, nbytes, args.reps, host)
                rows.append({"link": gbit, "tensor": "plain TCP", "mode": "-", "cold": None,
                             "warm": {"wall": tcp["wall"], "cpu": tcp["cpu"], "server_cpu": 0.0, "sent": nbytes}})
                servers = start_servers(args.bin, work, f"g{gbit}", host)
                dev = HOST_IF if args.timeline and gbit != LOOPBACK else None
                keys = ("wall", "cpu", "server_cpu", "sent", *(WIRE_KEYS if dev else ()))
                try:
                    for tensor in args.tensors:
                        cold = {mode: measured_read(worker, servers[mode], work, tensor, wire_dev=dev)
                                for mode in MODES}
                        warm = {mode: [] for mode in MODES}
                        for _ in range(args.reps):
                            for mode in MODES:
                                warm[mode].append(measured_read(worker, servers[mode], work, tensor, wire_dev=dev))
                        for mode in MODES:
                            med = {k: statistics.median(r[k] for r in warm[mode])
                                   for k in keys}
                            rows.append({"link": gbit, "tensor": tensor, "mode": mode,
                                         "cold": cold[mode], "warm": med,
                                         "rounds": [r["wall"] for r in warm[mode]],
                                         "server_cpu_rounds": [r["server_cpu"] for r in warm[mode]],
                                         **({"tail_rounds": [r["tail"] for r in warm[mode]]} if dev else {})})
                            print(json.dumps(rows[-1]), flush=True)
                        if args.pyarrow:
                            warm = {mode: [] for mode in MODES}
                            for _ in range(args.reps):
                                for mode in MODES:
                                    warm[mode].append(measured_read(worker, servers[mode], work, tensor, 2, dev))
                            for mode in MODES:
                                med = {k: statistics.median(r[k] for r in warm[mode])
                                       for k in keys}
                                rows.append({"link": gbit, "tensor": f"{tensor} (pyarrow do_get, 2 threads)",
                                             "mode": mode, "cold": None, "warm": med,
                                             "rounds": [r["wall"] for r in warm[mode]],
                                             "server_cpu_rounds": [r["server_cpu"] for r in warm[mode]]})
                finally:
                    for server in servers.values():
                        server.stop()
                if args.reference and gbit != LOOPBACK:
                    rows.extend(reference_rows(args, worker, work, gbit))
        finally:
            shaped_worker.close()
            if local_worker:
                local_worker.close()
    finally:
        link.down()
    return rows


def table(rows, nbytes) -> str:
    link_mib = 1e9 / 8 / MiB
    out = ["| link | tensor | Tessera | warm MiB/s (× link) | warm wall | sent / read | server CPU | client CPU "
           "| cold MiB/s (× link) | cold wall | cold server CPU | cold client CPU |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    def times(rate, lm):
        return f"{rate:.0f}" if lm is None else f"{rate:.0f} ({rate / lm:.2f}×)"

    for r in rows:
        lm = None if r["link"] == LOOPBACK else link_mib * r["link"]
        name = "loopback" if lm is None else f"{r['link']} Gbit/s"
        w, c = r["warm"], r["cold"]
        rate = nbytes / MiB / w["wall"]
        sent = "-" if w["sent"] != w["sent"] else f"{w['sent'] / MiB:.1f} MiB"  # NaN: not counted
        line = (f"| {name} | {r['tensor']} | {r['mode']} | {times(rate, lm)} "
                f"| {w['wall']:.2f} s | {sent} | {w['server_cpu']:.2f} s | {w['cpu']:.2f} s ")
        if c:
            crate = nbytes / MiB / c["wall"]
            line += (f"| {times(crate, lm)} | {c['wall']:.2f} s | {c['server_cpu']:.2f} s "
                     f"| {c['cpu']:.2f} s |")
        else:
            line += "| | | | |"
        out.append(line)
    return "\n".join(out)


def main():
    global MODES
    if "--worker" in sys.argv:
        worker_main()
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "target" / "debug" / "tessera"))
    ap.add_argument("--work", default="/tmp/tessera-shaped-bench", help="tensors and caches (kept between runs)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--links", default="1,10,lo", help="link rates in Gbit/s, of 1 and 10, and lo (loopback)")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--tensors", default=",".join(TENSORS), help="of micro, noise, " + LABELS)
    ap.add_argument("--client-threads", type=int, help="dask's thread pool in the client "
                    "(concurrent do_gets; dask's default is the number of cores)")
    ap.add_argument("--pyarrow", action="store_true", help="also warm rows of pyarrow's own "
                    "do_get of the same chunks, 2 threads, nothing assembled (the client's share)")
    ap.add_argument("--reference", action="store_true", help="also biopb's own server "
                    "(benches/reference/setup.sh installs it) on the same bytes of micro and noise")
    ap.add_argument("--timeline", action="store_true", help="also time each read's bytes on "
                    "the wire (this end's tx_bytes, sampled every ~1 ms): the request before the "
                    "first byte, the bytes' time on the wire, the client's work after the last")
    ap.add_argument("--tbf-latency", default="100ms", help="the token bucket's queue, as time")
    ap.add_argument("--modes", default=",".join(MODES), help="the servers' --wire-compression "
                    "modes, of off, auto, zstd (one server each, alternating in every round)")
    args = ap.parse_args()
    MODES = tuple(args.modes.split(","))
    args.tensors = args.tensors.split(",")
    args.links = [x if x == LOOPBACK else int(x) for x in args.links.split(",")]
    work = pathlib.Path(args.work)
    for old in work.glob("g*-*-c*"):
        subprocess.run(["rm", "-rf", str(old)], check=True)
    for old in [*work.glob("g*-*-state"), *work.glob("g*-ref-scratch")]:
        subprocess.run(["rm", "-rf", str(old)], check=True)
    rows = run(args)
    nbytes = 2 * SHAPE[0] * SHAPE[1] * SHAPE[2]
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"\n{nbytes / MiB:.0f} MiB per tensor; warm = median of {args.reps}; binary {args.bin}")
    print(table(rows, nbytes))
    print(paired(rows))
    if args.timeline:
        print(timeline(rows, nbytes))


def timeline(rows, nbytes) -> str:
    """Per warm row on a shaped link, medians of the read's wall cut at its first and last
    byte on the wire: the tensor's MiB/s over its time on the wire is what the server and the
    link gave, the tail what the client did after the last byte."""
    link_mib = 1e9 / 8 / MiB
    out = ["\n| link | tensor | Tessera | warm wall | before the first byte | on the wire "
           "| MiB/s on the wire (× link) | after the last byte |",
           "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        w = r["warm"]
        if "wire" not in w:
            continue
        lm = link_mib * r["link"]
        rate = nbytes / MiB / w["wire"]
        out.append(f"| {r['link']} Gbit/s | {r['tensor']} | {r['mode']} | {w['wall']:.2f} s "
                   f"| {w['head'] * 1000:.0f} ms | {w['wire']:.2f} s | {rate:.0f} ({rate / lm:.2f}×) "
                   f"| {w['tail'] * 1000:.0f} ms |")
    return "\n".join(out)


def paired(rows) -> str:
    """Per round, `auto`'s wall over `off`'s (the two servers read back to back in each
    round): the median and range of those ratios, per link and tensor."""
    out = ["\n| link | tensor | auto/off wall per round: median (range) | auto/off server CPU per round: median |",
           "|---|---|---:|---:|"]
    by = {(r["link"], r["tensor"], r["mode"]): r for r in rows if "rounds" in r}
    for (link, tensor, mode), row in by.items():
        off = by.get((link, tensor, "off"))
        if mode != "auto" or off is None:
            continue
        walls = [a / o for a, o in zip(row["rounds"], off["rounds"])]
        cpus = [a / o for a, o in zip(row["server_cpu_rounds"], off["server_cpu_rounds"]) if o > 0]
        cpu = f"{statistics.median(cpus):.2f}" if cpus else "-"
        out.append(f"| {link} | {tensor} | {statistics.median(walls):.2f} ({min(walls):.2f}–{max(walls):.2f}) | {cpu} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
