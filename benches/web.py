#!/usr/bin/env python3
"""HTTP tile latency and throughput (issue 34): 1, 50 and 200 concurrent viewers, cold and
warm, on loopback, for `tessera serve` and, with `--reference`, biopb's own server with its
HTTP sidecar (`biopb-tensor-server launch`: the Flight server and the FastAPI sidecar) on
the same bytes, measured in the same run.

The tensor is a 4 x 4096 x 4096 uint16 pattern written once as an uncompressed zarr v2
array with (1, 2048, 2048) chunks, which both servers read (biopb's has no `.npy` reader);
both cut it into 512 x 512 tiles and a 4-level pyramid (340 tiles). Each viewer is one
keep-alive HTTP/1.1 connection asking for one tile at a time, as a viewer's tile queue
does. Both servers are addressed through their own `/api/tile_info` (the versioned
`array_id`, the levels and the selection parameters it publishes). For every viewer count
each server is started fresh (empty caches) and measured in three phases:

* **cold**: every tile once, the viewers sharing them out (viewer v takes tiles
  v, v + V, ...); the first read of each chunk is in it. The bytes are in the OS page cache
  (the zarr files were just written), so cold means the servers' caches, not the disk.
* **warm, flat out**: for `--seconds`, every viewer asks for its next tile as soon as the
  last one arrived (each walks its own shuffled order of all 340). This is the throughput
  (capacity) figure; latency here is queueing: viewers / throughput.
* **warm, paced**: every viewer asks for one tile every `--pace-ms` (a panning user), at
  offsets spread over the period. This is the latency figure of a server that keeps up;
  `tiles/s` shows whether it did (offered: viewers x 1000 / pace).

Latency is from the request written to the last byte read, per tile. Server CPU is the
process's user + system time over the phase (`/proc/PID/stat`; biopb's `launch` is one
process, Flight server and sidecar threads); client CPU is this script's own (one asyncio
thread, bodies counted, not copied), both per tile.

Usage (from the repository root)::

    .venv/bin/python benches/web.py [--bin target/release/tessera]
        [--reference | --reference-bin PATH/biopb-tensor-server] [--viewers 1,50,200]
        [--seconds 5] [--pace-ms 250] [--https] [--json out.json]

`--https` adds Tessera started with `--tls-cert` (the API over HTTPS, a self-signed leaf the
client trusts) beside the plain-HTTP rows, with the ratios of the two.
`--reference` installs biopb-tensor-server 0.13.0 with benches/reference/setup.sh on first
use; `--reference-bin` uses one installed elsewhere (its venv needs the `[web]` extra:
fastapi, uvicorn).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import random
import re
import shutil
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support" / "python"))
sys.path.insert(0, str(ROOT / "benches" / "reference"))
from tessera_launcher import TesseraProcess  # noqa: E402

HTTP_LINE = re.compile(r"viewer and HTTP API on (https?://[0-9.]+:[0-9]+)/")
CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *([0-9]+)")
CLK_TCK = os.sysconf("SC_CLK_TCK")
SHAPE, CHUNK = (4, 4096, 4096), 2048


# --------------------------------------------------------------------------- data


def write_pattern(store: pathlib.Path) -> None:
    """The tensor as an uncompressed zarr v2 array: `(y * 7 + x * 3 + z * 1000) % 65536`."""
    store.mkdir(parents=True)
    (store / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": list(SHAPE), "chunks": [1, CHUNK, CHUNK], "dtype": "<u2",
        "compressor": None, "filters": None, "fill_value": 0, "order": "C",
        "dimension_separator": "."}))
    (store / ".zattrs").write_text(json.dumps({"_ARRAY_DIMENSIONS": ["z", "y", "x"]}))
    y, x = np.ogrid[:SHAPE[1], :SHAPE[2]]
    for z in range(SHAPE[0]):
        plane = ((y * 7 + x * 3 + z * 1000) % 65536).astype("<u2")
        for iy in range(SHAPE[1] // CHUNK):
            for ix in range(SHAPE[2] // CHUNK):
                block = plane[iy * CHUNK:(iy + 1) * CHUNK, ix * CHUNK:(ix + 1) * CHUNK]
                (store / f"{z}.{iy}.{ix}").write_bytes(np.ascontiguousarray(block).tobytes())


def expected_tile(z, level, col, row, edge=512):
    """The tile the pattern gives by nearest decimation at scale 2**level."""
    s = 2 ** level
    y0, x0 = row * edge * s, col * edge * s
    y = np.arange(y0, min(y0 + edge * s, SHAPE[1]), s)[:, None]
    x = np.arange(x0, min(x0 + edge * s, SHAPE[2]), s)[None, :]
    return ((y * 7 + x * 3 + z * 1000) % 65536).astype("<u2")


# --------------------------------------------------------------------------- servers


def cpu_seconds(pid: int) -> float:
    """User + system time of process `pid` (all its threads)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def get_json(url: str, context=None):
    with urllib.request.urlopen(url, timeout=30, context=context) as r:
        return json.load(r)


