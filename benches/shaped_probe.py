#!/usr/bin/env python3
"""Where the time of one warm whole-tensor read through a shaped link goes (issue 33; the
profile behind performance.md's "The 2026-12-06 04:05 run"). A probe, not a benchmark of
record: its figures are per read, nothing is compared with numpy.

This namespace: the shaped link (benches/shaped_link.py, names of its own), one fresh Tessera
server per ``--modes`` entry, and during each read a sampler of this end's ``tx_bytes``
(every ~1 ms) and of ``ss -tin`` towards the client (every ``--ss`` seconds). The other
namespace: the unmodified biopb 0.13.0 client (``get_tensor(id).compute()``,
``BIOPB_CACHEFILE_TRANSFER_DISABLED=1``) with two of its functions wrapped in timers, its
chunk fetch (``_pool._fetch_chunk_distributed``) and dask's ``concatenate3`` (the array's
assembly after the last chunk); with ``--pyarrow N`` also pyarrow's own ``do_get`` of the
same chunks, N threads. Per read, one JSON line: wall, the time before the first byte, on
the wire and after the last byte, the chunk fetches, the assembly, client CPU. First, the
client copies 32 blocks of 8 MiB into a fresh 256 MiB array and again into the same one
(what first touch costs there).

    /work/main/.venv/bin/python benches/shaped_probe.py --modes off --reps 3 --pyarrow 2
"""
from __future__ import annotations

import argparse
import ipaddress
import importlib.util
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import threading
import time

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
NS, HOST_IF, NS_IF = "tsrnoise", "tsrnl0", "tsrnn0"
HOST_IP, NS_IP = "10.231.13.1", "10.231.13.2"
TOKEN = "shaped-bench-token_0123456789abcdef"


def worker_main():
    import numpy as np
    import pyarrow.flight as flight
    from biopb.tensor import TensorFlightClient, _pool, descriptor_pb2

    orig = _pool._fetch_chunk_distributed
    log = []

    def timed(*a, **k):
        t0 = time.monotonic()
        out = orig(*a, **k)
        log.append((t0, time.monotonic(), threading.get_ident()))
        return out

    _pool._fetch_chunk_distributed = timed
    import dask.array.core as dac
    orig_c3 = dac.concatenate3
    c3 = []

    def timed_c3(arrays):
        a = time.monotonic()
        out = orig_c3(arrays)
        c3.append((a, time.monotonic()))
        return out

    dac.concatenate3 = timed_c3
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "read":
            log.clear()
            c3.clear()
            client = TensorFlightClient(cmd["location"], token=TOKEN, cache_bytes=0)
            tensor = client.get_tensor(cmd["id"])
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.monotonic()
            got = tensor.compute()
            t1 = time.monotonic()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            out = {"t0": t0, "t1": t1, "chunks": list(log),
                   "cpu": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                   "shape": list(got.shape), "c3": list(c3)}
            del got
        elif cmd["op"] == "flight":
            from concurrent.futures import ThreadPoolExecutor
            c = flight.connect(cmd["location"])
            opts = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
            read = descriptor_pb2.TensorReadOption(array_id=cmd["id"])
            read.fields.paths.append("endpoints")
            req = descriptor_pb2.FlightRequest(tensor_read=read)
            info = c.get_flight_info(flight.FlightDescriptor.for_command(req.SerializeToString()), opts)
            tickets = [ep.ticket for ep in info.endpoints]
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.monotonic()
            def one(t):
                a = time.monotonic()
                n = c.do_get(t, opts).read_all().nbytes
                log.append((a, time.monotonic(), threading.get_ident()))
                return n
            log.clear()
            with ThreadPoolExecutor(cmd["threads"]) as pool:
                got = sum(pool.map(one, tickets))
            t1 = time.monotonic()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            c.close()
            out = {"t0": t0, "t1": t1, "chunks": list(log),
                   "cpu": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), "bytes": got}
        elif cmd["op"] == "concat":
            blocks = [np.full((8, 1024, 512), i, dtype="<u2") for i in range(32)]
            t0 = time.monotonic()
            out_arr = np.empty((64, 1024, 2048), dtype="<u2")
            for i, b in enumerate(blocks):
                z, x = divmod(i, 4)
                out_arr[z * 8:(z + 1) * 8, :, x * 512:(x + 1) * 512] = b
            t1 = time.monotonic()
            for i, b in enumerate(blocks):
                z, x = divmod(i, 4)
                out_arr[z * 8:(z + 1) * 8, :, x * 512:(x + 1) * 512] = b
            out = {"concat_first_touch": t1 - t0, "concat_again": time.monotonic() - t1}
        else:
            out = {"error": cmd["op"]}
        print(json.dumps(out), flush=True)


