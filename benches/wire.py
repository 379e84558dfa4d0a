#!/usr/bin/env python3
"""Wire compression (docs/decisions/0039): one microscopy-like u16 volume (128 MiB by
default: smooth cells under Poisson noise) read over DoGet by the unmodified biopb client
(`BIOPB_CACHEFILE_TRANSFER_DISABLED=1`) from two servers running side by side on loopback,
`--wire-compression off` and `--wire-compression zstd`. Per server: the body bytes sent
(`tessera_do_get_body_bytes_total`), the first read (decode from the source, and for zstd
the compression of every chunk), the warm read (median of the repetitions, alternating the
servers), and the CPU time of the server and of the client beside each wall time.

    python benches/wire.py [--bin target/debug/tessera] [--mib 128] [--reps 5]
"""
import argparse
import os
import pathlib
import resource
import socket
import statistics
import sys
import tempfile
import time
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support" / "python"))
from tessera_launcher import TesseraProcess  # noqa: E402

MODES = ("off", "zstd")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def volume(mib):
    """u16 planes of 1024 × 2048: Gaussian cells of varied brightness on a 100-count
    background, plus Poisson noise, as a fluorescence microscope records."""
    rng = np.random.default_rng(39)
    planes = max(1, (mib << 20) // (1024 * 2048 * 2))
    yy, xx = np.mgrid[0:1024, 0:2048].astype(np.float32)
    out = np.empty((planes, 1024, 2048), dtype="<u2")
    for z in range(planes):
        plane = np.full((1024, 2048), 100.0, dtype=np.float32)
        for cy, cx, a in zip(rng.uniform(0, 1024, 60), rng.uniform(0, 2048, 60), rng.uniform(200, 2000, 60)):
            y0, y1, x0, x1 = int(max(cy - 60, 0)), int(min(cy + 60, 1024)), int(max(cx - 60, 0)), int(min(cx + 60, 2048))
            plane[y0:y1, x0:x1] += a * np.exp(-((yy[y0:y1, x0:x1] - cy) ** 2 + (xx[y0:y1, x0:x1] - cx) ** 2) / 400.0)
        out[z] = rng.poisson(plane).clip(0, 65535)
    return out


def server_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def body_bytes(metrics):
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tessera_do_get_body_bytes_total{"):
            out[line.split('encoding="')[1].split('"')[0]] = int(float(line.split()[-1]))
    return out


def timed_read(server, expected=None):
    """(wall s, server CPU s, client CPU s, body bytes by encoding) of one whole read."""
    from biopb.tensor import TensorFlightClient

    client = TensorFlightClient(server.location, cache_bytes=0)
    tensor = client.get_tensor("vol")
    before_bytes = body_bytes(server.metrics)
    before_cpu = server_cpu(server.pid)
    before_client = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    got = tensor.compute()
    wall = time.perf_counter() - start
    after_client = resource.getrusage(resource.RUSAGE_SELF)
    cpu = server_cpu(server.pid) - before_cpu
    client_cpu = (after_client.ru_utime + after_client.ru_stime) - (before_client.ru_utime + before_client.ru_stime)
    after_bytes = body_bytes(server.metrics)
    sent = {k: after_bytes[k] - before_bytes[k] for k in after_bytes}
    if expected is not None:
        assert got.tobytes() == expected.tobytes(), "a read differs from numpy"
    return wall, cpu, client_cpu, sent


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin", default=str(ROOT / "target" / "debug" / "tessera"))
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    os.environ["BIOPB_CACHEFILE_TRANSFER_DISABLED"] = "1"
    with tempfile.TemporaryDirectory() as work:
        work = pathlib.Path(work)
        data = volume(args.mib)
        (work / "src").mkdir()
        np.save(work / "src" / "vol.npy", data)
        servers = {}
        for mode in MODES:
            metrics = f"127.0.0.1:{free_port()}"
            server = TesseraProcess(
                args.bin,
                [work / "src", "--cache-dir", work / f"cache-{mode}", "--wire-compression", mode,
                 "--metrics-listen", metrics, "--http-listen", "off",
                 # Every plan on the 8 MiB socket grid (a DoGet reader's), from the first.
                 "--loopback-plans", "socket"],
                env={"TESSERA_STATE_DIR": str(work / f"state-{mode}")},
            )
            server.metrics = metrics
            servers[mode] = server
        try:
            time.sleep(1.5)  # the settle window of a file written just now
            first = {mode: timed_read(servers[mode], data) for mode in MODES}
            warm = {mode: [] for mode in MODES}
            for _ in range(args.reps):
                for mode in MODES:
                    warm[mode].append(timed_read(servers[mode]))
        finally:
            for server in servers.values():
                server.stop()
    chunks = len(range(0, data.nbytes, 8 << 20))
    print(f"volume: {data.shape} {data.dtype}, {data.nbytes / 2**20:.1f} MiB, ~{chunks} chunks of 8 MiB; "
          f"{args.reps} warm reps, medians")
    print("| mode | body bytes sent | first read (server CPU) | warm read | server CPU / warm read | client CPU / warm read |")
    print("|---|---|---|---|---|---|")
    for mode in MODES:
        wall, cpu, _, sent = first[mode]
        rows = warm[mode]
        total = sum(rows[-1][3].values())
        print(
            f"| {mode} | {total / 2**20:.1f} MiB ({', '.join(f'{k} {v / 2**20:.1f}' for k, v in rows[-1][3].items() if v)}) "
            f"| {wall * 1e3:.0f} ms ({cpu * 1e3:.0f} ms) "
            f"| {statistics.median(r[0] for r in rows) * 1e3:.0f} ms "
            f"| {statistics.median(r[1] for r in rows) * 1e3:.0f} ms "
            f"| {statistics.median(r[2] for r in rows) * 1e3:.0f} ms |"
        )
    extra = first["zstd"][1] - first["off"][1]
    print(f"first-read server CPU, zstd - off: {extra * 1e3:.0f} ms = {extra * 1e3 / chunks:.1f} ms per 8 MiB chunk")
    ratio = sum(warm["off"][-1][3].values()) / max(1, sum(warm["zstd"][-1][3].values()))
    print(f"bytes ratio off/zstd: {ratio:.2f}x")


if __name__ == "__main__":
    main()