def find_array_id(base: str, stem: str, context=None) -> str:
    """The array id of the source named `stem…` in the server's `/api/tree`."""
    keys = [""]
    for _ in range(50):
        if not keys:
            break
        key = keys.pop(0)
        level = get_json(f"{base}/api/tree?key={urllib.parse.quote(key)}", context)
        for source in level.get("sources", []):
            if source["name"].startswith(stem):
                tensors = source["descriptor"].get("tensors") or []
                return tensors[0]["array_id"] if tensors else source["descriptor"]["source_id"]
        keys += [f["key"] for f in level.get("folders", [])]
    raise RuntimeError(f"{base}/api/tree lists no source named {stem}*")


class Tessera:
    name = "Tessera"
    ssl = None

    def __init__(self, binary, data, scratch, extra=()):
        self.proc = TesseraProcess(binary, [data, "--cache-dir", scratch / "cache",
                                            "--http-listen", "127.0.0.1:0", *extra],
                                   env={"TESSERA_STATE_DIR": str(scratch / "state")})
        self.pid = self.proc.pid
        self.base = next(m.group(1) for line in self.proc.log if (m := HTTP_LINE.search(line)))

    def stop(self):
        self.proc.stop()


class TesseraHttps(Tessera):
    """The same server with `--tls-cert`: the HTTP API over HTTPS (a self-signed P-256 leaf
    made with openssl; the client trusts it), so the rows beside plain HTTP show what the
    encryption costs per tile."""

    name = "Tessera (HTTPS)"

    def __init__(self, binary, data, scratch):
        import ssl
        import subprocess

        cert, key = scratch / "cert.pem", scratch / "key.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
             "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
             "-addext", "basicConstraints=critical,CA:FALSE"],
            check=True, capture_output=True)
        key.chmod(0o600)
        self.ssl = ssl.create_default_context(cafile=str(cert))
        super().__init__(binary, data, scratch, extra=("--tls-cert", cert, "--tls-key", key))


class Biopb:
    name = "biopb 0.13.0 (launch: Flight + sidecar)"
    ssl = None

    def __init__(self, binary, data, scratch):
        import biopb_reference

        self.proc = biopb_reference.ReferenceServer(binary, data, scratch / "state", scratch / "cache",
                                                    min_sources=1, web=True)
        self.pid = self.proc.pid
        self.base = self.proc.http_base

    def stop(self):
        self.proc.stop()


def tile_paths(info: dict) -> list[tuple[str, tuple]]:
    """Every tile of every plane and level, with the query each server's tile_info asks for
    the plane axis (`z=` when it names one, else `sel=AXIS:INDEX`)."""
    z_axis = info["selectable"].get("z")
    if z_axis is None:
        (sel,) = info["sel_axes"]
        z_param = lambda z: f"sel={sel['axis']}:{z}"  # noqa: E731
    else:
        z_param = lambda z: f"z={z}"  # noqa: E731
    array_id = urllib.parse.quote(info["array_id"], safe="@/")
    out = []
    for z in range(info["shape"][0]):
        for level in info["levels"]:
            for row in range(level["rows"]):
                for col in range(level["cols"]):
                    out.append((f"/api/tile/{array_id}?level={level['level']}&col={col}&row={row}"
                                f"&{z_param(z)}", (z, level["level"], col, row)))
    return out


# --------------------------------------------------------------------------- client


class Connection(asyncio.BufferedProtocol):
    """One keep-alive HTTP/1.1 connection; bodies are received into one reused buffer and
    counted, not kept (unless asked), so the client costs little beside the servers."""

    def __init__(self, host: str):
        self.host = host
        self.buffer = bytearray(1 << 20)
        # A memoryview, not the bytearray: asyncio's TLS transport reads on into
        # `buffer[offset:]`, which for a bytearray would be a copy (the bytes lost).
        self.view = memoryview(self.buffer)
        self.head = bytearray()
        self.remaining = None
        self.waiter = None
        self.keep = False
        self.body = bytearray()

    def connection_made(self, transport):
        self.transport = transport

    def get_buffer(self, sizehint):
        return self.view

    def buffer_updated(self, nbytes):
        data = memoryview(self.buffer)[:nbytes]
        if self.remaining is None:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.head[:end + 2])
            rest = bytes(self.head[end + 4:])
            self.head = bytearray()
            self.status = int(head[9:12])
            m = CONTENT_LENGTH.search(head)
            if m is None:
                self._fail(RuntimeError(f"no Content-Length: {head[:400]!r}"))
                return
            self.remaining = int(m.group(1)) - len(rest)
            if self.keep:
                self.body += rest
        else:
            self.remaining -= nbytes
            if self.keep:
                self.body += data
        if self.remaining is not None and self.remaining <= 0:
            if self.remaining < 0:
                self._fail(RuntimeError("more bytes than Content-Length"))
                return
            self.remaining = None
            waiter, self.waiter = self.waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_result(self.status)

    def _fail(self, exc):
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.transport.close()

    def connection_lost(self, exc):
        self._fail(exc or ConnectionError("connection closed"))

    async def get(self, path: str, keep=False) -> int:
        self.keep = keep
        self.body = bytearray()
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
        status = await self.waiter
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status}")
        return status


