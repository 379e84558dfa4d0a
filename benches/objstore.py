#!/usr/bin/env python3
"""Object-store benchmark (issue 36): an OME-Zarr image in moto's S3 server behind a shaped
link (1 Gbit/s, 20 ms round trip), read cold and warm, one run, side by side.

The image: OME-Zarr 0.4, u16, level 0 ``--shape`` (1 GiB by default), three levels, chunks
1 x 512 x 512, Blosc(zstd, clevel 5, shuffle) -- ome-zarr-py's default compressor --,
written with zarr-python into a local folder (reused by a stamp), then put into moto's
store object by object. moto's server runs in a network namespace joined to this one by a
veth pair. The link: each end's egress is a token bucket, ``tc qdisc ... tbf rate 1gbit``,
applied after the upload, and moto answers every request 20 ms late (``--delay-ms``): the
kernel here (Firecracker, 6.18) has no netem qdisc, so the round trip is added per request
at the server rather than per packet (TCP's window growth over a long link is not modelled).

Rows, as medians of N repetitions, level 0 read whole into numpy:

* the link's ceiling with moto behind it: boto3 GETs of every level-0 object, 1 and 32
  threads (bytes that crossed the link / wall);
* Tessera (``--bin``) serving ``s3://BUCKET/img.zarr``, cold (a fresh server, empty cache)
  and warm (the same server again), through the unmodified biopb 0.13.0 client over
  do_get and over the mmap fast path; and warm serving the local copy (local speed);
* biopb's own server (benches/reference/) serving the same store through its fsspec path
  (a ``type: ome-zarr`` source with a credentials profile naming moto's endpoint), cold;
* zarr-python reading the store directly (``zarr.open_array("s3://...", storage_options)``).

Wall time, MiB/s of decoded bytes and of stored bytes (what crossed the link), the ratio
of the stored rate to the link rate (1 Gbit/s = 119.2 MiB/s), CPU of the server, of moto
and of the client. Needs root (netns, tc), iproute2, moto[server], s3fs.

Usage (from the repository root)::

    .venv/bin/python benches/objstore.py --bin target/release/tessera          # full, writes the docs
    .venv/bin/python benches/objstore.py --quick --no-doc                      # 128 MiB
"""
from __future__ import annotations

import argparse
import concurrent.futures
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
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
# benches/zarr.py is beside this file: keep the folder off the import path, or `import zarr`
# would import that script instead of zarr-python.
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("tessera_format_bench", HERE / "format_bench.py")
fb = importlib.util.module_from_spec(_spec)  # what the format benchmarks share
_spec.loader.exec_module(fb)
_spec = importlib.util.spec_from_file_location("tessera_shaped_link", HERE / "shaped_link.py")
shaped_link = importlib.util.module_from_spec(_spec)  # the namespace, the veth pair, tc
_spec.loader.exec_module(shaped_link)
bench = fb.bench  # run.py: workers, /proc readings, servers

median, MiB, GiB, MODES = fb.median, fb.MiB, fb.GiB, fb.MODES
LINK_MIB_S = shaped_link.GBIT_MIB_S  # 1 Gbit/s in MiB/s
CHUNK = (1, 512, 512)
LEVELS = 3
BUCKET = "tessera-bench"
KEYS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_REGION": "us-east-1"}
STORE_FORMAT = "tessera-objstore-bench-1"
SECTION = "## Object stores"
ANALYSIS = "### What limits it (hand-written"
NS, HOST_IF, NS_IF = "tsrbench", "tsrbh0", "tsrbn0"
HOST_IP, NS_IP = "10.231.7.1", "10.231.7.2"
PORT = 5055


# --------------------------------------------------------------------------- the image


