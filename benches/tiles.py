#!/usr/bin/env python3
"""Viewer tiles (issue 33): a 512² window of a 16000² u16 plane, as a viewer asks for it,
over the socket and over mmap, cold and warm.

The plane is (16000, 16000) u16 (488 MiB, microscopy-like: a smooth pattern plus noise).
A repetition is a fresh server (empty cache) and a fresh client process (the unmodified
biopb 0.13.0 client, `cache_bytes=0`) which first reads a small tensor (imports, pools and
the connection paid), drops the page cache (when permitted), then, timing each step:

* **cold aligned**: plan and read the window [8192:8704, 8192:8704] (`slice_hint`, as a
  viewer plans a tile), a 512-aligned window;
* **cold unaligned**: the window [5000:5512, 7000:7512], which straddles tile edges;
* **warm**: both windows again, planned again (what panning back costs).

Every window is compared with ``np.load`` after the timings. Routes: ``doget`` (the client
with ``BIOPB_CACHEFILE_TRANSFER_DISABLED=1``: every byte over the socket) and ``mmap`` (the
client's file-cache fast path). Rows are medians over ``--reps`` repetitions, with the
server's CPU for the whole session beside them::

    .venv/bin/python benches/tiles.py --bin target/debug/tessera --reps 5
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import shutil
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
_spec = importlib.util.spec_from_file_location("tessera_bench_run", HERE / "run.py")
bench = importlib.util.module_from_spec(_spec)  # run.py: workers, /proc readings, servers
_spec.loader.exec_module(bench)
_fspec = importlib.util.spec_from_file_location("tessera_format_bench", HERE / "format_bench.py")
fb = importlib.util.module_from_spec(_fspec)
_fspec.loader.exec_module(fb)

median = bench.median
EDGE = 16000
WINDOWS = {"aligned": (8192, 8192), "unaligned": (5000, 7000)}
SIDE = 512
NAME = "plane16k"


def make_plane(work: pathlib.Path) -> pathlib.Path:
    """Creates (or reuses) WORK/tiles/plane16k.npy and a small warm-up tensor beside it."""
    import numpy as np

    folder = work / "tiles"
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "warmup.npy", np.arange(4096, dtype=np.uint16))
    path = folder / f"{NAME}.npy"
    if path.exists():
        try:
            have = np.load(path, mmap_mode="r")
            if have.shape == (EDGE, EDGE) and have.dtype == np.uint16:
                return path
        except ValueError:
            pass
    print(f"  making {path} ({EDGE}, {EDGE}) u16", flush=True)
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(EDGE, EDGE))
    rng = np.random.default_rng(33)
    x = np.arange(EDGE, dtype=np.float32)
    for y0 in range(0, EDGE, 1000):
        ys = np.arange(y0, min(y0 + 1000, EDGE), dtype=np.float32)[:, None]
        smooth = 2000 + 1500 * np.sin(ys / 300.0) * np.cos(x[None, :] / 410.0)
        noise = rng.normal(0, 40, size=(len(ys), EDGE)).astype(np.float32)
        arr[y0:y0 + len(ys)] = np.clip(smooth + noise, 0, 65535).astype(np.uint16)
    arr.flush()
    del arr
    return path


def worker_main(job: dict) -> None:
    """One session: warm-up read, page cache dropped, the windows cold then warm."""
    import numpy as np
    from biopb.tensor import TensorFlightClient

    client = TensorFlightClient(job["location"], cache_bytes=0)
    client.get_tensor("warmup").compute()
    out = {"page_cache_dropped": bench.drop_page_cache()}
    cpu0 = bench.process_cpu_seconds(job["cpu_pid"])
    got = {}
    for state in ("cold", "warm"):
        for name, (y, x) in WINDOWS.items():
            hint = (slice(y, y + SIDE), slice(x, x + SIDE))
            t0 = time.perf_counter()
            planned = client.get_tensor(NAME, slice_hint=hint)
            # The plan is of the realized (cell-snapped) region or of the whole tensor:
            # either way the window is cut from it, as a viewer does.
            if planned.shape != (SIDE, SIDE):
                planned = planned[hint]
            window = planned.compute()
            out[f"{state} {name}"] = time.perf_counter() - t0
            got[name] = window
    out["server_cpu"] = bench.process_cpu_seconds(job["cpu_pid"]) - cpu0
    want = np.load(job["path"], mmap_mode="r")
    for name, (y, x) in WINDOWS.items():
        if not np.array_equal(got[name], want[y:y + SIDE, x:x + SIDE]):
            raise SystemExit(f"window {name} differs from the file")
    print(json.dumps(out))


def measure(binary, path, work, reps, extra=()) -> dict:
    """{route: [session answers]} over `reps` fresh servers per route."""
    sessions = {}
    for mode in ("doget", "mmap"):
        sessions[mode] = []
        for _ in range(reps):
            server = fb.tessera_server(binary, path.parent, work / "tiles-cache",
                                       work / "tiles-state", extra)
            try:
                sessions[mode].append(bench.run_worker(
                    {"kind": "tiles", "mode": mode, "location": server.location,
                     "path": str(path), "cpu_pid": server.pid}, script=__file__))
                grid = fb.tessera_grids(server).get(NAME)
            finally:
                server.stop()
        print(f"  {mode}: socket grid {grid}", flush=True)
    return sessions


def table(sessions) -> str:
    lines = ["| window | route | cold ms | warm ms |", "|---|---|---:|---:|"]
    for name in WINDOWS:
        for mode, runs in sessions.items():
            cold = median([r[f"cold {name}"] for r in runs]) * 1e3
            warm = median([r[f"warm {name}"] for r in runs]) * 1e3
            lines.append(f"| 512² {name} | {mode} | {cold:.1f} | {warm:.1f} |")
    for mode, runs in sessions.items():
        cpu = median([r["server_cpu"] for r in runs]) * 1e3
        dropped = all(r["page_cache_dropped"] for r in runs)
        lines.append(f"| (server CPU, whole session) | {mode} | {cpu:.0f} | "
                     f"page cache dropped: {dropped} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "tessera"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", default="/tmp/tessera-bench")
    ap.add_argument("--extra", action="append", default=[], help="an argument passed to the server")
    args = ap.parse_args()
    if args.worker:
        worker_main(json.loads(args.worker))
        return
    work = pathlib.Path(args.work)
    path = make_plane(work)
    sessions = measure(args.bin, path, work, args.reps, args.extra)
    print(table(sessions))
    shutil.rmtree(work / "tiles-cache", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