async def connect(base: str, n: int, context=None) -> list[Connection]:
    url = urllib.parse.urlsplit(base)
    loop = asyncio.get_running_loop()
    conns = []
    for _ in range(n):
        _, conn = await loop.create_connection(lambda: Connection(url.netloc), url.hostname, url.port,
                                               ssl=context)
        conns.append(conn)
    return conns


async def run_phase(conns, walks, seconds=None, pace=None):
    """Each connection walks its list (once, or round and round for `seconds`), one tile at a
    time, as soon as the last one arrived or every `pace` seconds. Returns the latencies
    (seconds) and the wall time."""
    latencies: list[float] = []
    started = time.perf_counter()
    deadline = started + seconds if seconds else None

    async def viewer(conn, walk, offset):
        i = 0
        next_at = started + offset
        while True:
            if deadline is None and i >= len(walk):
                return
            if deadline is not None and time.perf_counter() >= deadline:
                return
            if pace is not None:
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                next_at += pace
            t0 = time.perf_counter()
            await conn.get(walk[i % len(walk)])
            latencies.append(time.perf_counter() - t0)
            i += 1

    offsets = [pace * v / len(conns) if pace else 0.0 for v in range(len(conns))]
    await asyncio.gather(*(viewer(c, w, o) for c, w, o in zip(conns, walks, offsets)))
    return latencies, time.perf_counter() - started


def summarize(latencies, wall, cpu, client_cpu) -> dict:
    ms = np.array(latencies) * 1000
    n = len(latencies)
    return {"tiles": n, "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "tiles_per_s": n / wall, "wall_s": wall, "server_cpu_s": cpu,
            "server_cpu_ms_per_tile": cpu * 1000 / n, "client_cpu_ms_per_tile": client_cpu * 1000 / n}


async def measure(server, viewers, seconds, pace) -> dict:
    array_id = find_array_id(server.base, "pat", server.ssl)
    info = get_json(f"{server.base}/api/tile_info/{urllib.parse.quote(array_id, safe='@/')}", server.ssl)
    tiles = tile_paths(info)
    assert len(tiles) == 340, (len(tiles), info["levels"])
    paths = [p for p, _ in tiles]
    rng = random.Random(viewers)
    phases = {}
    plans = [
        ("cold", [paths[v::viewers] for v in range(viewers)], None, None),
        ("warm", [rng.sample(paths, len(paths)) for _ in range(viewers)], seconds, None),
        ("paced", [rng.sample(paths, len(paths)) for _ in range(viewers)], seconds, pace),
    ]
    for name, walks, secs, pace_s in plans:
        # New connections per phase: a server may close one idle between phases (uvicorn
        # after 5 s), and a browser would open a new one then, outside the tile's time.
        conns = await connect(server.base, viewers, server.ssl)
        cpu0, client0 = cpu_seconds(server.pid), time.process_time()
        latencies, wall = await run_phase(conns, walks, secs, pace_s)
        phases[name] = summarize(latencies, wall, cpu_seconds(server.pid) - cpu0,
                                 time.process_time() - client0)
        for c in conns:
            c.transport.close()
    # The bytes: a tile of every level and plane, checked against the pattern (untimed).
    (check,) = await connect(server.base, 1, server.ssl)
    for path, (z, level, col, row) in tiles[::23]:
        await check.get(path, keep=True)
        got = np.frombuffer(bytes(check.body), "<u2")
        want = expected_tile(z, level, col, row)
        if got.size != want.size or not np.array_equal(got.reshape(want.shape), want):
            raise RuntimeError(f"{server.name}: {path} is not the pattern")
    check.transport.close()
    return {"array_id": info["array_id"], "tile_size": info["tile_size"], **phases}


# --------------------------------------------------------------------------- main