def write_image(path: pathlib.Path, stamp: pathlib.Path, shape) -> None:
    """Writes (or reuses) the OME-Zarr 0.4 image at `path`."""
    import numcodecs
    import numpy as np
    import zarr

    want = {"format": STORE_FORMAT, "shape": list(shape), "chunk": list(CHUNK), "levels": LEVELS}
    if path.is_dir() and stamp.exists() and json.loads(stamp.read_text()) == want:
        return
    stamp.unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)
    print(f"  writing the OME-Zarr 0.4 image, level 0 {tuple(shape)} u16", flush=True)
    g = zarr.open_group(str(path), mode="w", zarr_format=2)
    shapes = [(shape[0], shape[1] >> k, shape[2] >> k) for k in range(LEVELS)]
    comp = numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    arrays = [g.create_array(str(k), shape=s, chunks=(1, min(CHUNK[1], s[1]), min(CHUNK[2], s[2])),
                             dtype="uint16", fill_value=0, compressors=comp,
                             chunk_key_encoding={"name": "v2", "separator": "/"})
              for k, s in enumerate(shapes)]
    g.attrs["multiscales"] = [{
        "version": "0.4", "name": "img",
        "axes": [{"name": a, "type": "space", "unit": "micrometer"} for a in "zyx"],
        "datasets": [{"path": str(k), "coordinateTransformations": [
            {"type": "scale", "scale": [1.0, 0.5 * 2 ** k, 0.5 * 2 ** k]}]} for k in range(LEVELS)],
    }]
    rng = np.random.default_rng(36)
    t0 = time.perf_counter()
    for z0 in range(0, shape[0], 4):
        block = np.stack([fb.plane(rng, z, shape[1], shape[2], shape[0])
                          for z in range(z0, min(z0 + 4, shape[0]))])
        level = block
        for k in range(LEVELS):
            arrays[k][z0:z0 + level.shape[0]] = level
            level = fb.halve_yx(level)
        if z0 % 32 == 0:
            print(f"    planes {z0 + block.shape[0]}/{shape[0]} ({time.perf_counter() - t0:.0f} s)", flush=True)
    stamp.write_text(json.dumps(want))


# --------------------------------------------------------------------------- the link


class Link:
    """The namespace, the veth pair, and moto's server in the namespace."""

    def __init__(self, log: pathlib.Path, delay_ms: float):
        self.net = shaped_link.ShapedLink(NS, HOST_IF, NS_IF, HOST_IP, NS_IP)
        self.endpoint = f"http://{NS_IP}:{PORT}"
        self.log = open(log, "wb")
        self.moto = subprocess.Popen(
            self.net.in_namespace([sys.executable, __file__, "--moto", json.dumps(
                {"host": NS_IP, "port": PORT, "delay": delay_ms / 1000})]),
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1)
                break
            except OSError:
                if self.moto.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start (see its log)")
                time.sleep(0.2)

    def shape(self, rate="1gbit"):
        """A token bucket of `rate` on both ends' egress (this kernel has no netem: the
        delay is moto's, per request; see `moto_main`)."""
        self.net.shape(rate, burst="256kb", latency="100ms")

    def qdiscs(self) -> str:
        return self.net.qdiscs()

    def rtt_ms(self) -> float:
        """The median time of 10 small requests to moto over the link (a new connection each)."""
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            with urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=5) as r:
                r.read()
            times.append(time.perf_counter() - t0)
        return median(times) * 1e3

    def moto_cpu(self) -> float:
        try:
            return bench.process_cpu_seconds(self.moto.pid)
        except OSError:
            return float("nan")

    def env(self) -> dict:
        return {**KEYS, "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true"}

    def stop(self):
        if self.moto.poll() is None:
            self.moto.kill()
            self.moto.wait(10)
        self.log.close()
        self.net.down()


def s3_client(endpoint):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1",
                        config=Config(max_pool_connections=64))


def upload(endpoint, image: pathlib.Path, prefix: str) -> int:
    """Puts every file of the image into the bucket (32 at once); the bytes put."""
    s3 = s3_client(endpoint)
    s3.create_bucket(Bucket=BUCKET)
    files = [p for p in sorted(image.rglob("*")) if p.is_file()]

    def put(p):
        s3.put_object(Bucket=BUCKET, Key=prefix + p.relative_to(image).as_posix(), Body=p.read_bytes())
        return p.stat().st_size

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        return sum(pool.map(put, files))


