#!/usr/bin/env python3
"""Zarr sources benchmark (issue 30): compressed u16 OME-Zarr volumes, one run, side by side.

Writes (or reuses, by a stamp) two OME-Zarr 0.4 images of the same microscopy-like u16
volume -- one compressed with Blosc(lz4, shuffle), one with Zstd -- each a small pyramid
of three levels, then measures in the same run, as medians of N repetitions:

* Tessera (``--bin``) cold and warm, through the unmodified biopb 0.13.0 client,
  ``TensorFlightClient(loc).get_tensor(id).compute()``, over do_get
  (``BIOPB_CACHEFILE_TRANSFER_DISABLED=1``) and over the mmap fast path;
* biopb's own server (biopb-tensor-server 0.13.0, benches/reference/) serving the same
  folder (it reads Zarr natively), same client, same routes;
* zarr-python reading the same level-0 array into numpy, ``zarr.open_array(path)[...]``,
  cold (page cache dropped) and warm.

Wall time, client CPU, server CPU (``/proc/PID/stat``) and MB/s (decoded bytes / wall).
The client workers, /proc readings and biopb server launcher are benches/run.py's.

Usage (from the repository root)::

    .venv/bin/python benches/zarr.py --bin /tmp/tessera-zarr-bench      # full, writes the docs
    .venv/bin/python benches/zarr.py --quick --no-doc                   # 128 MiB, fewer reps
    .venv/bin/python benches/zarr.py --no-reference                     # without biopb's server

Results are also written, as they come, to ``WORK/results.json``.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
# This file is named zarr.py: keep its folder off the import path, or `import zarr` would
# import this script instead of zarr-python. run.py is loaded by its path.
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("tessera_format_bench", HERE / "format_bench.py")
fb = importlib.util.module_from_spec(_spec)  # what the format benchmarks share
_spec.loader.exec_module(fb)
bench = fb.bench  # run.py: workers, /proc readings, servers

median, fmt_ms, MiB, GiB, MODES = fb.median, fb.fmt_ms, fb.MiB, fb.GiB, fb.MODES
# The two stores: name (= Tessera's source id) -> compressor description.
CODECS = {"lz4": "Blosc(cname=lz4, clevel=5, shuffle=SHUFFLE)", "zstd": "Zstd(level=3)"}
# bioformats2raw's defaults: 1024 x 1024 tiles, one plane deep.
CHUNK_YX = 1024
LEVELS = 3
STORE_FORMAT = "tessera-zarr-bench-1"
SECTION = "## Zarr sources"
# The section's hand-written part: kept when a run rewrites the figures above it.
ANALYSIS = "### What limits it (hand-written"


# --------------------------------------------------------------------------- stores


def compressor(name):
    import numcodecs

    if name == "lz4":
        return numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    return numcodecs.Zstd(level=3)


def level_shapes(shape):
    z, y, x = shape
    return [(z, y >> k, x >> k) for k in range(LEVELS)]


def store_stamp(shape):
    return {"format": STORE_FORMAT, "shape": list(shape), "chunk_yx": CHUNK_YX, "levels": LEVELS,
            "codecs": CODECS}


def write_stores(data: pathlib.Path, state: pathlib.Path, shape) -> dict:
    """Writes (or reuses) data/lz4.zarr and data/zstd.zarr; returns {name: store path}.

    The stamps live in `state` (outside the served folder); a store is reused when its
    stamp matches. Both stores hold the same values, written plane group by plane group."""
    import numpy as np
    import zarr

    data.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    want = store_stamp(shape)
    stores = {n: data / f"{n}.zarr" for n in CODECS}
    todo = []
    for n, p in stores.items():
        stamp = state / f"{n}.stamp.json"
        ok = p.is_dir() and stamp.exists() and json.loads(stamp.read_text()) == want
        if not ok:
            stamp.unlink(missing_ok=True)
            shutil.rmtree(p, ignore_errors=True)
            todo.append(n)
    stray = sorted(x.name for x in data.iterdir() if x.name not in {s.name for s in stores.values()})
    if stray:
        raise RuntimeError(f"{data} holds more than the two stores ({stray}); remove them")
    if not todo:
        return stores
    print(f"  writing {', '.join(todo)} OME-Zarr 0.4 stores, level 0 {shape} u16", flush=True)
    shapes = level_shapes(shape)
    arrays = {}
    for n in todo:
        g = zarr.open_group(str(stores[n]), mode="w", zarr_format=2)
        arrays[n] = []
        for k, s in enumerate(shapes):
            chunks = (1, min(CHUNK_YX, s[1]), min(CHUNK_YX, s[2]))
            arrays[n].append(g.create_array(
                str(k), shape=s, chunks=chunks, dtype="uint16", fill_value=0,
                compressors=compressor(n), chunk_key_encoding={"name": "v2", "separator": "/"}))
        g.attrs["multiscales"] = [{
            "version": "0.4", "name": n,
            "axes": [{"name": a, "type": "space", "unit": "micrometer"} for a in "zyx"],
            "datasets": [{"path": str(k), "coordinateTransformations": [
                {"type": "scale", "scale": [1.0, 0.5 * 2 ** k, 0.5 * 2 ** k]}]} for k in range(LEVELS)],
            "type": "mean",
        }]
    rng = np.random.default_rng(30)
    depth, step = shape[0], 4
    t0 = time.perf_counter()
    for z0 in range(0, depth, step):
        block = np.stack([fb.plane(rng, z, shape[1], shape[2], depth) for z in range(z0, min(z0 + step, depth))])
        levels = [block]
        for _ in range(1, LEVELS):
            levels.append(fb.halve_yx(levels[-1]))
        for n in todo:
            for k, lv in enumerate(levels):
                arrays[n][k][z0:z0 + lv.shape[0]] = lv
        if z0 % 16 == 0:
            print(f"    planes {z0 + block.shape[0]}/{depth} ({time.perf_counter() - t0:.0f} s)", flush=True)
    for n in todo:
        (state / f"{n}.stamp.json").write_text(json.dumps(want))
    return stores


# --------------------------------------------------------------------------- workers


def run_own_worker(job: dict) -> dict:
    """A job of this script's own worker (cold reads, zarr-python reads, read-back checks),
    in a child process with the route's environment (run.py's `run_worker`)."""
    return bench.run_worker(job, script=__file__)


def worker_main(job: dict) -> None:
    import numpy as np
    import zarr

    out = {}
    if job["kind"] == "zarr":
        # zarr-python into numpy, the user's call; its default concurrency.
        out["concurrency"] = {"async.concurrency": zarr.config.get("async.concurrency"),
                              "threading.max_workers": zarr.config.get("threading.max_workers")}
        zarr.open_array(job["warmup"], mode="r")[...]  # imports, pools, first-call costs
        times, cpus = [], []
        for _ in range(job["reps"]):
            if job["cold"]:
                out["page_cache_dropped"] = bench.drop_page_cache()
            before = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            arr = zarr.open_array(job["path"], mode="r")[...]
            times.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            del arr
        out["times"], out["client_cpu"] = times, cpus
    elif job["kind"] == "cold":
        # run.py's cold read, with a small warm-up: the other image's smallest level.
        from biopb.tensor import TensorFlightClient

        client = TensorFlightClient(job["location"], cache_bytes=0)
        warmup = job["warmup"]
        if warmup.get("scale"):
            client.get_tensor(warmup["id"], scale_hint=warmup["scale"]).compute()
        else:
            client.get_tensor(warmup["id"]).compute()
        out.update(fb.timed_cold_read(client, job))
    elif job["kind"] == "check":
        # One untimed read through the biopb client, compared with zarr-python's read.
        from biopb.tensor import TensorFlightClient

        got = TensorFlightClient(job["location"], cache_bytes=0).get_tensor(job["id"]).compute()
        want = zarr.open_array(job["path"], mode="r")[...]
        if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
            raise SystemExit(f"{job['id']}: read back {got.shape} {got.dtype}, not the store's "
                             f"{want.shape} {want.dtype} values")
        out["ok"] = True
    print(json.dumps(out))


# --------------------------------------------------------------------------- phases


def check_with(server, stores):
    """The warm rows' check: one untimed read per route compared with zarr-python's."""
    def check(name, array_id, mode):
        run_own_worker({"kind": "check", "location": server.location, "id": array_id, "mode": mode,
                        "path": str(stores[name] / "0")})
    return check


def tessera_warmup(_ids, name):
    """Tessera's warm-up read: the image's smallest level under its own id."""
    return {"id": f"{name}.{LEVELS - 1}"}


def cold_job(ids_of, warmup_of, drop=True):
    """A cold read of a store's level 0 after a warm-up read of the other store's smallest
    level (`warmup_of(ids, store)`: the id and scale hint that address it)."""
    def job(server, name, mode):
        ids = ids_of(server)
        other = next(n for n in CODECS if n != name)
        return run_own_worker({"kind": "cold", "location": server.location, "id": ids[name], "mode": mode,
                               "warmup": warmup_of(ids, other), "cpu_pid": server.pid, "drop": drop})
    return job


def tessera_phase(args, data, work, res, cold_reps, warm_reps):
    ids = {n: n for n in CODECS}
    stores = {n: data / f"{n}.zarr" for n in CODECS}
    cache = work / "tessera-warm-cache"
    server = fb.tessera_server(args.bin, data, cache, work / "tessera-warm-state")
    try:
        grids = fb.tessera_grids(server)
        res.info["tessera_grid"] = {n: grids.get(n) for n in CODECS}
        fb.warm_rows(server, ids, res.info["level0_bytes"], check_with(server, stores), warm_reps, res,
                     "Tessera", locates=lambda: bench.cache_stats(server.location)["locates"])
    finally:
        server.stop()
        shutil.rmtree(cache, ignore_errors=True)
    cold = work / "tessera-cold-cache"

    def start():
        return fb.tessera_server(args.bin, data, cold, work / "tessera-cold-state")

    try:
        # Tessera serves each level under its own id (`lz4.2`); the image's scaled read
        # (`scale_hint`) is not used: it decodes level 0 (see performance.md).
        fb.cold_rows(start, CODECS, cold_job(lambda _s: ids, tessera_warmup), cold_reps, res, "Tessera",
                     res.info["level0_bytes"])
    finally:
        shutil.rmtree(cold, ignore_errors=True)


def zarr_phase(data, res, cold_reps, warm_reps):
    for name in CODECS:
        path = data / f"{name}.zarr" / "0"
        warmup = data / f"{next(n for n in CODECS if n != name)}.zarr" / str(LEVELS - 1)
        for cold, reps in ((True, cold_reps), (False, warm_reps)):
            if not cold:  # page cache warm: one untimed read first
                run_own_worker({"kind": "zarr", "path": str(path), "warmup": str(warmup), "reps": 1,
                                "cold": False})
            r = run_own_worker({"kind": "zarr", "path": str(path), "warmup": str(warmup), "reps": reps,
                                "cold": cold})
            res.info["zarr_concurrency"] = r["concurrency"]
            row = {"times": r["times"], "client_cpu": median(r["client_cpu"]),
                   "bytes": res.info["level0_bytes"]}
            if cold:
                row["page_cache_dropped"] = r.get("page_cache_dropped", False)
            res.add(f"{name} {'cold' if cold else 'warm'}, zarr-python", row)


def rust_phase(args, data, work, res, cold_reps, warm_reps):
    """Tessera's own Rust client (`tessera get ID -o /dev/null`), cold and warm, timed end
    to end with its CPU (`wait4`): is the biopb client or the server the limit?"""
    for name in CODECS:
        for mode in MODES:
            base = [args.bin, "get"]
            tail = [name, "-o", "/dev/null"] + (["--no-mmap"] if mode == "doget" else [])
            for state in ("cold", "warm"):
                times, ccpu, scpu = [], [], []
                cache = work / "tessera-rust-cache"
                server = None
                try:
                    for i in range(cold_reps if state == "cold" else warm_reps + 1):
                        if state == "cold" or server is None:
                            if server:
                                server.stop()
                            server = fb.tessera_server(args.bin, data, cache, work / "tessera-rust-state")
                            if state == "cold":
                                bench.drop_page_cache()
                        cpu0 = server.cpu_seconds()
                        t0 = time.perf_counter()
                        proc = subprocess.Popen(base + [server.location] + tail, stdout=subprocess.DEVNULL,
                                                stderr=subprocess.PIPE)
                        _, status, usage = os.wait4(proc.pid, 0)
                        wall = time.perf_counter() - t0
                        if os.waitstatus_to_exitcode(status) != 0:
                            raise RuntimeError(f"tessera get {name} failed: {proc.stderr.read()[-500:]}")
                        if state == "warm" and i == 0:
                            continue  # the untimed read that fills the cache
                        times.append(wall)
                        ccpu.append(usage.ru_utime + usage.ru_stime)
                        scpu.append(server.cpu_seconds() - cpu0)
                finally:
                    if server:
                        server.stop()
                    shutil.rmtree(cache, ignore_errors=True)
                res.add(f"{name} {state} {mode}, Tessera (Rust client)",
                        {"times": times, "server_cpu": median(scpu), "client_cpu": median(ccpu),
                         "bytes": res.info["level0_bytes"]})


def cached_source_phase(args, data, work, res, cold_reps):
    """Tessera cold (empty segment cache) with the store in the page cache: how much of a
    cold read is waiting for the disk."""
    cold = work / "tessera-cold-cache"
    try:
        fb.cold_rows(lambda: fb.tessera_server(args.bin, data, cold, work / "tessera-cold-state"), CODECS,
                     cold_job(lambda _s: {n: n for n in CODECS}, tessera_warmup, drop=False), cold_reps, res,
                     "Tessera", res.info["level0_bytes"], state="cold-cache, store in page cache,")
    finally:
        shutil.rmtree(cold, ignore_errors=True)


def npy_phase(args, data, work, res, warm_reps):
    """The anchor of "warm as for `.npy`": level 0 of the lz4 store saved as a `.npy` file
    (the same values), served by Tessera and read warm over both routes."""
    import numpy as np
    import zarr

    folder = work / "npy"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vol.npy"
    stamp = work / "state" / "vol.npy.stamp.json"
    want = store_stamp(res.info["shapes"][0])
    if not (path.exists() and stamp.exists() and json.loads(stamp.read_text()) == want):
        print(f"  writing {path}", flush=True)
        np.save(path, zarr.open_array(str(data / "lz4.zarr" / "0"), mode="r")[...])
        stamp.write_text(json.dumps(want))
    cache = work / "tessera-npy-cache"
    server = fb.tessera_server(args.bin, path, cache, work / "tessera-npy-state")
    try:
        nbytes = res.info["level0_bytes"]
        for mode in MODES:
            bench.run_worker(fb.read_job(server.location, "vol", mode, 0, verify=True, paths=[str(path)]))
            before = bench.cache_stats(server.location)["locates"]
            cpu0 = server.cpu_seconds()
            r = bench.run_worker(fb.read_job(server.location, "vol", mode, warm_reps))
            row = {"times": r["times"], "server_cpu": (server.cpu_seconds() - cpu0) / max(warm_reps, 1),
                   "client_cpu": r["client_cpu"], "bytes": nbytes,
                   "locates": bench.cache_stats(server.location)["locates"] - before}
            res.add(f"npy warm {mode}, Tessera", row)
    finally:
        server.stop()
        shutil.rmtree(cache, ignore_errors=True)


def reference_phase(data, work, res, cold_reps, warm_reps, shapes):
    ref = fb.Reference(data, work, min_sources=len(CODECS))
    res.info["reference_version"] = ref.version
    stores = {n: data / f"{n}.zarr" for n in CODECS}

    def ids_of(server):
        """{store: id of its image} from the catalog."""
        return ref.ids(server, {n: f"/{n}.zarr" for n in CODECS}, {n: shapes[0] for n in CODECS})

    server = ref.start("warm")
    try:
        res.info["reference_ready_s"] = server.ready_seconds
        ids = ids_of(server)
        res.info["reference_ids"] = ids
        fb.warm_rows(server, ids, res.info["level0_bytes"], check_with(server, stores), warm_reps, res,
                     "biopb server")
    finally:
        server.stop()

    step = 1 << (LEVELS - 1)
    # biopb's server lists an image as one source: its smallest level is a scaled read.
    fb.cold_rows(lambda: ref.start("cold"), CODECS,
                 cold_job(ids_of, lambda ids, n: {"id": ids[n], "scale": [1, step, step]}), cold_reps, res,
                 "biopb server", res.info["level0_bytes"])


# --------------------------------------------------------------------------- report


def table(res) -> str:
    lines = ["| store | read | system | median ms | MB/s | server CPU s | client CPU s | "
             "Tessera / this (time) |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for name in CODECS:
        for state in ("cold", "cold-cache, store in page cache,", "warm"):
            for mode in (*MODES, None):
                for system in (("Tessera", "Tessera (Rust client)", "biopb server") if mode else ("zarr-python",)):
                    label = f"{name} {state} {mode}, {system}" if mode else f"{name} {state}, {system}"
                    row = res.rows.get(label)
                    if not row:
                        continue
                    t = median(row["times"])
                    ours = res.rows.get(f"{name} {state} {mode or 'doget'}, Tessera")
                    ratio = "" if system == "Tessera" or not ours else f"{median(ours['times']) / t:.2f}×"
                    cpu = row.get("server_cpu")
                    route = {"doget": "do_get", "mmap": "mmap", None: "`[...]` into numpy"}[mode]
                    lines.append(f"| {name} | {state} {route} | {system} | {fmt_ms(t)} | "
                                 f"{row['bytes'] / t / 1e6:.0f} | {'' if cpu is None else f'{cpu:.2f}'} | "
                                 f"{row['client_cpu']:.2f} | {ratio} |")
    for mode in MODES:
        row = res.rows.get(f"npy warm {mode}, Tessera")
        if row:
            t = median(row["times"])
            lines.append(f"| `.npy` of lz4's level 0 | warm {mode.replace('doget', 'do_get')} | Tessera | {fmt_ms(t)} | "
                         f"{row['bytes'] / t / 1e6:.0f} | {row['server_cpu']:.2f} | {row['client_cpu']:.2f} | |")
    return "\n".join(lines)


def ratios(res) -> str:
    """The issue's goals, one line each: Tessera / biopb server and Tessera / zarr-python."""
    out = []
    for name in CODECS:
        for state in ("cold", "warm"):
            for mode in MODES:
                ours = res.rows.get(f"{name} {state} {mode}, Tessera")
                theirs = res.rows.get(f"{name} {state} {mode}, biopb server")
                zp = res.rows.get(f"{name} {state}, zarr-python")
                if not ours:
                    continue
                t = median(ours["times"])
                parts = []
                if theirs:
                    parts.append(f"biopb server / Tessera **{median(theirs['times']) / t:.2f}×**")
                if zp:
                    parts.append(f"Tessera / zarr-python **{t / median(zp['times']):.2f}×**")
                npy = res.rows.get(f"npy warm {mode}, Tessera")
                if state == "warm" and npy:
                    parts.append(f"Tessera zarr / Tessera `.npy` **{t / median(npy['times']):.2f}×**")
                if parts:
                    out.append(f"- {name} {state} {mode}: " + "; ".join(parts))
    return "\n".join(out)