def table(rows) -> str:
    out = ["| server | viewers | phase | tiles | p50 ms | p99 ms | tiles/s | server CPU ms/tile "
           "| server CPU % of a core | client CPU ms/tile |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for system, viewers, phase, r in rows:
        out.append(f"| {system} | {viewers} | {phase} | {r['tiles']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
                   f"| {r['tiles_per_s']:.0f} | {r['server_cpu_ms_per_tile']:.2f} "
                   f"| {100 * r['server_cpu_s'] / r['wall_s']:.0f} | {r['client_cpu_ms_per_tile']:.2f} |")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=str(ROOT / "target" / "release" / "tessera"))
    parser.add_argument("--reference", action="store_true",
                        help="also biopb's server + sidecar (installed by benches/reference/setup.sh)")
    parser.add_argument("--reference-bin", help="biopb-tensor-server installed elsewhere (implies --reference)")
    parser.add_argument("--viewers", default="1,50,200")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each warm phase")
    parser.add_argument("--pace-ms", type=float, default=250.0, help="a paced viewer's time between tiles")
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--https", action="store_true",
                        help="also Tessera with --tls-cert: the HTTP API over HTTPS, beside plain HTTP")
    parser.add_argument("--only-reference", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    systems = [] if args.only_reference else [("tessera", Tessera, args.bin)]
    if args.https:
        systems.append(("https", TesseraHttps, args.bin))
    if args.reference or args.reference_bin:
        ref_bin = args.reference_bin
        if ref_bin is None:
            import biopb_reference

            ref_bin = biopb_reference.ensure_installed()
        systems.append(("biopb", Biopb, ref_bin))
    rows, results = [], []
    with tempfile.TemporaryDirectory(prefix="tessera-web-bench-") as tmp:
        tmp = pathlib.Path(tmp)
        data = tmp / "data"
        write_pattern(data / "pat.zarr")
        for viewers in [int(v) for v in args.viewers.split(",")]:
            for key, cls, binary in systems:
                scratch = tmp / f"{key}-{viewers}"
                scratch.mkdir()
                server = cls(binary, data, scratch)
                try:
                    result = asyncio.run(measure(server, viewers, args.seconds, args.pace_ms / 1000))
                finally:
                    server.stop()
                    shutil.rmtree(scratch, ignore_errors=True)
                results.append({"server": key, "viewers": viewers, **result})
                for phase in ("cold", "warm", "paced"):
                    rows.append((cls.name, viewers, phase, result[phase]))
                    r = result[phase]
                    print(f"  {key:8s} {viewers:4d} viewers {phase:6s} p50 {r['p50_ms']:8.2f} ms  "
                          f"p99 {r['p99_ms']:8.2f} ms  {r['tiles_per_s']:8.0f} tiles/s  "
                          f"server CPU {r['server_cpu_ms_per_tile']:6.2f} ms/tile", flush=True)
    print()
    print(f"pace {args.pace_ms:g} ms, warm phases {args.seconds:g} s, binary {args.bin}")
    print(table(rows))
    by = {(r["server"], r["viewers"]): r for r in results}
    keys = {key for key, _, _ in systems}
    if {"tessera", "https"} <= keys:
        print()
        print("| viewers | phase | HTTPS / HTTP tiles/s | HTTPS / HTTP server CPU per tile | HTTPS / HTTP p50 |")
        print("|---|---|---|---|---|")
        for viewers in [int(v) for v in args.viewers.split(",")]:
            for phase in ("cold", "warm", "paced"):
                t, h = by[("tessera", viewers)][phase], by[("https", viewers)][phase]
                print(f"| {viewers} | {phase} | {h['tiles_per_s'] / t['tiles_per_s']:.2f}x "
                      f"| {h['server_cpu_ms_per_tile'] / t['server_cpu_ms_per_tile']:.2f}x "
                      f"| {h['p50_ms'] / t['p50_ms']:.2f}x |")
    if {"tessera", "biopb"} <= keys:
        print()
        print("| viewers | phase | Tessera / biopb tiles/s | biopb p50 / Tessera p50 |")
        print("|---|---|---|---|")
        for viewers in [int(v) for v in args.viewers.split(",")]:
            for phase in ("cold", "warm", "paced"):
                t, b = by[("tessera", viewers)][phase], by[("biopb", viewers)][phase]
                print(f"| {viewers} | {phase} | {t['tiles_per_s'] / b['tiles_per_s']:.1f}x "
                      f"| {b['p50_ms'] / t['p50_ms']:.1f}x |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"pace_ms": args.pace_ms, "seconds": args.seconds, "binary": args.bin, "results": results},
            indent=1))


if __name__ == "__main__":
    main()
