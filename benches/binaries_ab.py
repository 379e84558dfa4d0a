#!/usr/bin/env python3
"""Warm reads of two Tessera binaries side by side: the biopb client over mmap and do_get,
a catalog SQL query, and `tessera get` over mmap and do_get, beside `np.load`.

    .venv/bin/python benches/binaries_ab.py BASELINE_BIN CANDIDATE_BIN [--reps 15]

Each binary serves the w256 and w64 workloads of `benches/run.py` from its own fresh cache;
after one verified read of each, every repetition times each measurement once per binary,
in ABBA order (which binary goes first alternates: on this VM a run's position in the
sequence can matter more than the binary). A biopb row is a new client process's second and
third reads (its first, which pays the process's first-call costs, is not timed). `tessera
get` runs as its own CLI against its own server, writing the `.npy` to /dev/null; its bytes
are compared with numpy once first. `np.load` is timed the same way, in a new process, its
first load untimed, once per repetition beside the reads. Prints medians and every sample.
"""

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run  # noqa: E402  (benches/run.py: workloads, server launcher, client workers)

QUERY = "SELECT array_id, count(*) AS n FROM tensors GROUP BY array_id ORDER BY array_id"


def catalog_query_seconds(location: str, reps: int) -> list:
    """`reps` timed catalog queries through the biopb client (one untimed first)."""
    code = (
        "import json, sys, time\n"
        "from biopb.tensor import TensorFlightClient\n"
        "c = TensorFlightClient(sys.argv[1])\n"
        "c.query(sys.argv[2])\n"
        "ts = []\n"
        "for _ in range(int(sys.argv[3])):\n"
        "    t = time.perf_counter(); c.query(sys.argv[2]); ts.append(time.perf_counter() - t)\n"
        "print(json.dumps(ts))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, location, QUERY, str(reps)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def np_load_seconds(path: pathlib.Path) -> list:
    """Two timed `np.load`s of `path` in a new process, after one untimed (as a client
    process is timed: not the controller, whose own heap has held every array before)."""
    code = (
        "import json, sys, time\n"
        "import numpy as np\n"
        "np.load(sys.argv[1])\n"
        "ts = []\n"
        "for _ in range(2):\n"
        "    t = time.perf_counter(); a = np.load(sys.argv[1]); ts.append(time.perf_counter() - t)\n"
        "    del a\n"
        "print(json.dumps(ts))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def tessera_get_seconds(binary: str, location: str, name: str, mode: str) -> float:
    cmd = [binary, "get", location, name, "-o", "/dev/null"] + (["--no-mmap"] if mode == "doget" else [])
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def check_get(binary: str, location: str, name: str, path: pathlib.Path) -> None:
    import numpy as np

    out = pathlib.Path("/dev/shm") / f"binaries-ab-{name}.npy"
    try:
        subprocess.run([binary, "get", location, name, "-o", str(out)], check=True, capture_output=True)
        if not np.array_equal(np.load(out), np.load(path, mmap_mode="r")):
            raise SystemExit(f"{binary} get {name} read back different bytes")
    finally:
        out.unlink(missing_ok=True)


def main():
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("baseline")
    ap.add_argument("candidate")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--work", default="/tmp/tessera-bench")
    args = ap.parse_args()
    work = pathlib.Path(args.work)
    files = {k: v for k, v in run.make_workloads(work, None, 0).items() if k in ("w256", "w64")}
    bins = {"baseline": args.baseline, "candidate": args.candidate}
    servers = {}
    samples = {}
    try:
        for name, binary in bins.items():
            cache = work / f"ab-{name}-cache"
            shutil.rmtree(cache, ignore_errors=True)
            servers[name] = run.Server(binary, list(files.values()), cache)
            for array_id, path in files.items():
                for mode in ("mmap", "doget"):
                    run.run_worker({"kind": "read", "location": servers[name].location,
                                    "ids": [array_id], "paths": [str(path)], "mode": mode, "reps": 1})
                check_get(binary, servers[name].location, array_id, path)
        for rep in range(args.reps):
            order = list(bins) if rep % 2 == 0 else list(bins)[::-1]
            for array_id, path in files.items():
                for mode in ("mmap", "doget"):
                    for name in order:
                        r = run.run_worker({"kind": "read", "location": servers[name].location,
                                            "ids": [array_id], "mode": mode, "reps": 3})
                        samples.setdefault((f"{array_id} biopb {mode}", name), []).extend(r["times"][1:])
                        t = tessera_get_seconds(bins[name], servers[name].location, array_id, mode)
                        samples.setdefault((f"{array_id} tessera get {mode}", name), []).append(t)
                samples.setdefault((f"{array_id} np.load", "-"), []).extend(np_load_seconds(path))
            for name in order:
                samples.setdefault(("catalog query", name), []).append(
                    statistics.median(catalog_query_seconds(servers[name].location, 5)))
            print(f"rep {rep + 1}/{args.reps} done", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    for (what, name), ts in sorted(samples.items()):
        print(f"  {what:24s} {name:9s} " + " ".join(f"{t * 1e3:.1f}" for t in sorted(ts)))
    print("| measurement | baseline ms | candidate ms | candidate / baseline |")
    print("|---|---:|---:|---:|")
    for what in sorted({w for w, _ in samples}):
        if (what, "-") in samples:
            print(f"| {what} | {statistics.median(samples[(what, '-')]) * 1e3:.1f} | | |")
            continue
        b = statistics.median(samples[(what, "baseline")]) * 1e3
        c = statistics.median(samples[(what, "candidate")]) * 1e3
        print(f"| {what} | {b:.1f} | {c:.1f} | {c / b:.2f}× |")


if __name__ == "__main__":
    main()