class Sampler:
    """During one read: this end's ``tx_bytes`` every ~1 ms, ``ss -tin`` towards the peer
    every `ss_every` seconds (0: never)."""

    def __init__(self, dev, peer_ip, ss_every=0.025):
        self.dev, self.peer_ip, self.ss_every = dev, peer_ip, ss_every
        self.tx, self.ss = [], []
        self.stop = threading.Event()

    def run(self):
        path = f"/sys/class/net/{self.dev}/statistics/tx_bytes"
        next_ss = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            with open(path) as f:
                self.tx.append((now, int(f.read())))
            if self.ss_every and now >= next_ss:
                out = subprocess.run(["ss", "-tinH", "dst", self.peer_ip], capture_output=True, text=True).stdout
                self.ss.append((now, out))
                next_ss = now + self.ss_every
            time.sleep(0.001)

    def __enter__(self):
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join()


def analyse(read, tx, link_mib=119.2, nbytes=256 * MiB):
    """One read's wall cut at its first and last byte on the wire, its chunk fetches (the
    time fewer than 2 were in flight) and the client's assembly (`concat3`)."""
    t0, t1 = read["t0"], read["t1"]
    pts = [(t, b) for t, b in tx if t0 - 0.05 <= t <= t1 + 0.05]
    base = pts[0][1]
    total = pts[-1][1] - base
    first = next(t for t, b in pts if b - base > 64 * 1024)
    last = next(t for t, b in pts if b >= pts[-1][1] - 4096)
    ch = read["chunks"]
    ends = sorted(c[1] for c in ch)
    starts = sorted(c[0] for c in ch)
    durs = [c[1] - c[0] for c in ch]
    # time with fewer than 2 fetches in flight, between first start and last end
    ev = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends])
    n, prev, under = 0, ev[0][0], 0.0
    for tt, d in ev:
        if n < 2:
            under += tt - prev
        n += d
        prev = tt
    return {
        "wall": t1 - t0, "x_link": nbytes / MiB / (t1 - t0) / link_mib,
        "wire_MiB": total / MiB,
        "head": first - t0, "wire_span": last - first, "tail_after_wire": t1 - last,
        "tail_after_last_chunk": t1 - ends[-1], "first_fetch_start": starts[0] - t0,
        "wire_rate_in_span": total / MiB / (last - first),
        "chunk_dur_median": statistics.median(durs),
        "under2_inflight_s": under,
        "threads": len({c[2] for c in ch}), "client_cpu": read["cpu"],
        "concat3": sum(b - a for a, b in read.get("c3", [])),
        "concat3_start_after_last_chunk": (read["c3"][0][0] - ends[-1]) if read.get("c3") else -1,
    }


