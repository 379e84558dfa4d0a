#!/usr/bin/env python3
"""First plans of loopback readers (issue 33, item 4; docs/decisions/0041): a fresh biopb
0.13.0 client process reads a 256 MiB u16 tensor of small planes (256 × 512 × 1024, so
Tessera's coarse grid would cut it into 64 MiB cells and its fine grid into 8 MiB ones) from
a fresh server, once (the first plan: "cold", the server has decoded nothing) and then
three more times ("warm", median). Per read: wall time, the client's CPU (user + system,
all threads) and its minor page faults. Servers: Tessera in one or more configurations and
biopb's own server 0.13.0 (benches/reference/setup.sh) on the same bytes as uncompressed
zarr v2 in 8 MiB chunks. Modes: `doget` (`BIOPB_CACHEFILE_TRANSFER_DISABLED=1`, a client
that never maps) and `mmap` (the client's defaults: it maps what it can locate). Rounds are
interleaved (the order of the servers rotates each round); medians per row, and each
Tessera row's ratio to biopb's server in the same mode.

    .venv/bin/python benches/first_plan.py [--bin target/debug/tessera] [--rounds 5]
        [--config NAME[@BINARY]='--mapped-chunk-target 16MiB' ...] [--modes doget,mmap] [--no-reference]
"""
import argparse
import json
import pathlib
import shlex
import shutil
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run  # noqa: E402  (benches/run.py: server launcher, client workers, reference helpers)

SHAPE = (256, 512, 1024)
WARM_READS = 3


def workload(work: pathlib.Path) -> pathlib.Path:
    import numpy as np

    work.mkdir(parents=True, exist_ok=True)
    path = work / "s256.npy"
    if path.exists():
        try:
            if np.load(path, mmap_mode="r").shape == SHAPE:
                return path
        except ValueError:
            pass
    print(f"  making {path} {SHAPE} uint16", flush=True)
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=SHAPE)
    rng = np.random.default_rng(41)
    for i in range(SHAPE[0]):
        arr[i] = rng.integers(0, 1 << 16, SHAPE[1:], dtype=np.uint16)
    arr.flush()
    del arr
    return path


def session(job: dict) -> None:
    """Worker: one client process, one untimed plan (connection and thread pools), then the
    timed reads; the bytes are compared with numpy after the clock."""
    import resource

    import numpy as np
    from biopb.tensor import TensorFlightClient

    client = TensorFlightClient(job["location"], cache_bytes=0)
    client.get_tensor(job["id"])  # the plan alone: no chunk is read, nothing is learned
    reads = []
    got = None
    for _ in range(1 + WARM_READS):
        before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        got = client.get_tensor(job["id"]).compute()
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_SELF)
        reads.append({
            "wall": wall,
            "cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
            "minflt": after.ru_minflt - before.ru_minflt,
        })
        del got
    got = client.get_tensor(job["id"]).compute()
    want = np.load(job["path"], mmap_mode="r")
    if got.shape != want.shape or not np.array_equal(got, want):
        raise SystemExit(f"{job['id']} read back different bytes")
    print(json.dumps({"reads": reads}))


def reference_id(location: str, tries=40) -> str:
    for _ in range(tries):
        sources = run.run_worker({"kind": "catalog", "location": location})["sources"]
        for src in sources:
            if (src.get("source_url") or "").rstrip("/").endswith("/s256.zarr") \
                    and tuple(src.get("shape") or ()) == SHAPE:
                return src["source_id"]
        time.sleep(0.5)
    raise RuntimeError(f"biopb server does not list s256.zarr: {sources}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(run.ROOT / "target" / "debug" / "tessera"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default="/tmp/tessera-bench-firstplan")
    ap.add_argument("--config", action="append", default=[],
                    help="NAME[@BINARY]=ARGS: a Tessera configuration (extra serve arguments, "
                         "and a binary other than --bin); default: one named 'tessera' with none")
    ap.add_argument("--modes", default="doget,mmap")
    ap.add_argument("--no-reference", action="store_true")
    args = ap.parse_args()
    work = pathlib.Path(args.work)
    path = workload(work)
    configs = {}
    for spec in args.config or ["tessera="]:
        name, _, extra = spec.partition("=")
        name, _, binary = name.partition("@")
        configs[name] = ("tessera", (binary or args.bin, shlex.split(extra)))
    if not args.no_reference:
        ref = run.reference_module()
        configs["biopb"] = ("biopb", ref.ensure_installed())
        data = work / "reference-zarr"
        data.mkdir(exist_ok=True)
        ref.write_zarr_v2(path, data / "s256.zarr", 8 * run.MiB, work / "reference-state")
    modes = args.modes.split(",")
    results = {(c, m): [] for c in configs for m in modes}
    names = list(configs)
    for rnd in range(args.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for mode in modes:
            for name in order:
                kind, extra = configs[name]
                cache = work / "cache"
                scratch = work / "ref-scratch"
                shutil.rmtree(cache, ignore_errors=True)
                if kind == "tessera":
                    server = run.Server(extra[0], [path], cache, extra[1])
                    array_id = "s256"
                else:
                    shutil.rmtree(scratch, ignore_errors=True)
                    server = ref.ReferenceServer(extra, data, scratch, cache, min_sources=1)
                    array_id = reference_id(server.location)
                try:
                    r = run.run_worker({"kind": "session", "location": server.location, "id": array_id,
                                        "path": str(path), "mode": mode}, script=__file__)
                finally:
                    server.stop()
                results[(name, mode)].append(r["reads"])
        print(f"round {rnd + 1}/{args.rounds} done", flush=True)

    def row(reads, which, key):
        if which == "cold":
            return statistics.median(r[0][key] for r in reads)
        return statistics.median(statistics.median(x[key] for x in r[1:]) for r in reads)

    print(f"\n{SHAPE} u16, {args.rounds} interleaved rounds, medians "
          f"(warm: median of {WARM_READS} reads per session)")
    print("| reader, read | server | wall ms | client CPU ms | client minor faults | "
          "wall / biopb | CPU / biopb |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for mode in modes:
        for which in ("cold", "warm"):
            base = results.get(("biopb", mode))
            for name in names:
                reads = results[(name, mode)]
                wall, cpu, flt = (row(reads, which, k) for k in ("wall", "cpu", "minflt"))
                ratio = ""
                if base and name != "biopb":
                    ratio = (f"{wall / row(base, which, 'wall'):.2f}× | "
                             f"{cpu / row(base, which, 'cpu'):.2f}×")
                else:
                    ratio = " | "
                print(f"| {mode} {which} | {name} | {wall * 1e3:.1f} | {cpu * 1e3:.1f} | {flt:.0f} | {ratio} |")
    raw = work / "first_plan.json"
    raw.write_text(json.dumps({f"{c}/{m}": v for (c, m), v in results.items()}, indent=1))
    print(f"raw: {raw}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        session(json.loads(sys.argv[2]))
    else:
        main()