def cpu_per_gib(res) -> str:
    out = []
    for name in CODECS:
        for label, what in ((f"{name} cold doget, Tessera", "Tessera server, cold do_get"),
                            (f"{name} cold mmap, Tessera", "Tessera server, cold mmap"),
                            (f"{name} warm doget, Tessera", "Tessera server, warm do_get"),
                            (f"{name} cold doget, biopb server", "biopb server, cold do_get"),
                            (f"{name} cold, zarr-python", "zarr-python (client process), cold")):
            row = res.rows.get(label)
            if not row:
                continue
            cpu = row.get("server_cpu")
            cpu = row["client_cpu"] if cpu is None else cpu
            out.append(f"- {name}: {what}: {cpu / (row['bytes'] / GiB):.2f} CPU s per GiB decoded "
                       f"(wall {median(row['times']) / (row['bytes'] / GiB):.2f} s per GiB)")
    return "\n".join(out)


def method(res, args, cold_reps, warm_reps) -> str:
    i = res.info
    shapes = " → ".join(str(tuple(s)) for s in i["shapes"])
    sizes = ", ".join(f"{n} {i['store_bytes'][n] / MiB:.0f} MiB on disk (level 0 ratio "
                      f"{i['level0_bytes'] / i['level0_store_bytes'][n]:.2f}:1)" for n in CODECS)
    dropped = all(r.get("page_cache_dropped", True) for label, r in res.rows.items() if " cold " in label)
    ref = (f"biopb's own server ({i['reference_version']}, installed by `benches/reference/setup.sh`) "
           "serving the same folder (it reads Zarr natively, no conversion), started as "
           "`benches/run.py --reference` starts it; its ids come from its catalog"
           if "reference_version" in i else
           f"**biopb's server rows are missing**: {i.get('reference_missing', 'not run (--no-reference)')}")
    zc = i.get("zarr_concurrency", {})
    return f"""Generated by `benches/zarr.py` on {i['when']} (`--bin {args.bin}`).
**Machine:** {bench.machine()}. Compare rows of this run with each other only (the
machine may be shared: the hand-written part below says how loaded it was).

**Binary.** {i['binary']}

**Data.** Two OME-Zarr 0.4 images (Zarr v2 arrays, `/` chunk keys) of the same
microscopy-like u16 volume, written by zarr-python {i['zarr_version']}: a dark offset, a
smooth background haze, 24 Gaussian "cells" whose brightness follows a focus curve in z,
shot noise (√signal) and read noise; levels {shapes} (2× mean downsampling in y and x).
Chunks `(1, 1024, 1024)` (2 MiB decoded; Tessera fits its grid to them: level-0 cells of
`{i.get('tessera_grid', {}).get('lz4')}`, whole store chunks up to its 8 MiB chunk target): bioformats2raw's default tile (1024 × 1024, one
plane deep), the most common OME-Zarr writer for microscope files. One store with
`{CODECS['lz4']}` (bioformats2raw's default compressor), one with `{CODECS['zstd']}`.
Sizes: {sizes}. Every read below reads level 0, {i['level0_bytes'] / GiB:.2f} GiB decoded.

**Method.** Medians of {cold_reps} cold and {warm_reps} warm repetitions, all rows in one
run. Tessera and biopb's server are read by the unmodified `biopb==0.13.0` client,
`TensorFlightClient(location, cache_bytes=0).get_tensor(id).compute()`, in benches/run.py's
worker processes: *do_get* sets `BIOPB_CACHEFILE_TRANSFER_DISABLED=1`, *mmap* leaves the
fast path on (Tessera's `locates` counter proves which path ran). Tessera's id is the
store's name (`lz4`, `zstd`): the image, planned at level 0. *Warm*: one untimed read per
route, compared value for value with zarr-python's read of level 0, then the timed reads
(Tessera's segment cache and the page cache hold the chunks). *Cold*: a new server with an
empty cache directory per repetition; the client process first reads the other store's
smallest level (Tessera: `get_tensor("zstd.2")`, the level's own id; biopb's server lists
the image as one source: `get_tensor(id, scale_hint=[1, 4, 4])`), so its imports, pools
and connection are paid before the clock, then
{'drops the page cache (`echo 1 > /proc/sys/vm/drop_caches`)' if dropped else 'tries to drop the page cache but was **not permitted** (cold rows read the store from the page cache)'},
plans the tensor, and times the read; server CPU is that of the timed read
(`/proc/PID/stat`, user + system). Reference: {ref}. zarr-python: a separate process reads
`zarr.open_array(level 0)[...]` into numpy with its defaults (`async.concurrency`
{zc.get('async.concurrency')}, `threading.max_workers` {zc.get('threading.max_workers')}:
unset, a pool of one thread per core for the codecs), after one read of the other store's smallest level;
cold drops the page cache before each read, warm follows one untimed read. *Tessera (Rust
client)*: Tessera's own client, `tessera get ID -o /dev/null` (`--no-mmap` for do_get),
timed end to end (process start included) with its CPU from `wait4`; cold is a new server
with an empty cache and a dropped page cache per repetition. *cold-cache, store in page
cache*: Tessera's cold rows again without the page-cache drop (the store's files in
memory, the segment cache empty). Client CPU is the reading process's `getrusage` (all
threads) per read. MB/s is decoded bytes / wall time."""


