"""What the format benchmarks (benches/zarr.py, benches/tiff.py) share: the test image,
results kept as they come, warm and cold rows through the biopb client, the servers
(Tessera, biopb's own), and the performance guide's section rewritten in place.

Each format script keeps its data writer, its own worker jobs (its reader's check and its
library's reads) and its report; run.py's workers, /proc readings and launchers are used
through `bench` (run.py loaded by its path).
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import time

HERE = pathlib.Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("tessera_bench_run", HERE / "run.py")
bench = importlib.util.module_from_spec(_spec)  # run.py: workers, /proc readings, servers
_spec.loader.exec_module(bench)

median, fmt_ms, MiB = bench.median, bench.fmt_ms, bench.MiB
GiB = 1 << 30
MODES = ("doget", "mmap")


def plane(rng, z, y, x, depth):
    """One microscopy-like u16 plane: dark offset, smooth blobs (cells), background haze,
    a z-dependent focus, and shot plus read noise. Not random bytes: it compresses like
    a real image (the noise bits do not)."""
    import numpy as np

    yy = np.linspace(0, 1, y, dtype=np.float32)[:, None]
    xx = np.linspace(0, 1, x, dtype=np.float32)[None, :]
    focus = float(np.exp(-((z - depth / 2) / (depth / 3)) ** 2))
    sig = np.full((y, x), 100.0, dtype=np.float32)
    sig += 300.0 * (0.6 + 0.4 * np.sin(3 * yy + 1.7) * np.cos(2 * xx))  # haze
    blob_rng = np.random.default_rng(1234)  # the same cells on every plane
    for _ in range(24):
        cy, cx = blob_rng.random(2)
        r = 0.01 + 0.04 * blob_rng.random()
        amp = 1500.0 * focus * (0.3 + blob_rng.random())
        gy = np.exp(-((yy - cy) / r) ** 2)
        gx = np.exp(-((xx - cx) / r) ** 2)
        sig += amp * (gy * gx)
    sig += np.sqrt(sig) * rng.standard_normal((y, x), dtype=np.float32) + 3.0 * rng.standard_normal(
        (y, x), dtype=np.float32)
    return np.clip(sig, 0, 65535).astype(np.uint16)


def halve_yx(block):
    """The next pyramid level: 2 × 2 means in the last two axes, rounded."""
    import numpy as np

    b = block.astype(np.uint32)
    return ((b[..., 0::2, 0::2] + b[..., 1::2, 0::2] + b[..., 0::2, 1::2] + b[..., 1::2, 1::2] + 2) // 4
            ).astype(np.uint16)


def du_bytes(path: pathlib.Path) -> int:
    """Bytes on disk of a file or of every file under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Results:
    """Rows by label, saved to results.json after each one."""

    def __init__(self, path: pathlib.Path):
        self.path, self.rows, self.info = path, {}, {}

    def add(self, label, row):
        self.rows[label] = row
        self.save()
        t = median(row["times"])
        cpu = row.get("server_cpu")
        print(f"  {label:44s} median {fmt_ms(t):>8s} ms  {row['bytes'] / t / 1e6:7.0f} MB/s"
              + ("" if cpu is None else f"  server CPU {cpu * 1e3:7.0f} ms")
              + f"  client CPU {row['client_cpu'] * 1e3:7.0f} ms", flush=True)

    def save(self):
        self.path.write_text(json.dumps({"info": self.info, "rows": self.rows}, indent=1))

    def load(self):
        saved = json.loads(self.path.read_text())
        self.rows, self.info = saved["rows"], saved["info"]


def read_job(location, array_id, mode, reps, **extra):
    """run.py's timed read of one tensor through the biopb client."""
    return {"kind": "read", "location": location, "ids": [array_id], "mode": mode, "reps": reps, **extra}


def warm_rows(server, ids, nbytes, check, reps, res, system, locates=None):
    """Per name in `ids` ({name: array id}): `check(name, array_id, mode)` (one untimed
    read compared with the format's own reader), then `reps` timed reads per route of
    `nbytes` decoded bytes. With `locates` (Tessera's counter), each route is proven."""
    for name, array_id in ids.items():
        for mode in MODES:
            check(name, array_id, mode)
            before = locates() if locates else None
            cpu0 = server.cpu_seconds()
            r = bench.run_worker(read_job(server.location, array_id, mode, reps))
            cpu = (server.cpu_seconds() - cpu0) / max(reps, 1)
            row = {"times": r["times"], "server_cpu": cpu, "client_cpu": r["client_cpu"], "bytes": nbytes}
            if locates:
                row["locates"] = locates() - before
                if (mode == "mmap") != (row["locates"] > 0):
                    raise RuntimeError(f"{system} {name} warm {mode}: {row['locates']} chunk_locate calls")
            res.add(f"{name} warm {mode}, {system}", row)


def cold_rows(start, names, cold_job, reps, res, system, nbytes, state="cold"):
    """Per name and route: a new server per repetition (`start()`, empty cache), and one
    cold read timed by the format script's worker (`cold_job(server, name, mode)` runs it
    and returns its answer: times, server_cpu, client_cpu, page_cache_dropped)."""
    for name in names:
        for mode in MODES:
            times, scpu, ccpu, dropped = [], [], [], True
            for _ in range(reps):
                server = start()
                try:
                    r = cold_job(server, name, mode)
                finally:
                    server.stop()
                times += r["times"]
                scpu.append(r["server_cpu"])
                ccpu.append(r["client_cpu"])
                dropped = dropped and r.get("page_cache_dropped", False)
            res.add(f"{name} {state} {mode}, {system}",
                    {"times": times, "server_cpu": median(scpu), "client_cpu": median(ccpu),
                     "bytes": nbytes, "page_cache_dropped": dropped})


