#!/usr/bin/env python3
"""Plane-wise reads (issue 37): a viewer reading a volume one z-plane at a time, as napari
with biopb's Tensor Browser does, cold, on Tessera and on biopb's own server, same run.

The volume is (40, 2048, 2048) u16 (320 MiB, 8 MiB planes). A repetition is a fresh
server (empty cache) and a fresh client process that drops the page cache (when
permitted), then, timing each step with the unmodified biopb 0.13.0 client and its
default settings (mmap fast path on loopback):

* **open**: ``get_descriptor(id, with_pyramid=True)``, ``get_tensor(id)`` (the plan) and
  the middle plane, ``arr[20].compute()``: what the first picture costs;
* **z-jumps**: planes far from every plane read before (3, 37, 11, 29: each in a
  different 8-plane block), one at a time: a slider dragged to a new place;
* **z-steps**: the next three planes after the last jump (30, 31, 32): the arrow key;
* **warm**: the middle plane again.

Every plane read is compared with ``np.load`` after the timings. biopb's server serves
the same bytes as an uncompressed zarr v2 array in (1, 2048, 2048) chunks, its own
transfer grid for this shape. Rows are medians over ``--reps`` repetitions; the ratio
column is Tessera / biopb (< 1: Tessera faster). ``benches/run.py --planes`` runs this
phase inside the main suite; alone::

    .venv/bin/python benches/planes.py --bin target/release/tessera --reps 5
    .venv/bin/python benches/planes.py --no-reference --extra=--mapped-chunk-target=0
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
_spec = importlib.util.spec_from_file_location("tessera_bench_run", HERE / "run.py")
bench = importlib.util.module_from_spec(_spec)  # run.py: workers, /proc readings, servers
_spec.loader.exec_module(bench)

median, fmt_ms, MiB = bench.median, bench.fmt_ms, bench.MiB
SHAPE = (40, 2048, 2048)
NAME = "planes"
OPEN_Z = 20
JUMPS = (3, 37, 11, 29)
STEPS = (30, 31, 32)
PHASES = ("open", "z-jump", "z-step", "warm plane")


def make_volume(work: pathlib.Path) -> pathlib.Path:
    """Creates (or reuses) WORK/planes/planes.npy: the volume, alone in its folder."""
    import numpy as np

    folder = work / NAME
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{NAME}.npy"
    if path.exists():
        try:
            existing = np.load(path, mmap_mode="r")
            if existing.shape == SHAPE and existing.dtype == np.uint16:
                return path
        except ValueError:
            pass
    print(f"  making {path} {SHAPE} uint16", flush=True)
    rng = np.random.default_rng(37)
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=SHAPE)
    for z in range(SHAPE[0]):
        arr[z] = rng.integers(0, 1 << 16, SHAPE[1:], dtype=np.uint16)
    arr.flush()
    del arr
    return path


def worker_main(job: dict) -> None:
    """One cold session of a plane-wise reader; prints its timings as JSON."""
    import numpy as np
    from biopb.tensor import TensorFlightClient

    if job.get("drop_caches"):
        out = {"page_cache_dropped": bench.drop_page_cache()}
    else:
        out = {"page_cache_dropped": evict_files(job["evict"])}
    cpu_pid = job.get("cpu_pid")
    cpu0 = bench.process_cpu_seconds(cpu_pid) if cpu_pid else 0.0
    planes = {}
    majflt0 = _major_faults(cpu_pid) if cpu_pid else 0
    t0 = time.perf_counter()
    client = TensorFlightClient(job["location"])
    t_connect = time.perf_counter()
    client.get_descriptor(job["id"], with_pyramid=True)
    t_descriptor = time.perf_counter()
    arr = client.get_tensor(job["id"])
    t_plan = time.perf_counter()
    planes[OPEN_Z] = np.asarray(arr[OPEN_Z].compute())
    t_end = time.perf_counter()
    out["open"] = [t_end - t0]
    # Pages the server faulted in from disk meanwhile: its own code, after the page-cache
    # drop, as much as the plane's bytes.
    out["server_major_faults_open"] = (_major_faults(cpu_pid) - majflt0) if cpu_pid else 0
    # Where the open goes: the client's connect, the descriptor, the plan, the first plane.
    out["open_parts"] = {"connect": t_connect - t0, "descriptor": t_descriptor - t_connect,
                         "plan": t_plan - t_descriptor, "plane": t_end - t_plan}
    for phase, zs in (("z-jump", JUMPS), ("z-step", STEPS), ("warm plane", (OPEN_Z,))):
        out[phase] = []
        for z in zs:
            t = time.perf_counter()
            planes[z] = np.asarray(arr[z].compute())
            out[phase].append(time.perf_counter() - t)
    out["server_cpu"] = (bench.process_cpu_seconds(cpu_pid) - cpu0) if cpu_pid else float("nan")
    want = np.load(job["path"], mmap_mode="r")
    for z, got in planes.items():
        if got.shape != want[z].shape or not np.array_equal(got, want[z]):
            raise SystemExit(f"plane {z} differs from the file")
    print(json.dumps(out))


def _major_faults(pid) -> int:
    """The major page faults of process `pid` so far (`/proc/PID/stat`, field 12)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[9])