def section(res, args, cold_reps, warm_reps) -> str:
    return f"""{SECTION}

(Issue 30, decision 0030; generated by `benches/zarr.py`, which replaces this section on
each run.)

{method(res, args, cold_reps, warm_reps)}

{table(res)}

*Tessera / this*: the ratio of the medians of Tessera's row (biopb client) of the same
store, state and route (do_get for zarr-python) to this row's; below 1, Tessera through
the biopb client is faster.

**The issue's goals** (cold ≥ 3× faster than biopb's server; cold no slower than
zarr-python with all cores; warm as for `.npy`):

{ratios(res)}

**CPU per GiB decoded** (server CPU of one read / decoded GiB; the machine has
{os.cpu_count()} cores, so a read that keeps both busy takes about half its CPU time in wall time):

{cpu_per_gib(res)}
"""


# --------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="a 128 MiB volume, 2 cold and 3 warm repetitions")
    ap.add_argument("--shape", default="64,4096,2048", help="level-0 shape z,y,x (default 1 GiB of u16)")
    ap.add_argument("--cold-reps", type=int, default=3)
    ap.add_argument("--warm-reps", type=int, default=5)
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "tessera"))
    ap.add_argument("--work", default="/tmp/tessera-zarr-bench-work", help="stores, caches, results.json")
    ap.add_argument("--no-reference", action="store_true", help="skip biopb's own server")
    ap.add_argument("--phases", default="tessera,zarr,npy,biopb,rust,cached-source",
                    help="comma list of the phases to run (tessera, zarr, npy, biopb, rust, cached-source); a subset adds "
                         "its rows to WORK's results.json of an earlier run")
    ap.add_argument("--no-doc", action="store_true", help="print only; do not write the docs")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "guides" / "performance.md"))
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: write the docs from WORK's results.json of an earlier run")
    ap.add_argument("--measurement", default=None,
                    help="also write the section as a decision's Measurement to this file "
                         "(decisions are not rewritten: 0030 keeps the figures of its day)")
    args = ap.parse_args()
    if args.worker:
        worker_main(json.loads(args.worker))
        return
    if args.report_only:
        work = pathlib.Path(args.work) / ("quick" if args.quick else "full")
        saved = json.loads((work / "results.json").read_text())
        res = fb.Results(work / "results.json")
        res.rows, res.info = saved["rows"], saved["info"]
        report(res, args, res.info["cold_reps"], res.info["warm_reps"])
        return
    import zarr

    shape = (16, 2048, 2048) if args.quick else tuple(int(x) for x in args.shape.split(","))
    cold_reps, warm_reps = (2, 3) if args.quick else (args.cold_reps, args.warm_reps)
    work = pathlib.Path(args.work) / ("quick" if args.quick else "full")
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    print("stores:", flush=True)
    stores = write_stores(data, work / "state", shape)
    res = fb.Results(work / "results.json")
    phases = set(args.phases.split(","))
    if phases != {"tessera", "zarr", "npy", "biopb", "rust", "cached-source"} and res.path.exists():
        saved = json.loads(res.path.read_text())
        res.rows, old_info = saved["rows"], saved["info"]
    else:
        old_info = {}
    shapes = level_shapes(shape)
    res.info = {**old_info, **{
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "binary": fb.binary_note(args.bin), "shapes": shapes, "zarr_version": zarr.__version__,
        "level0_bytes": shape[0] * shape[1] * shape[2] * 2,
        "store_bytes": {n: fb.du_bytes(p) for n, p in stores.items()},
        "level0_store_bytes": {n: fb.du_bytes(p / "0") for n, p in stores.items()},
        "cold_reps": cold_reps, "warm_reps": warm_reps,
    }}
    if "tessera" in phases:
        print("Tessera:", flush=True)
        tessera_phase(args, data, work, res, cold_reps, warm_reps)
    if "zarr" in phases:
        print("zarr-python:", flush=True)
        zarr_phase(data, res, cold_reps, warm_reps)
    if "cached-source" in phases:
        print("Tessera, empty cache, store in the page cache:", flush=True)
        cached_source_phase(args, data, work, res, cold_reps)
    if "rust" in phases:
        print("Tessera, Rust client:", flush=True)
        rust_phase(args, data, work, res, cold_reps, warm_reps)
    if "npy" in phases:
        print("Tessera, the same values as .npy:", flush=True)
        npy_phase(args, data, work, res, warm_reps)
    if "biopb" in phases and not args.no_reference:
        print("biopb server:", flush=True)
        try:
            reference_phase(data, work, res, cold_reps, warm_reps, shapes)
        except (subprocess.CalledProcessError, RuntimeError) as e:
            res.info["reference_missing"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            print(f"  biopb server rows missing: {e}", flush=True)
    res.save()
    report(res, args, cold_reps, warm_reps)


def report(res, args, cold_reps, warm_reps):
    """Prints the table, ratios and CPU figures; writes the docs unless --no-doc."""
    print()
    print(table(res))
    print()
    print(ratios(res))
    print(cpu_per_gib(res))
    if not args.no_doc:
        text = section(res, args, cold_reps, warm_reps)
        kept = fb.write_performance(pathlib.Path(args.doc), SECTION, ANALYSIS, text)
        if args.measurement:
            m = pathlib.Path(args.measurement)
            body = text.split("\n", 1)[1].lstrip("\n")
            if kept:
                body = body.rstrip("\n") + "\n\n" + kept
            m.write_text("## Measurement\n\n" + body.rstrip("\n") + "\n")
            print(f"wrote {m}")


if __name__ == "__main__":
    main()