def timed_cold_read(client, job) -> dict:
    """In a worker: the client has read something else already (imports, pools and the
    connection paid); drops the page cache, plans, and times one read of `job["id"]`
    (with `job["slice"]`, a list of [start, stop] per axis, when given)."""
    import resource

    out = {"page_cache_dropped": bench.drop_page_cache() if job.get("drop", True) else False}
    planned = client.get_tensor(job["id"])
    hint = None
    if job.get("slice"):
        # A server that adds leading axes of one (biopb's: OME data as TCZYX) gets them whole.
        lead = planned.ndim - len(job["slice"])
        hint = tuple([slice(0, 1)] * lead + [slice(a, b) for a, b in job["slice"]])
        planned = client.get_tensor(job["id"], slice_hint=hint)
    del planned
    cpu0 = bench.process_cpu_seconds(job["cpu_pid"])
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    got = client.get_tensor(job["id"], slice_hint=hint).compute()
    out["times"] = [time.perf_counter() - t0]
    after = resource.getrusage(resource.RUSAGE_SELF)
    out["server_cpu"] = bench.process_cpu_seconds(job["cpu_pid"]) - cpu0
    out["client_cpu"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    out["shape"] = list(got.shape)
    return out


def tessera_server(binary, data, cache, state, extra=()):
    """`tessera serve DATA` with an empty cache directory and an empty state directory (the
    state directory remembers which path holds an id: a shared one could rename sources)."""
    for d in (cache, state):
        shutil.rmtree(d, ignore_errors=True)
    return bench.Server(binary, [data], cache, ["--state-dir", state, *extra])


def tessera_grids(server) -> dict:
    """{source id: its chunk shape} from the server's start-up log."""
    grids = {}
    for line in server.log:
        m = re.search(r"serving source source_id=(\S+) .*chunk=(\[[^\]]*\])", line)
        if m:
            grids[m.group(1)] = json.loads(m.group(2))
    return grids


class Reference:
    """biopb's own server (benches/reference/), installed on first use, serving `data`."""

    def __init__(self, data, work, min_sources):
        self.ref = bench.reference_module()
        self.binary = self.ref.ensure_installed()
        out = subprocess.run([str(self.binary), "version"], capture_output=True, text=True).stdout
        self.version = " ".join(out.split()) or self.ref.VERSION
        self.data, self.work, self.min_sources = data, work, min_sources

    def start(self, tag):
        """A fresh server (scratch and cache emptied) with run.py's /proc readings."""
        scratch, cache = self.work / f"ref-{tag}", self.work / f"ref-{tag}-cache"
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        cls = type("ReferenceProcess", (bench.ProcStats, self.ref.ReferenceServer), {})
        return cls(self.binary, self.data, scratch, cache, min_sources=self.min_sources)

    @staticmethod
    def ids(server, suffixes, shapes, tries=20) -> dict:
        """{name: source id} from the catalog: the source whose url ends with
        `suffixes[name]` and whose tensor has `shapes[name]` (leading axes of one aside)."""
        sources = []
        for _ in range(tries):
            sources = bench.run_worker({"kind": "catalog", "location": server.location})["sources"]
            ids = {}
            for n, suffix in suffixes.items():
                for src in sources:
                    url = (src.get("source_url") or "").rstrip("/")
                    if url.endswith(suffix) and squeezed(src.get("shape") or ()) == squeezed(shapes[n]):
                        ids[n] = src["source_id"]
            if len(ids) == len(suffixes):
                return ids
            time.sleep(0.5)
        raise RuntimeError(f"biopb server does not list {sorted(suffixes)}: {sources}\n" + server.log_tail())


def squeezed(shape) -> tuple:
    """A shape without its leading axes of one (biopb's server gives OME data as TCZYX)."""
    shape = [int(d) for d in shape]
    while len(shape) > 1 and shape[0] == 1:
        shape.pop(0)
    return tuple(shape)


def write_performance(path: pathlib.Path, title: str, analysis: str, text: str) -> str:
    """Replaces (or appends) the section `title` in `path`, keeping the rest of the file and
    the section's hand-written analysis (from the heading `analysis` to the section's end);
    returns the analysis kept."""
    old = path.read_text() if path.exists() else "# Performance\n"
    kept = ""
    at = old.find(f"\n{title}\n")
    if at >= 0:
        end = old.find("\n## ", at + len(title) + 2)
        body = old[at:end] if end >= 0 else old[at:]
        if analysis in body:
            kept = body[body.find(analysis):].rstrip("\n")
        old = old[:at] + (old[end:] if end >= 0 else "\n")
    text = text.rstrip("\n") + ("\n\n" + kept if kept else "")
    path.write_text(old.rstrip("\n") + "\n\n" + text + "\n")
    print(f"wrote {path}")
    return kept


def binary_note(binary) -> str:
    """The binary measured: its size and build profile."""
    size = os.path.getsize(binary)
    profile = "release" if "/release/" in str(binary) else "dev"
    if profile == "release":
        return f"`{binary}`, {size / MiB:.0f} MiB: a release build."
    return (f"`{binary}`, {size / MiB:.0f} MiB: a dev-profile build in which Tessera's own crates "
            "are at opt-level 1 and every dependency (codecs, arrow, …) at opt-level 2; "
            "a release build would be faster in Tessera's own code (the decoders are dependencies).")