def evict_files(paths) -> bool:
    """Drops the page-cache pages of `paths` alone (written back first), so those files
    are read from disk while everything else, the servers' code included, stays cached."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def data_files(root: pathlib.Path) -> list:
    """Every file of the source at `root` (a file, or a store's folder)."""
    return [str(root)] if root.is_file() else [str(p) for p in sorted(root.rglob("*")) if p.is_file()]


def _session(server, array_id, path, cold, data) -> dict:
    return bench.run_worker({"kind": "planes", "location": server.location, "id": array_id,
                             "path": str(path), "drop_caches": cold == "all",
                             "evict": data_files(data), "cpu_pid": server.pid},
                            script=__file__)


def _record(results, suffix, sessions, label_prefix):
    for phase in PHASES:
        times = [t for s in sessions for t in s[phase]]
        results[f"{label_prefix} {phase}{suffix}"] = {
            "times": times, "cpu": median([s["server_cpu"] for s in sessions]) if phase == "open" else float("nan"),
            "private_kib": 0, "anon_kib": 0,
            "page_cache_dropped": all(s["page_cache_dropped"] for s in sessions)}
        print(f"  {label_prefix} {phase}{suffix}: median {median(times) * 1e3:.1f} ms over {len(times)}",
              flush=True)
    parts = {part: median([s["open_parts"][part] for s in sessions]) * 1e3
             for part in sessions[0]["open_parts"]}
    faults = median([s["server_major_faults_open"] for s in sessions])
    print(f"  {label_prefix} open{suffix}, medians: "
          + ", ".join(f"{part} {ms:.1f} ms" for part, ms in parts.items())
          + f"; server major faults {faults:.0f}", flush=True)


def tessera_rows(binary, path, work, reps, results, extra=(), label_prefix=NAME, cold="all"):
    cache = work / "planes-cache"
    sessions = []
    for _ in range(reps):
        shutil.rmtree(cache, ignore_errors=True)
        server = bench.Server(binary, [path], cache, list(extra))
        try:
            sessions.append(_session(server, NAME, path, cold, path))
        finally:
            server.stop()
            shutil.rmtree(cache, ignore_errors=True)
    _record(results, "", sessions, label_prefix)


def reference_rows(path, work, reps, results, label_prefix=NAME, cold="all"):
    ref = bench.reference_module()
    binary = ref.ensure_installed()
    data = work / "planes-reference-zarr"
    data.mkdir(parents=True, exist_ok=True)
    chunks = ref.write_zarr_v2(path, data / f"{NAME}.zarr", 8 * MiB, work / "reference-state")
    print(f"  biopb server: zarr chunks {tuple(chunks)}", flush=True)
    scratch, cache = work / "planes-ref", work / "planes-ref-cache"
    cls = type("ReferenceProcess", (bench.ProcStats, ref.ReferenceServer), {})
    sessions = []
    for _ in range(reps):
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        server = cls(binary, data, scratch, cache, min_sources=1)
        try:
            sources = bench.run_worker({"kind": "catalog", "location": server.location})["sources"]
            [array_id] = [s["source_id"] for s in sources
                          if (s.get("source_url") or "").rstrip("/").endswith(f"/{NAME}.zarr")]
            sessions.append(_session(server, array_id, path, cold, data / f"{NAME}.zarr"))
        finally:
            server.stop()
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)
    _record(results, bench.REF_SUFFIX, sessions, label_prefix)


def planes_phase(binary, work, reps, results, reference=True, extra=(), cold="all"):
    """The rows of this benchmark, added to `results` (run.py's table format). `cold`:
    what a session starts without, "all" (the whole page cache dropped: the servers'
    own code is read from disk again too) or "data" (only the source's files evicted)."""
    print(f"plane-wise reads (a viewer, one z-plane at a time; cold: {cold}):", flush=True)
    path = make_volume(pathlib.Path(work))
    tessera_rows(binary, path, pathlib.Path(work), reps, results, extra, cold=cold)
    if reference:
        reference_rows(path, pathlib.Path(work), reps, results, cold=cold)


def table(results) -> str:
    lines = ["| plane-wise read, cold session | Tessera ms | biopb server ms | Tessera / biopb |",
             "|---|---:|---:|---:|"]
    for phase in PHASES:
        ours = results.get(f"{NAME} {phase}")
        theirs = results.get(f"{NAME} {phase}{bench.REF_SUFFIX}")
        t_ours = median(ours["times"]) if ours else float("nan")
        t_ref = median(theirs["times"]) if theirs else float("nan")
        ratio = f"{t_ours / t_ref:.2f}×" if ours and theirs else ""
        lines.append(f"| {phase} | {fmt_ms(t_ours)} | {fmt_ms(t_ref) if theirs else ''} | {ratio} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "tessera"))
    ap.add_argument("--work", default="/tmp/tessera-bench")
    ap.add_argument("--reps", type=int, default=5, help="cold sessions per server (medians reported)")
    ap.add_argument("--no-reference", action="store_true", help="Tessera only")
    ap.add_argument("--cold", choices=("all", "data"), default="all",
                    help="all: drop the whole page cache before each session (servers' code too); "
                         "data: evict only the source's files")
    ap.add_argument("--extra", action="append", default=[],
                    help="an argument for tessera serve (repeat), e.g. --extra=--mapped-chunk-target=0")
    args = ap.parse_args()
    if args.worker:
        worker_main(json.loads(args.worker))
        return
    results = {}
    planes_phase(args.bin, args.work, args.reps, results, not args.no_reference, args.extra, args.cold)
    print()
    print(table(results))
    out = pathlib.Path(args.work) / "planes-results.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"\n(raw timings: {out})")
    if not all(r.get("page_cache_dropped", True) for r in results.values()):
        print("Note: the page cache could not be dropped; cold rows read the file from it.")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