def main():
    if "--worker" in sys.argv:
        worker_main()
        return
    shaped_link = _load("tessera_shaped_link", "shaped_link.py")
    shaped = _load("tessera_shaped", "shaped.py")
    from tessera_launcher import TesseraProcess

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "target" / "debug" / "tessera"))
    ap.add_argument("--work", default="/tmp/tessera-shaped-bench", help="shaped.py's tensors "
                    "(written there when missing) and this probe's caches")
    ap.add_argument("--reps", type=int, default=3, help="warm reads per server (after one cold)")
    ap.add_argument("--modes", default="off", help="one server per --wire-compression mode listed")
    ap.add_argument("--tensor", default="noise", help="micro or noise")
    ap.add_argument("--rate", default="1gbit", help="the token bucket's rate")
    ap.add_argument("--latency", default="100ms", help="the token bucket's queue, as time")
    ap.add_argument("--threads", type=int, help="dask's threads in the client (DASK_NUM_WORKERS)")
    ap.add_argument("--pyarrow", type=int, default=0, help="also pyarrow's do_get, this many threads")
    ap.add_argument("--ss", type=float, default=0.025, help="seconds between ss samples (0: none)")
    ap.add_argument("--dump", help="write every sample here (JSON)")
    ap.add_argument("--congctl", help="congestion control on the route to the client (cubic, bbr)")
    ap.add_argument("--pauses", default="0.05", help="seconds before each round, cycled")
    ap.add_argument("--extra", default="", help="more `tessera serve` arguments")
    args = ap.parse_args()
    work = pathlib.Path(args.work)
    shaped.write_tensors(work)
    link = shaped_link.ShapedLink(NS, HOST_IF, NS_IF, HOST_IP, NS_IP)
    servers = {}
    try:
        link.shape(args.rate, burst="256kb", latency=args.latency)
        print(link.qdiscs(), flush=True)
        if args.congctl:
            net = str(ipaddress.ip_interface(f"{HOST_IP}/30").network)
            subprocess.run(["ip", "route", "replace", net, "dev", HOST_IF, "proto", "kernel",
                            "scope", "link", "src", HOST_IP, "congctl", args.congctl], check=True)
            print(subprocess.run(["ip", "route", "show", "dev", HOST_IF], capture_output=True, text=True).stdout)
        for i, mode in enumerate(args.modes.split(",")):
            tag = f"probe-{mode}-{i}"
            subprocess.run(["rm", "-rf", str(work / f"{tag}-cache"), str(work / f"{tag}-state")])
            servers[f"{mode}{i}"] = TesseraProcess(
                args.bin,
                [work / "src", "--cache-dir", work / f"{tag}-cache", "--wire-compression", mode,
                 "--http-listen", "off", "--metrics-listen", f"127.0.0.1:{5191 + i}", *args.extra.split()],
                env={"TESSERA_STATE_DIR": str(work / f"{tag}-state"), "TESSERA_TOKEN": TOKEN},
                listen=f"{HOST_IP}:{5181 + i}")
        env = {**os.environ, "BIOPB_CACHEFILE_TRANSFER_DISABLED": "1"}
        if args.threads:
            env["DASK_NUM_WORKERS"] = str(args.threads)
        w = subprocess.Popen(link.in_namespace([sys.executable, __file__, "--worker"]),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

        def ask(**cmd):
            w.stdin.write(json.dumps(cmd) + "\n")
            w.stdin.flush()
            return json.loads(w.stdout.readline())

        print("client concat 256 MiB:", ask(op="concat"), flush=True)
        dumps = []
        for name, s in servers.items():
            ask(op="read", location=s.location, id=args.tensor)  # cold
        pauses = [float(x) for x in args.pauses.split(",")]
        for rep in range(args.reps):
            for name, s in servers.items():
                pause = pauses[rep % len(pauses)]
                time.sleep(pause)
                for kind in (["biopb"] + (["pyarrow"] if args.pyarrow else [])):
                    with Sampler(HOST_IF, NS_IP, args.ss) as smp:
                        if kind == "biopb":
                            r = ask(op="read", location=s.location, id=args.tensor)
                        else:
                            r = ask(op="flight", location=s.location, id=args.tensor, threads=args.pyarrow)
                        time.sleep(0.05)
                    a = analyse(r, smp.tx)
                    print(name, kind, rep, "pause", pause, json.dumps({k: round(v, 3) for k, v in a.items()}), flush=True)
                    dumps.append({"name": name, "kind": kind, "rep": rep, "read": r, "tx": smp.tx, "ss": smp.ss})
        w.stdin.close()
        w.wait(30)
        if args.dump:
            pathlib.Path(args.dump).write_text(json.dumps(dumps))
    finally:
        for s in servers.values():
            s.stop()
        link.down()


if __name__ == "__main__":
    main()
