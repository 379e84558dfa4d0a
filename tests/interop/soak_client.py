"""One client process of the eviction soak (tests/tests/e2e/eviction_soak_keeps_mmap_clients_safe.rs).

Usage: soak_client.py LOCATION DATA_DIR SECONDS SEED

Reads random slices of every .npy in DATA_DIR through the unmodified biopb client (mmap fast
path on loopback, no client cache) until SECONDS have passed, checking every slice against
numpy's own reading of the file. Exits 3 on the first wrong byte; a SIGBUS kills it with
signal 7, which the orchestrator sees. Prints one JSON line of counters on success.
"""
import json
import pathlib
import sys
import time

import numpy as np
from biopb.tensor import TensorFlightClient


def random_slice(rng, shape):
    out = []
    for d in shape:
        start = int(rng.integers(0, d))
        stop = int(rng.integers(start + 1, d + 1))
        out.append(slice(start, stop))
    return tuple(out)


def main():
    location, data_dir, seconds, seed = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    arrays = {p.stem: np.load(p, mmap_mode="r") for p in sorted(pathlib.Path(data_dir).glob("*.npy"))}
    names = sorted(arrays)
    client = TensorFlightClient(location, cache_bytes=0)
    rng = np.random.default_rng(seed)
    deadline = time.monotonic() + seconds
    reads = whole = 0
    while time.monotonic() < deadline:
        name = names[int(rng.integers(0, len(names)))]
        expected = arrays[name]
        if rng.random() < 0.1:
            got = client.get_array(name)
            sl = tuple(slice(0, d) for d in expected.shape)
            whole += 1
        else:
            sl = random_slice(rng, expected.shape)
            got = client.get_tensor(name, slice_hint=sl).compute()
        if got.dtype != expected.dtype or not np.array_equal(got, expected[sl]):
            print(f"WRONG BYTES: {name} {sl}", file=sys.stderr, flush=True)
            sys.exit(3)
        reads += 1
    print(json.dumps({"reads": reads, "whole": whole}), flush=True)


if __name__ == "__main__":
    main()
