#!/usr/bin/env python3
"""Upload throughput: a u16 array (256 MiB by default) uploaded with the biopb client's
`upload_array` over loopback, against a warm `do_get` read of the same array in the same
run, with the server's anonymous memory sampled during the upload (issue 18's target:
upload >= 0.5x the warm read rate; anonymous memory bounded by the chunks in flight).
With `--schemes cache,zarr` each repetition uploads once per store format, in turn, and
a row is printed per format (docs/decisions/0031: what the Zarr store costs).

    python benches/upload.py [--bin target/release/tessera] [--mib 256] [--reps 3] [--schemes cache]
"""
import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support" / "python"))
from tessera_launcher import TesseraProcess  # noqa: E402


def rss_anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


class AnonSampler:
    """The largest RssAnon of `pid` seen while running."""

    def __init__(self, pid):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_anon_kib(self.pid))
            time.sleep(0.02)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "tessera"))
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", default=None, help="directory for the state and cache dirs")
    ap.add_argument("--schemes", default="cache", help="store formats to upload as, comma-separated")
    args = ap.parse_args()
    os.environ["BIOPB_CACHEFILE_TRANSFER_DISABLED"] = "1"  # reads travel do_get
    from biopb.tensor import TensorFlightClient

    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="tessera-upload-bench-"))
    (work / "empty").mkdir(parents=True, exist_ok=True)
    rows = args.mib * 1024 * 1024 // (2 * 1024 * 1024)
    arr = np.random.default_rng(0).integers(0, 65535, (rows, 1024, 1024), dtype=np.uint16)
    nbytes = arr.nbytes
    server = TesseraProcess(args.bin, [work / "empty", "--writable", "--state-dir", work / "state",
                                       "--cache-dir", work / "cache"])
    try:
        client = TensorFlightClient(server.location, cache_bytes=0)
        schemes = args.schemes.split(",")
        uploads, reads, peaks = ({s: [] for s in schemes} for _ in range(3))
        for rep in range(args.reps):
            for scheme in schemes:
                desc = client.setup_array_upload(f"{scheme}://scratch/@fields/bench{rep}-{scheme}", arr)
                base = rss_anon_kib(server.pid)
                with AnonSampler(server.pid) as sampler:
                    t = time.perf_counter()
                    status = client.upload_array(desc, arr)
                    uploads[scheme].append(time.perf_counter() - t)
                assert status["state"] == "READY", status
                peaks[scheme].append((sampler.peak - base) / 1024)
                got = client.get_tensor(desc.array_id).compute()  # warm-up, and a check
                assert got.tobytes() == arr.tobytes()
                t = time.perf_counter()
                client.get_tensor(desc.array_id).compute()
                reads[scheme].append(time.perf_counter() - t)
                client.set_upload_status(desc, "DISCARDED")
        chunk = list(desc.chunk_shape)
    finally:
        server.stop()
    mib = nbytes / (1 << 20)
    print(f"array: {arr.shape} u16, {mib:.0f} MiB, server grid {chunk} "
          f"({np.prod(chunk) * 2 / (1 << 20):.0f} MiB chunks); median of {args.reps}")
    for scheme in schemes:
        up, rd = statistics.median(uploads[scheme]), statistics.median(reads[scheme])
        print(f"{scheme}:// upload_array:      {up:6.2f} s  {mib / up:7.0f} MiB/s")
        print(f"{scheme}:// warm do_get read:  {rd:6.2f} s  {mib / rd:7.0f} MiB/s")
        print(f"{scheme}:// upload / read rate: {rd / up:.2f}x")
        print(f"{scheme}:// server RssAnon growth during upload: median "
              f"{statistics.median(peaks[scheme]):.0f} MiB, max {max(peaks[scheme]):.0f} MiB")


if __name__ == "__main__":
    main()