def moto_main(conf: dict) -> None:
    """moto's S3 server (as `python -m moto.server` runs it) whose every answer waits
    `delay` seconds first: one round trip of a link, per request, where the kernel has no
    netem qdisc to delay packets."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from moto.server import MotoRequestHandler
    from werkzeug.serving import run_simple

    os.environ.setdefault("MOTO_PORT", str(conf["port"]))
    app = DomainDispatcherApplication(create_backend_app)

    def delayed(environ, start_response):
        time.sleep(conf["delay"])
        return app(environ, start_response)

    run_simple(conf["host"], conf["port"], delayed, threaded=True, request_handler=MotoRequestHandler)


# --------------------------------------------------------------------------- workers


def run_own_worker(job: dict) -> dict:
    return bench.run_worker(job, script=__file__)


def worker_main(job: dict) -> None:
    out = {}
    if job["kind"] == "cold":
        from biopb.tensor import TensorFlightClient

        client = TensorFlightClient(job["location"], cache_bytes=0)
        out.update(fb.timed_cold_read(client, {**job, "drop": False}))
    elif job["kind"] == "zarr":
        # zarr-python on s3fs, its default concurrency; one untimed open of the metadata.
        import zarr

        opts = {"endpoint_url": job["endpoint"], "key": KEYS["AWS_ACCESS_KEY_ID"],
                "secret": KEYS["AWS_SECRET_ACCESS_KEY"], "client_kwargs": {"region_name": "us-east-1"}}
        out["concurrency"] = zarr.config.get("async.concurrency")
        times, cpus = [], []
        for _ in range(job["reps"]):
            arr = zarr.open_array(job["url"], mode="r", storage_options=opts)
            before = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            got = arr[...]
            times.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            out["shape"] = list(got.shape)
            del got
        out["times"], out["client_cpu"] = times, cpus
    elif job["kind"] == "boto":
        # The link's ceiling with moto behind it: every key GET, `threads` at once.
        s3 = s3_client(job["endpoint"])
        before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(job["threads"]) as pool:
            n = sum(pool.map(lambda k: len(s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()), job["keys"]))
        out["times"] = [time.perf_counter() - t0]
        after = resource.getrusage(resource.RUSAGE_SELF)
        out["client_cpu"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        out["bytes"] = n
    elif job["kind"] == "check":
        # One read through the biopb client compared with zarr-python's read of the local copy.
        import numpy as np
        import zarr
        from biopb.tensor import TensorFlightClient

        got = TensorFlightClient(job["location"], cache_bytes=0).get_tensor(job["id"]).compute()
        want = zarr.open_array(job["path"], mode="r")[...]
        if got.shape != want.shape or not np.array_equal(got, want):
            raise SystemExit(f"{job['id']}: read back {got.shape}, not the store's {want.shape} values")
        out["ok"] = True
    print(json.dumps(out))


# --------------------------------------------------------------------------- phases


class S3Tessera(bench.ProcStats, bench.TesseraProcess):
    """`tessera serve ADDRESS` with the store's AWS_* environment and an empty cache."""

    def __init__(self, binary, address, work, env, tag):
        cache, state = work / f"tessera-{tag}-cache", work / f"tessera-{tag}-state"
        for d in (cache, state):
            shutil.rmtree(d, ignore_errors=True)
        super().__init__(binary, [address, "--cache-dir", cache, "--cache-max-bytes", "16GiB",
                                  "--state-dir", state], env=env, start_timeout=120)


def wait_for(server, array_id, tries=100):
    for _ in range(tries):
        ids = bench.run_worker({"kind": "catalog", "location": server.location})["sources"]
        if any(s["source_id"] == array_id for s in ids):
            return
        time.sleep(0.3)
    raise RuntimeError(f"{array_id} is not served:\n" + "".join(server.log[-20:]))


def row(r, res, label, nbytes, stored, link, server=None, cpu0=None, moto0=None, reps=1):
    got = {"times": r["times"], "client_cpu": median(r["client_cpu"]) if isinstance(r["client_cpu"], list)
           else r["client_cpu"], "bytes": nbytes, "stored": stored}
    if "server_cpu" in r:
        got["server_cpu"] = r["server_cpu"]
    elif server is not None:
        got["server_cpu"] = (server.cpu_seconds() - cpu0) / reps
    if moto0 is not None:
        got["moto_cpu"] = (link.moto_cpu() - moto0) / reps
    res.add(label, got)
    return got


