#!/usr/bin/env python3
"""HTTP tile latency and throughput (issue 34): 1, 50 and 200 concurrent viewers, cold and
warm, against `tessera serve --http-listen` on loopback.

Each viewer is one keep-alive HTTP/1.1 connection (asyncio streams, no extra packages)
fetching its own sequence of tiles of a 4 x 4096 x 4096 uint16 pattern tensor, one at a
time, as a viewer panning does. Cold: a fresh server and cache directory, every tile read
for the first time (the viewers walk disjoint tiles). Warm: the same walk again on that
server. Figures: p50 and p99 of the per-tile latency and tiles per second over the run.

Usage (from the repository root; build the release binary first)::

    .venv/bin/python benches/web.py [--bin target/release/tessera] [--tiles-per-viewer 20]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import re
import sys
import tempfile
import time
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support" / "python"))
from tessera_launcher import TesseraProcess  # noqa: E402

HTTP_LINE = re.compile(r"viewer and HTTP API on http://([0-9.]+):([0-9]+)/")


async def viewer(host, port, paths, latencies):
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for path in paths:
            started = time.perf_counter()
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *([0-9]+)", head).group(1))
            await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
            latencies.append(time.perf_counter() - started)
    finally:
        writer.close()


async def load(host, port, walks):
    latencies: list[float] = []
    started = time.perf_counter()
    await asyncio.gather(*(viewer(host, port, walk, latencies) for walk in walks))
    wall = time.perf_counter() - started
    ms = np.array(latencies) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "tiles_per_s": len(latencies) / wall, "tiles": len(latencies)}


def walks_for(info, viewers, per_viewer):
    """Disjoint tile sequences: viewer v walks tiles v, v + viewers, ... of every plane and
    level (fewer per viewer when the tensor has too few tiles for all)."""
    tiles = []
    for z in range(info["shape"][0]):
        for level in info["levels"]:
            for row in range(level["rows"]):
                for col in range(level["cols"]):
                    tiles.append(f"/api/tile/{info['array_id']}?level={level['level']}&col={col}&row={row}&z={z}")
    per_viewer = max(1, min(per_viewer, len(tiles) // viewers))
    need = viewers * per_viewer
    return [tiles[v:need:viewers] for v in range(viewers)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=str(ROOT / "target" / "release" / "tessera"))
    parser.add_argument("--tiles-per-viewer", type=int, default=5)
    parser.add_argument("--viewers", default="1,50,200")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        data = tmp / "data"
        data.mkdir()
        z, y, x = np.ogrid[:4, :4096, :4096]
        np.save(data / "pat.npy", ((y * 7 + x * 3 + z * 1000) % 65536).astype("<u2"))
        rows = []
        for viewers in [int(v) for v in args.viewers.split(",")]:
            cache = tmp / f"cache{viewers}"
            server = TesseraProcess(args.bin, [data, "--cache-dir", cache, "--http-listen", "127.0.0.1:0"],
                                    env={"TESSERA_STATE_DIR": str(tmp / f"state{viewers}")})
            try:
                host, port = next(HTTP_LINE.search(l).groups() for l in server.log if HTTP_LINE.search(l))
                info = json.load(urllib.request.urlopen(f"http://{host}:{port}/api/tile_info/pat"))
                walks = walks_for(info, viewers, args.tiles_per_viewer)
                cold = asyncio.run(load(host, int(port), walks))
                warm = asyncio.run(load(host, int(port), walks))
            finally:
                server.stop()
            rows.append((viewers, cold, warm))
    print("| viewers | cold p50 ms | cold p99 ms | cold tiles/s | warm p50 ms | warm p99 ms | warm tiles/s |")
    print("|---|---|---|---|---|---|---|")
    for viewers, cold, warm in rows:
        print(f"| {viewers} | {cold['p50_ms']:.2f} | {cold['p99_ms']:.2f} | {cold['tiles_per_s']:.0f} "
              f"| {warm['p50_ms']:.2f} | {warm['p99_ms']:.2f} | {warm['tiles_per_s']:.0f} |")


if __name__ == "__main__":
    main()
