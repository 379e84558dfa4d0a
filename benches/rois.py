"""ROI annotation latency through the unmodified biopb client (docs/decisions/0020):
put of a batch of 1 and of 1,000 annotations (each acknowledged only after its
transaction is fsynced), and a list of 10,000 (through the client, and as Arrow rows only).

    cargo build --release -p tessera-cli
    python benches/rois.py [--binary target/release/tessera] [--reps 20]

Prints the median and the spread of each, in milliseconds, on a loopback server whose
state directory is in a fresh temporary directory (on the filesystem of $TMPDIR).
"""
import argparse
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow.flight as flight
from biopb.image.annotation_pb2 import RoiAnnotation
from biopb.tensor import TensorFlightClient
from biopb.tensor.ticket_pb2 import RoiRead, TensorTicket

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support" / "python"))
from tessera_launcher import TesseraProcess  # noqa: E402


def polygon(i: int) -> RoiAnnotation:
    a = RoiAnnotation(set_name="cells", label=f"cell {i}", props_json='{"score": 0.9}')
    for dx, dy in ((0, 0), (12, 1), (14, 11), (2, 13), (-1, 6)):
        p = a.roi.polygon.points.add()
        p.x, p.y = float(i % 500 + dx), float(i // 500 + dy)
    return a


def timed(fn, reps: int) -> list:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def report(label: str, ms: list) -> None:
    q = statistics.quantiles(ms, n=10) if len(ms) > 1 else ms * 9
    print(f"{label:<34} median {statistics.median(ms):8.2f} ms   p10 {q[0]:8.2f}   p90 {q[-1]:8.2f}   (n={len(ms)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "tessera"))
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "data").mkdir()
        for name in ("one", "thousand", "list"):
            np.save(tmp / "data" / f"{name}.npy", np.zeros((512, 512), dtype="<u2"))
        server = TesseraProcess(
            args.binary,
            [tmp / "data", "--cache-dir", tmp / "cache", "--state-dir", tmp / "state"],
        )
        try:
            c = TensorFlightClient(server.location, cache_bytes=0)
            c.put_rois("one", [polygon(0)])  # warm the connection
            report("put batch of 1", timed(lambda: c.put_rois("one", [polygon(1)]), args.reps))
            batch = [polygon(i) for i in range(1000)]
            reps = min(args.reps, 9)
            report("put batch of 1,000", timed(lambda: c.put_rois("thousand", batch), reps))
            for k in range(10):
                c.put_rois("list", [polygon(k * 1000 + i) for i in range(1000)])
            listed = c.list_rois("list")
            assert len(listed.rois) == 10_000 and not listed.truncated
            report("list of 10,000 (biopb client)", timed(lambda: c.list_rois("list"), args.reps))
            # The same read as Arrow only: what the server and the wire cost, without the
            # client's per-row proto3 JSON parse into RoiAnnotation messages.
            raw = flight.FlightClient(server.location)
            ticket = flight.Ticket(
                TensorTicket(roi_read=RoiRead(array_id="list")).SerializeToString()
            )
            report(
                "list of 10,000 (Arrow rows only)",
                timed(lambda: raw.do_get(ticket).read_all(), args.reps),
            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