def ceiling_phase(link, res, keys, stored):
    for threads in (1, 32):
        sub = keys if threads > 1 else keys[: max(8, len(keys) // 16)]
        m0 = link.moto_cpu()
        r = run_own_worker({"kind": "boto", "endpoint": link.endpoint, "keys": sub, "threads": threads})
        row(r, res, f"boto3 GET, {threads} thread{'s' if threads > 1 else ''}", r["bytes"], r["bytes"], link,
            moto0=m0)
    return stored


def tessera_phase(args, link, res, work, nbytes, stored, reps, warm_reps):
    address, array_id = f"s3://{BUCKET}/img.zarr", args.array_id
    for mode in MODES:
        times, scpu, ccpu, mcpu = [], [], [], []
        for i in range(reps):
            server = S3Tessera(args.bin, address, work, link.env(), "cold")
            try:
                wait_for(server, array_id)
                m0 = link.moto_cpu()
                r = run_own_worker({"kind": "cold", "location": server.location, "id": array_id, "mode": mode,
                                    "cpu_pid": server.pid})
                mcpu.append(link.moto_cpu() - m0)
                times += r["times"]
                scpu.append(r["server_cpu"])
                ccpu.append(r["client_cpu"])
                if i == reps - 1:  # warm: the same server again
                    s0, m0 = server.cpu_seconds(), link.moto_cpu()
                    w = bench.run_worker(fb.read_job(server.location, array_id, mode, warm_reps))
                    row(w, res, f"warm {mode}, Tessera (s3)", nbytes, stored, link, server, s0, m0, warm_reps)
                    if mode == "doget":
                        run_own_worker({"kind": "check", "location": server.location, "id": array_id,
                                        "mode": mode, "path": str(work / "local" / "img.zarr" / "0")})
            finally:
                server.stop()
        res.add(f"cold {mode}, Tessera (s3)", {"times": times, "server_cpu": median(scpu),
                                                "client_cpu": median(ccpu), "moto_cpu": median(mcpu),
                                                "bytes": nbytes, "stored": stored})


def local_phase(args, res, work, nbytes, stored, warm_reps):
    """Tessera serving the local copy, warm: what 'local speed' is."""
    server = S3Tessera(args.bin, work / "local", work, {}, "local")
    try:
        for mode in MODES:
            bench.run_worker(fb.read_job(server.location, "img", mode, 1))
            s0 = server.cpu_seconds()
            w = bench.run_worker(fb.read_job(server.location, "img", mode, warm_reps))
            row(w, res, f"warm {mode}, Tessera (local copy)", nbytes, stored, None, server, s0, None, warm_reps)
    finally:
        server.stop()


def reference_phase(link, res, work, nbytes, stored, reps, shape, shim=True):
    """biopb's server on the same store, cold. With `shim`, zarr's I/O runs on fsspec's loop
    (benches/reference/fsspec_loop: without it, its remote Zarr path fails on s3fs)."""
    ref = bench.reference_module()
    binary = ref.ensure_installed()
    profile = {"name": "moto", "storage_type": "s3", "key": KEYS["AWS_ACCESS_KEY_ID"],
               "secret": KEYS["AWS_SECRET_ACCESS_KEY"], "region": "us-east-1", "endpoint_url": link.endpoint}
    sources = [{"type": "ome-zarr", "url": f"s3://{BUCKET}/img.zarr", "credentials_profile": "moto"}]
    cls = type("ReferenceProcess", (bench.ProcStats, ref.ReferenceServer), {})
    for mode in MODES:
        times, scpu, ccpu, mcpu = [], [], [], []
        for _ in range(reps):
            scratch, cache = work / "ref", work / "ref-cache"
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)
            server = cls(binary, work / "local", scratch, cache, min_sources=1, sources=sources,
                         credentials={"default_profile": "moto", "profiles": [profile]},
                         extra_env={"PYTHONPATH": str(HERE / "reference" / "fsspec_loop")} if shim else None)
            try:
                ids = fb.Reference.ids(server, {"img": "img.zarr"}, {"img": tuple(shape)})
                res.info["reference_id"] = ids["img"]
                m0 = link.moto_cpu()
                r = run_own_worker({"kind": "cold", "location": server.location, "id": ids["img"],
                                    "mode": mode, "cpu_pid": server.pid})
                mcpu.append(link.moto_cpu() - m0)
                times += r["times"]
                scpu.append(r["server_cpu"])
                ccpu.append(r["client_cpu"])
            finally:
                server.stop()
        res.add(f"cold {mode}, biopb server (fsspec)", {"times": times, "server_cpu": median(scpu),
                                                         "client_cpu": median(ccpu), "moto_cpu": median(mcpu),
                                                         "bytes": nbytes, "stored": stored})


def zarr_phase(link, res, nbytes, stored, reps):
    m0 = link.moto_cpu()
    r = run_own_worker({"kind": "zarr", "endpoint": link.endpoint, "url": f"s3://{BUCKET}/img.zarr/0",
                        "reps": reps})
    res.info["zarr_concurrency"] = r["concurrency"]
    row(r, res, "cold, zarr-python (s3fs)", nbytes, stored, link, moto0=m0, reps=reps)


# --------------------------------------------------------------------------- report


def mib_s(row, key="bytes"):
    return row[key] / median(row["times"]) / MiB


def table(res) -> str:
    lines = ["| read | wall (s) | decoded MiB/s | stored MiB/s | × link | server CPU (s) | moto CPU (s) "
             "| client CPU (s) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, r in res.rows.items():
        stored = mib_s(r, "stored")
        cpu = lambda k: "" if r.get(k) is None else f"{r[k]:.1f}"  # noqa: E731
        local = "local copy" in label or label.startswith("warm")
        lines.append(f"| {label} | {median(r['times']):.2f} | {mib_s(r):.0f} | "
                     f"{'' if local else f'{stored:.0f}'} | {'' if local else f'{stored / LINK_MIB_S:.2f}'} | "
                     f"{cpu('server_cpu')} | {cpu('moto_cpu')} | {cpu('client_cpu')} |")
    return "\n".join(lines)


def ratios(res) -> str:
    rows, out = res.rows, []
    for mode in MODES:
        t = rows.get(f"cold {mode}, Tessera (s3)")
        b = rows.get(f"cold {mode}, biopb server (fsspec)")
        z = rows.get("cold, zarr-python (s3fs)")
        w = rows.get(f"warm {mode}, Tessera (s3)")
        loc = rows.get(f"warm {mode}, Tessera (local copy)")
        if not t:
            continue
        parts = [f"cold {mode}: Tessera {mib_s(t, 'stored') / LINK_MIB_S:.2f}× the link"]
        if b:
            parts.append(f"{median(b['times']) / median(t['times']):.1f}× biopb's server")
        if z:
            parts.append(f"{median(z['times']) / median(t['times']):.2f}× zarr-python")
        if w and loc:
            parts.append(f"warm {mib_s(w):.0f} MiB/s, {mib_s(w) / mib_s(loc):.2f}× the local copy's warm")
        out.append("- " + ", ".join(parts) + ".")
    return "\n".join(out)


def section(res, args) -> str:
    i = res.info
    return f"""{SECTION}

(Issue 36, decision 0037; generated by `benches/objstore.py`, which replaces this section on
each run and keeps the hand-written analysis below it.) One run on {i['when']}, {i['machine']}; binary: {i['binary']}
An OME-Zarr 0.4 image, u16, level 0 {tuple(i['shape'])} ({i['level0_bytes'] / MiB:.0f} MiB decoded,
{i['level0_stored'] / MiB:.0f} MiB stored), chunks {CHUNK}, Blosc(zstd, 5, shuffle), in moto's S3 server
({i['moto']}) in a network namespace behind a veth pair, each end's egress a token bucket
(`tc qdisc replace dev … root tbf rate 1gbit burst 256kb latency 100ms`), moto answering every
request {i['delay_ms']:.0f} ms late (this kernel has no netem: the round trip is added per request, at
the server); a small request over the link takes {i['rtt_ms']:.1f} ms.
Level 0 read whole into numpy through the biopb 0.13.0 client (`get_tensor(id).compute()`), cold
= a fresh server with an empty cache, median of {i['reps']} (cold) and {i['warm_reps']} (warm).
"stored MiB/s" is the bytes that crossed the link per second; "× link" is it over 1 Gbit/s
({LINK_MIB_S:.1f} MiB/s); warm rows cross no link. Server, moto and client CPU are per read. zarr-python {i['zarr_version']} on s3fs (async concurrency
{i.get('zarr_concurrency')}).

{table(res)}

{ratios(res)}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "tessera"))
    ap.add_argument("--shape", default="128,2048,2048", help="level 0 (z,y,x), u16")
    ap.add_argument("--quick", action="store_true", help="16 x 2048 x 2048 (128 MiB), one rep")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--warm-reps", type=int, default=3)
    ap.add_argument("--work", default="/tmp/tessera-objstore-bench")
    ap.add_argument("--phases", default="ceiling,tessera,local,biopb,zarr")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "guides" / "performance.md"))
    ap.add_argument("--measurement", default=None, help="also write the figures to this file")
    ap.add_argument("--array-id", default="img",
                    help="what Tessera's rows read: the image (img) or its level 0 array (img.0)")
    ap.add_argument("--delay-ms", type=float, default=20.0, help="added to each answer of moto's")
    ap.add_argument("--worker", default=None)
    ap.add_argument("--moto", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--report-only", action="store_true", help="rewrite the docs from WORK's results.json")
    args = ap.parse_args()
    if args.report_only:
        res = fb.Results(pathlib.Path(args.work) / ("quick" if args.quick else "full") / "results.json")
        res.load()
        report(res, args)
        return
    if args.moto:
        moto_main(json.loads(args.moto))
        return
    if args.worker:
        worker_main(json.loads(args.worker))
        return
    import moto
    import zarr

    shape = (16, 2048, 2048) if args.quick else tuple(int(x) for x in args.shape.split(","))
    reps = 1 if args.quick else args.reps
    work = pathlib.Path(args.work) / ("quick" if args.quick else "full")
    work.mkdir(parents=True, exist_ok=True)
    image = work / "local" / "img.zarr"  # served as it is by the local row
    image.parent.mkdir(exist_ok=True)
    write_image(image, work / "img.stamp.json", shape)
    res = fb.Results(work / "results.json")
    stored = fb.du_bytes(image / "0")
    res.info = {"when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "machine": bench.machine(), "binary": fb.binary_note(args.bin), "shape": list(shape),
                "level0_bytes": shape[0] * shape[1] * shape[2] * 2, "level0_stored": stored,
                "zarr_version": zarr.__version__, "moto": f"moto {moto.__version__}", "reps": reps,
                "warm_reps": args.warm_reps}
    res.info["delay_ms"] = args.delay_ms
    link = Link(work / "moto.log", args.delay_ms)
    try:
        print("upload:", flush=True)
        t0 = time.perf_counter()
        res.info["uploaded"] = upload(link.endpoint, image, "img.zarr/")
        print(f"  {res.info['uploaded'] / MiB:.0f} MiB in {time.perf_counter() - t0:.0f} s", flush=True)
        link.shape()
        with urllib.request.urlopen(link.endpoint + "/moto-api/", timeout=5):
            pass
        res.info["qdiscs"], res.info["rtt_ms"] = link.qdiscs(), link.rtt_ms()
        print(f"  link: {res.info['qdiscs']}; RTT {res.info['rtt_ms']} ms", flush=True)
        keys = sorted("img.zarr/" + p.relative_to(image).as_posix() for p in (image / "0").rglob("*")
                      if p.is_file() and not p.name.startswith("."))
        phases = set(args.phases.split(","))
        nbytes = res.info["level0_bytes"]
        if "ceiling" in phases:
            print("moto behind the link, boto3:", flush=True)
            ceiling_phase(link, res, keys, stored)
        if "tessera" in phases:
            print("Tessera:", flush=True)
            tessera_phase(args, link, res, work, nbytes, stored, reps, args.warm_reps)
        if "local" in phases:
            print("Tessera, local copy:", flush=True)
            local_phase(args, res, work, nbytes, stored, args.warm_reps)
        if "zarr" in phases:
            print("zarr-python:", flush=True)
            zarr_phase(link, res, nbytes, stored, reps)
        if "biopb" in phases:
            print("biopb server:", flush=True)
            try:
                reference_phase(link, res, work, nbytes, stored, reps, shape)
            except (subprocess.CalledProcessError, RuntimeError) as e:
                res.info["reference_missing"] = f"{type(e).__name__}: {str(e)[:2000]}"
                print(f"  biopb server rows missing: {e}", flush=True)
    finally:
        link.stop()
    res.save()
    report(res, args)


def report(res, args):
    print()
    print(table(res))
    print()
    print(ratios(res))
    if not args.no_doc:
        text = section(res, args)
        kept = fb.write_performance(pathlib.Path(args.doc), SECTION, ANALYSIS, text)
        if args.measurement:
            pathlib.Path(args.measurement).write_text(text + ("\n" + kept if kept else ""))


if __name__ == "__main__":
    main()
