#!/usr/bin/env python3
"""TIFF sources benchmark (issue 31): a tiled, Deflate-compressed u16 OME-TIFF with a
SubIFD pyramid, one run, side by side.

Writes (or reuses, by a stamp) one BigTIFF OME-TIFF of a microscopy-like u16 volume,
`(8, 8192, 8192)` by default (1 GiB decoded), 512 × 512 tiles, Adobe Deflate, with two
reduced levels in SubIFDs, and a small OME-TIFF every client reads first (its imports,
pools and connection paid before the clock). Then measures, as medians:

* the whole of level 0, cold and warm, through the unmodified biopb 0.13.0 client
  (``TensorFlightClient(loc).get_tensor(id).compute()``) over do_get
  (``BIOPB_CACHEFILE_TRANSFER_DISABLED=1``) and over the mmap fast path, from Tessera
  (``--bin``) and from biopb's own server (biopb-tensor-server 0.13.0, benches/reference/)
  serving the same folder; and ``tifffile.imread`` of the same file into numpy;
* a 512 × 512 window of one 8192² page, cold (a new server, page cache dropped), the way a
  viewer asks for it (``get_tensor(id, slice_hint=…)``), from both servers, and tifffile's
  own windowed read (``imread(selection=…)``).

Usage (from the repository root)::

    .venv/bin/python benches/tiff.py --bin target/release/tessera      # full, writes the docs
    .venv/bin/python benches/tiff.py --quick --no-doc                   # 128 MiB, fewer reps

Results are also written, as they come, to ``WORK/results.json``.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import pathlib
import resource
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
# benches/ holds zarr.py: keep it off the import path, or tifffile's `import zarr` (its
# windowed reads) would import that script instead of zarr-python.
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("tessera_format_bench", HERE / "format_bench.py")
fb = importlib.util.module_from_spec(_spec)  # what the format benchmarks share
_spec.loader.exec_module(fb)
bench = fb.bench  # run.py: workers, /proc readings, servers

median, fmt_ms, MiB, GiB, MODES = fb.median, fb.fmt_ms, fb.MiB, fb.GiB, fb.MODES
TILE = 512
LEVELS = 3
FILE_FORMAT = "tessera-tiff-bench-1"
NAME = "volume"  # the OME-TIFF's file stem: volume.ome.tif
WARMUP = "warmup"  # the small file every client reads first
SECTION = "## TIFF sources"
ANALYSIS = "### What limits it (hand-written"


# --------------------------------------------------------------------------- data


def window_of(shape):
    """The viewer's window: 512 × 512 of a middle page, off the tile grid (four tiles)."""
    z, y, x = shape
    y0, x0 = y // 2 - TILE // 2 - 96, x // 2 - TILE // 2 - 96
    return [[z // 2, z // 2 + 1], [y0, y0 + TILE], [x0, x0 + TILE]]


def write_ome_tiff(path: pathlib.Path, volume, physical=0.5):
    """`volume` (z, y, x u16) as a BigTIFF OME-TIFF: level 0 tiled and Deflate-compressed,
    LEVELS - 1 reduced levels (2 × 2 means) in each page's SubIFDs."""
    import tifffile

    levels = [volume]
    for _ in range(1, LEVELS):
        levels.append(fb.halve_yx(levels[-1]))
    opts = {"tile": (TILE, TILE), "compression": "adobe_deflate", "photometric": "minisblack"}
    tmp = path.with_name(path.name + ".partial")
    with tifffile.TiffWriter(tmp, bigtiff=True, ome=True) as tif:
        tif.write(levels[0], subifds=LEVELS - 1, metadata={
            "axes": "ZYX", "PhysicalSizeX": physical, "PhysicalSizeY": physical, "PhysicalSizeZ": 2.0,
            "PhysicalSizeXUnit": "µm", "PhysicalSizeYUnit": "µm", "PhysicalSizeZUnit": "µm"}, **opts)
        for level in levels[1:]:
            tif.write(level, subfiletype=1, **opts)
    tmp.rename(path)


def write_files(data: pathlib.Path, state: pathlib.Path, shape) -> dict:
    """Writes (or reuses) data/volume.ome.tif and data/warmup.ome.tif; returns {name: path}.

    The stamp lives in `state` (outside the served folder); a file is reused when its stamp
    matches."""
    import numpy as np

    data.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    files = {NAME: data / f"{NAME}.ome.tif", WARMUP: data / f"{WARMUP}.ome.tif"}
    want = {"format": FILE_FORMAT, "shape": list(shape), "tile": TILE, "levels": LEVELS}
    stamp = state / "files.stamp.json"
    if all(p.exists() for p in files.values()) and stamp.exists() and json.loads(stamp.read_text()) == want:
        return files
    stray = sorted(x.name for x in data.iterdir() if x.name not in {p.name for p in files.values()})
    if stray:
        raise RuntimeError(f"{data} holds more than the benchmark's files ({stray}); remove them")
    stamp.unlink(missing_ok=True)
    print(f"  writing {files[NAME]}: {shape} u16, {TILE}² tiles, Adobe Deflate, {LEVELS} levels", flush=True)
    rng = np.random.default_rng(31)
    t0 = time.perf_counter()
    volume = np.stack([fb.plane(rng, z, shape[1], shape[2], shape[0]) for z in range(shape[0])])
    write_ome_tiff(files[NAME], volume)
    write_ome_tiff(files[WARMUP], volume[:1, :TILE * 2, :TILE * 2])
    print(f"    written in {time.perf_counter() - t0:.0f} s", flush=True)
    stamp.write_text(json.dumps(want))
    return files


# --------------------------------------------------------------------------- workers


def run_own_worker(job: dict) -> dict:
    """A job of this script's own worker, in a child process with the route's environment."""
    return bench.run_worker(job, script=__file__)


def worker_main(job: dict) -> None:
    import numpy as np
    import tifffile

    out = {}
    if job["kind"] == "tifffile":
        # tifffile into numpy, the user's call, with its default threads.
        selection = tuple(slice(a, b) for a, b in job["slice"]) if job.get("slice") else None

        def read():
            if selection is None:
                return tifffile.imread(job["path"])
            return tifffile.imread(job["path"], selection=selection)

        tifffile.imread(job["warmup"])  # imports, pools, first-call costs
        times, cpus = [], []
        for _ in range(job["reps"]):
            if job["cold"]:
                out["page_cache_dropped"] = bench.drop_page_cache()
            before = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            got = read()
            times.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            out["shape"] = list(got.shape)
        out["times"], out["client_cpu"] = times, cpus
    elif job["kind"] == "cold":
        from biopb.tensor import TensorFlightClient

        client = TensorFlightClient(job["location"], cache_bytes=0)
        client.get_tensor(job["warmup"]).compute()
        out.update(fb.timed_cold_read(client, job))
    elif job["kind"] == "check":
        # One untimed read through the biopb client, compared with tifffile's.
        from biopb.tensor import TensorFlightClient

        got = TensorFlightClient(job["location"], cache_bytes=0).get_tensor(job["id"]).compute()
        want = tifffile.imread(job["path"])
        if got.size == want.size and fb.squeezed(got.shape) == fb.squeezed(want.shape):
            got = got.reshape(want.shape)  # biopb's server: OME data as TCZYX
        if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
            raise SystemExit(f"{job['id']}: read back {got.shape} {got.dtype}, not tifffile's "
                             f"{want.shape} {want.dtype} values")
        out["ok"] = True
    elif job["kind"] == "ids":
        # Tessera's ids of the benchmark's files, from its flight list.
        import pyarrow.flight as flight

        listed = sorted(f.descriptor.path[0].decode() for f in flight.FlightClient(job["location"]).list_flights()
                        if f.descriptor.path)
        out["ids"] = listed
    print(json.dumps(out))


# --------------------------------------------------------------------------- phases


def tessera_ids(server) -> dict:
    """{volume: id of level 0, warmup: id of the small file} from Tessera's flight list:
    the ids that name each file's stem (a level of it is the id, a `.`, and more)."""
    listed = run_own_worker({"kind": "ids", "location": server.location})["ids"]
    ids = {}
    for name in (NAME, WARMUP):
        mine = [i for i in listed if i.split("/")[-1].startswith(name)]
        if not mine:
            raise RuntimeError(f"Tessera lists no tensor of {name}.ome.tif: {listed}\n" + "".join(server.log[-20:]))
        ids[name] = min(mine, key=len)
    return ids


def check_with(server, files):
    def check(name, array_id, mode):
        run_own_worker({"kind": "check", "location": server.location, "id": array_id, "mode": mode,
                        "path": str(files[name])})
    return check


def cold_job(ids_of, window=None):
    """A cold read (of the window, when given) after a warm-up read of the small file."""
    def job(server, name, mode):
        ids = ids_of(server)
        return run_own_worker({"kind": "cold", "location": server.location, "id": ids[name], "mode": mode,
                               "warmup": ids[WARMUP], "cpu_pid": server.pid, "slice": window})
    return job


def server_rows(start_warm, start_cold, ids_of, files, res, reps, system, locates=None):
    """Warm whole reads, cold whole reads and cold windows of one server."""
    info = res.info
    server = start_warm()
    try:
        ids = ids_of(server)
        info.setdefault("ids", {})[system] = ids
        if system == "Tessera":
            info["tessera_grid"] = fb.tessera_grids(server)
        fb.warm_rows(server, {NAME: ids[NAME]}, info["level0_bytes"], check_with(server, files), reps["warm"],
                     res, system, locates=locates(server) if locates else None)
    finally:
        server.stop()
    fb.cold_rows(start_cold, [NAME], cold_job(ids_of), reps["cold"], res, system, info["level0_bytes"])
    fb.cold_rows(start_cold, [NAME], cold_job(ids_of, info["window"]), reps["window"], res, system,
                 info["window_bytes"], state="window cold")


def tessera_phase(args, data, files, work, res, reps):
    def start(tag):
        return lambda: fb.tessera_server(args.bin, data, work / f"tessera-{tag}-cache", work / f"tessera-{tag}-state",
                                         args.extra)

    try:
        server_rows(start("warm"), start("cold"), tessera_ids, files, res, reps, "Tessera",
                    locates=lambda s: (lambda: bench.cache_stats(s.location)["locates"]))
    finally:
        for tag in ("warm", "cold"):
            shutil.rmtree(work / f"tessera-{tag}-cache", ignore_errors=True)


def reference_phase(data, files, work, res, reps):
    ref = fb.Reference(data, work, min_sources=2)
    res.info["reference_version"] = ref.version
    shapes = {NAME: res.info["shapes"][0], WARMUP: [1, TILE * 2, TILE * 2]}

    def ids_of(server):
        return ref.ids(server, {n: f"/{p.name}" for n, p in files.items()}, shapes)

    server_rows(lambda: ref.start("warm"), lambda: ref.start("cold"), ids_of, files, res, reps, "biopb server")


def tifffile_phase(files, res, reps):
    for state, cold, n, window in (("cold", True, reps["cold"], None), ("warm", False, reps["warm"], None),
                                    ("window cold", True, reps["window"], res.info["window"])):
        job = {"kind": "tifffile", "path": str(files[NAME]), "warmup": str(files[WARMUP]), "reps": n,
               "cold": cold, "slice": window}
        if not cold:
            run_own_worker({**job, "reps": 1})
        r = run_own_worker(job)
        nbytes = res.info["window_bytes"] if window else res.info["level0_bytes"]
        row = {"times": r["times"], "client_cpu": median(r["client_cpu"]), "bytes": nbytes}
        if cold:
            row["page_cache_dropped"] = r.get("page_cache_dropped", False)
        res.add(f"{NAME} {state}, tifffile", row)


# --------------------------------------------------------------------------- report


def table(res) -> str:
    lines = ["| read | system | median ms | MB/s | server CPU s | client CPU s | Tessera / this (time) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for state in ("cold", "warm", "window cold"):
        for mode in (*MODES, None):
            for system in (("Tessera", "biopb server") if mode else ("tifffile",)):
                label = f"{NAME} {state} {mode}, {system}" if mode else f"{NAME} {state}, {system}"
                row = res.rows.get(label)
                if not row:
                    continue
                t = median(row["times"])
                ours = res.rows.get(f"{NAME} {state} {mode or 'doget'}, Tessera")
                ratio = "" if system == "Tessera" or not ours else f"{median(ours['times']) / t:.2f}×"
                cpu = row.get("server_cpu")
                route = {"doget": "do_get", "mmap": "mmap", None: "into numpy"}[mode]
                what = "512² window" if state.startswith("window") else "level 0"
                lines.append(f"| {what} {state.replace('window ', '')} {route} | {system} | {fmt_ms(t)} | "
                             f"{row['bytes'] / t / 1e6:.0f} | {'' if cpu is None else f'{cpu:.2f}'} | "
                             f"{row['client_cpu']:.2f} | {ratio} |")
    return "\n".join(lines)


def goals(res) -> str:
    """The issue's goals, one line each: cold ≥ 3× faster than biopb's server; a cold 512²
    window ≤ 20 ms."""
    out = []
    for mode in MODES:
        ours = res.rows.get(f"{NAME} cold {mode}, Tessera")
        theirs = res.rows.get(f"{NAME} cold {mode}, biopb server")
        tf = res.rows.get(f"{NAME} cold, tifffile")
        if ours:
            t = median(ours["times"])
            parts = []
            if theirs:
                parts.append(f"biopb server / Tessera **{median(theirs['times']) / t:.2f}×** (goal ≥ 3×)")
            if tf:
                parts.append(f"Tessera / tifffile **{t / median(tf['times']):.2f}×**")
            out.append(f"- level 0 cold {mode}: " + "; ".join(parts))
        win = res.rows.get(f"{NAME} window cold {mode}, Tessera")
        if win:
            t = median(win["times"])
            ref = res.rows.get(f"{NAME} window cold {mode}, biopb server")
            extra = f"; biopb server {fmt_ms(median(ref['times']))} ms" if ref else ""
            out.append(f"- 512² window cold {mode}: Tessera **{fmt_ms(t)} ms** (goal ≤ 20 ms){extra}")
    return "\n".join(out)


def section(res, args) -> str:
    i = res.info
    shapes = " → ".join(str(tuple(s)) for s in i["shapes"])
    dropped = all(r.get("page_cache_dropped", True) for label, r in res.rows.items() if " cold " in label)
    ref = (f"biopb's own server ({i['reference_version']}, installed by `benches/reference/setup.sh`) "
           "serving the same folder (it reads OME-TIFF natively: level 0 through tifffile's page-wise "
           "zarr store); its ids come from its catalog"
           if "reference_version" in i else
           f"**biopb's server rows are missing**: {i.get('reference_missing', 'not run (--no-reference)')}")
    grid = i.get("tessera_grid", {})
    return f"""{SECTION}

(Issue 31, decision 0032; generated by `benches/tiff.py`, which replaces this section on
each run.)

Generated on {i['when']} (`--bin {args.bin}`). **Machine:** {bench.machine()}. Shared
with other engineers' builds: compare rows of this run with each other only.

**Binary.** {i['binary']}

**Data.** One BigTIFF OME-TIFF written by tifffile {i['tifffile_version']}: a microscopy-like
u16 volume (benches/format_bench.py's `plane`: haze, 24 cells, a focus curve, shot and read
noise), levels {shapes} (2 × 2 means; levels 1 and 2 in each page's SubIFDs, as OME-TIFF
pyramids are stored), {TILE} × {TILE} tiles, Adobe Deflate, {i['file_bytes'] / MiB:.0f} MiB on
disk ({i['level0_bytes'] / i['file_bytes']:.2f}:1 over all levels). Tessera's cells: {grid}.
Whole reads read level 0, {i['level0_bytes'] / GiB:.2f} GiB decoded; the window is
`{i['window']}` (start, stop per axis: four tiles of one page).

**Method.** Medians of {i['reps']['cold']} cold, {i['reps']['warm']} warm and {i['reps']['window']}
window repetitions, all rows in one run, read by the unmodified `biopb==0.13.0` client in
benches/run.py's worker processes: *do_get* sets `BIOPB_CACHEFILE_TRANSFER_DISABLED=1`,
*mmap* leaves the fast path on (Tessera's `locates` counter proves the route). *Warm*: one
untimed read per route compared value for value with `tifffile.imread`, then the timed reads.
*Cold*: a new server with an empty cache per repetition; the client first reads a small
OME-TIFF in the same folder (imports, pools, connection paid), then
{'drops the page cache' if dropped else 'tries to drop the page cache but was **not permitted**'},
plans, and times the read (`get_tensor(id).compute()`; the window:
`get_tensor(id, slice_hint=…).compute()`); server CPU is that of the timed read. Reference:
{ref}. tifffile: `imread(path)` (window: `imread(path, selection=…)`) in a separate process
with its default threads, after a read of the small file. MB/s is decoded bytes / wall.

{table(res)}

*Tessera / this*: Tessera's median over this row's, same read and route (do_get for
tifffile); below 1, Tessera is faster.

**The issue's goals:**

{goals(res)}
"""


# --------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="(2, 4096, 4096): 64 MiB, fewer repetitions")
    ap.add_argument("--shape", default="8,8192,8192", help="level-0 shape z,y,x (default 1 GiB of u16)")
    ap.add_argument("--cold-reps", type=int, default=3)
    ap.add_argument("--warm-reps", type=int, default=5)
    ap.add_argument("--window-reps", type=int, default=5)
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "tessera"))
    ap.add_argument("--work", default="/tmp/tessera-tiff-bench-work", help="files, caches, results.json")
    ap.add_argument("--no-reference", action="store_true", help="skip biopb's own server")
    ap.add_argument("--extra", action="append", default=[],
                    help="an argument added to `tessera serve` (repeatable), e.g. --extra=--read-ahead=0")
    ap.add_argument("--phases", default="tessera,tifffile,biopb",
                    help="comma list of the phases to run (tessera, tifffile, biopb); a subset adds its rows "
                         "to WORK's results.json of an earlier run")
    ap.add_argument("--no-doc", action="store_true", help="print only; do not write the docs")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "guides" / "performance.md"))
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: write the docs from WORK's results.json of an earlier run")
    args = ap.parse_args()
    if args.worker:
        worker_main(json.loads(args.worker))
        return
    work = pathlib.Path(args.work) / ("quick" if args.quick else "full")
    work.mkdir(parents=True, exist_ok=True)
    res = fb.Results(work / "results.json")
    if args.report_only:
        res.load()
        report(res, args)
        return
    import numpy as np
    import tifffile

    shape = (2, 4096, 4096) if args.quick else tuple(int(x) for x in args.shape.split(","))
    reps = ({"cold": 2, "warm": 3, "window": 3} if args.quick else
            {"cold": args.cold_reps, "warm": args.warm_reps, "window": args.window_reps})
    data = work / "data"
    print("files:", flush=True)
    files = write_files(data, work / "state", shape)
    window = window_of(shape)
    phases = set(args.phases.split(","))
    if phases != {"tessera", "tifffile", "biopb"} and res.path.exists():
        res.load()
    res.info = {**res.info, **{
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        **({"binary": fb.binary_note(args.bin)} if "tessera" in phases else {}),
        "tifffile_version": tifffile.__version__,
        "shapes": [(shape[0], shape[1] >> k, shape[2] >> k) for k in range(LEVELS)],
        "level0_bytes": int(np.prod(shape)) * 2, "window": window,
        "window_bytes": int(np.prod([b - a for a, b in window])) * 2,
        "file_bytes": fb.du_bytes(files[NAME]), "reps": reps,
    }}
    if "tessera" in phases:
        print("Tessera:", flush=True)
        tessera_phase(args, data, files, work, res, reps)
    if "tifffile" in phases:
        print("tifffile:", flush=True)
        tifffile_phase(files, res, reps)
    if "biopb" in phases and not args.no_reference:
        print("biopb server:", flush=True)
        try:
            reference_phase(data, files, work, res, reps)
        except (subprocess.CalledProcessError, RuntimeError) as e:
            res.info["reference_missing"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            print(f"  biopb server rows missing: {e}", flush=True)
    res.save()
    report(res, args)


def report(res, args):
    """Prints the table and the goals; writes the docs unless --no-doc."""
    print()
    print(table(res))
    print()
    print(goals(res))
    if not args.no_doc:
        fb.write_performance(pathlib.Path(args.doc), SECTION, ANALYSIS, section(res, args))


if __name__ == "__main__":
    sys.exit(main())
