#!/usr/bin/env python3
"""The first read of a fresh biopb client process on a fresh Tessera server, for two server
binaries side by side (interleaved repetitions, same workload, same run).

    .venv/bin/python benches/first_read_ab.py BASELINE_BIN CANDIDATE_BIN [--reps 9]

Each repetition starts each binary on an empty cache directory (source in the page cache)
and times one `TensorFlightClient(...).get_tensor(id).compute()` of the 256 MiB u16 tensor
in a new process, over mmap and over do_get, as `benches/run.py`'s "first read of a fresh
process" rows do: on the fresh server ("cold"), and on a server another process has read
the tensor from once ("warm"). `--only fine/mmap` times the mapped first read on a server
restarted over a cache that holds the tensor on the fine grid only (a server with
`--loopback-plans socket` read it once over do_get first: what socket readers leave behind),
so its coarse cells are decoded again or cut from the fine ones (decision 0024). The bytes
are compared with numpy. Prints medians, the candidate/baseline ratio and each server's CPU
per read.
"""

import argparse
import pathlib
import shutil
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run  # noqa: E402  (benches/run.py: workloads, server launcher, client workers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("baseline")
    ap.add_argument("candidate")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--work", default="/tmp/tessera-bench")
    ap.add_argument("--only", help="one case, e.g. cold/doget")
    args = ap.parse_args()
    work = pathlib.Path(args.work)
    files = run.make_workloads(work, None, 0)
    path = files["w256"]
    bins = {"baseline": args.baseline, "candidate": args.candidate}
    cases = [(state, mode) for state in ("cold", "warm") for mode in ("mmap", "doget")]
    if args.only:
        cases = [tuple(args.only.split("/"))]
        if cases[0][0] not in ("cold", "warm", "fine"):
            ap.error(f"--only {args.only}: the state is cold, warm or fine")
    times = {(b, c): [] for b in bins for c in cases}
    cpus = {(b, c): [] for b in bins for c in cases}
    cache = work / "ab-cache"
    for rep in range(args.reps):
        # ABBA order: which binary runs first alternates, so an effect of the position in
        # the sequence (seen here: the run after another one's cache was deleted is slow or
        # fast as a block) falls on both.
        order = list(bins.items()) if rep % 2 == 0 else list(bins.items())[::-1]
        for state, mode in cases:
            for name, binary in order:
                shutil.rmtree(cache, ignore_errors=True)
                if state == "fine":
                    first = run.Server(binary, [path], cache, ("--loopback-plans", "socket"))
                    try:
                        run.run_worker({"kind": "read", "location": first.location, "ids": ["w256"],
                                        "mode": "doget", "reps": 1})
                    finally:
                        first.stop()
                server = run.Server(binary, [path], cache)
                try:
                    if state == "warm":
                        run.run_worker({"kind": "read", "location": server.location, "ids": ["w256"],
                                        "mode": mode, "reps": 1})
                    r = run.run_worker({"kind": "first", "location": server.location, "id": "w256",
                                        "path": str(path), "mode": mode, "cpu_pid": server.pid})
                finally:
                    server.stop()
                times[(name, (state, mode))] += r["times"]
                cpus[(name, (state, mode))].append(r["server_cpu"])
        print(f"rep {rep + 1}/{args.reps} done", flush=True)
    shutil.rmtree(cache, ignore_errors=True)
    for (name, case), ts in sorted(times.items()):
        print(f"  {name:9s} {case[0]} {case[1]:5s}: " + " ".join(f"{t * 1e3:.0f}" for t in sorted(ts)))
    print("| first read of a fresh process (w256) | baseline ms | candidate ms | candidate / baseline "
          "| server CPU ms, baseline | candidate |")
    print("|---|---:|---:|---:|---:|---:|")
    for case in cases:
        b = run.median(times[("baseline", case)]) * 1e3
        c = run.median(times[("candidate", case)]) * 1e3
        print(f"| {case[0]} server, {case[1]} | {b:.1f} | {c:.1f} | {c / b:.2f}× "
              f"| {run.median(cpus[('baseline', case)]) * 1e3:.0f} "
              f"| {run.median(cpus[('candidate', case)]) * 1e3:.0f} |")


if __name__ == "__main__":
    main()
