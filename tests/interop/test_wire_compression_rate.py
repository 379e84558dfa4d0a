"""`--wire-compression auto` decides pixels by the peer's measured delivery rate and
always compresses labels to peers off loopback (docs/decisions/0039).

The peer is the unmodified biopb client in a network namespace of its own, joined to this
one by a veth pair (as benches/shaped_link.py does), so its address is not loopback: with
the link shaped by a token bucket (100 Mbit/s) its microscopy-like pixel replies go
compressed once its connection's rate is measured, and every one on the next read; over
the same pair unshaped (GB/s) they stay raw. Integer tensors named by `--label-tensors`
and label set uploads go compressed on both links; a float tensor the pattern names stays
pixels. What was sent is read from `tessera_do_get_body_bytes_total{encoding}`, what was
received is compared with numpy's bytes in the client."""
import json
import os
import random
import shutil
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
from biopb.tensor import TensorFlightClient
from prerequisites import require

TOKEN = "rate-token_0123456789abcdef"
LABELS = "image/@labels/cells"

#: The client's side: reads each tensor named on the command line with biopb's client over
#: DoGet and prints whether its bytes equal the .npy file given with it.
CLIENT = r"""
import json, sys
import numpy as np
from biopb.tensor import TensorFlightClient
location, token, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
out = {}
for name, path in zip(pairs[::2], pairs[1::2]):
    client = TensorFlightClient(location, token=token, cache_bytes=0)
    got = client.get_tensor(name).compute()
    want = np.load(path)
    out[name] = got.dtype == want.dtype and got.tobytes() == want.tobytes()
print(json.dumps(out))
"""


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


@pytest.fixture
def veth():
    """A network namespace joined to this one by a veth pair: (namespace, this end's
    address, the far end's address, shape(rate or None))."""
    require(os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc"),
            "needs root, iproute2's `ip` and `tc` for a network namespace and a token bucket")
    tag = f"{os.getpid() % 10000}{random.randrange(100)}"
    ns, host_if, ns_if = f"tsrwr{tag}", f"tsrwh{tag}", f"tsrwn{tag}"
    net = f"10.{random.randrange(200, 250)}.{random.randrange(256)}"
    host_ip, ns_ip = f"{net}.1", f"{net}.2"
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", ns)
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "-n", ns, "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        sh("ip", "-n", ns, "link", "set", ns_if, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")

        def shape(rate):
            for prefix, dev in (([], host_if), (["ip", "netns", "exec", ns], ns_if)):
                if rate is None:
                    sh(*prefix, "tc", "qdisc", "del", "dev", dev, "root", check=False)
                else:
                    sh(*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                       "burst", "64kb", "latency", "100ms")

        yield ns, host_ip, ns_ip, shape
    finally:
        sh("ip", "link", "del", host_if, check=False)
        sh("ip", "netns", "del", ns, check=False)


@pytest.fixture
def data(tmp_path):
    """`pixels` (u16 cells under Poisson noise, 16 MiB), `seg_cells` (a u16 label image:
    discs of ids on 0), `seg_prob` (f32, named by the label pattern but not integer),
    `image` (one plane of pixels) and the file of its label set, to upload."""
    d = tmp_path / "data"
    d.mkdir()
    rng = np.random.default_rng(41)
    yy, xx = np.mgrid[0:256, 0:512]
    cells = 400 * np.exp(-((yy % 64 - 32) ** 2 + (xx % 64 - 32) ** 2) / 150.0)
    pixels = (100 + cells[None] + rng.poisson(6, (64, 256, 512))).astype("<u2")
    seg = np.zeros((16, 256, 512), dtype="<u2")
    seg[:, ((yy % 64 - 32) ** 2 + (xx % 64 - 32) ** 2) < 300] = 7
    prob = rng.random((4, 256, 512), dtype=np.float32)
    np.save(d / "pixels.npy", pixels)
    np.save(d / "seg_cells.npy", seg)
    np.save(d / "seg_prob.npy", prob)
    np.save(d / "image.npy", pixels[0])
    np.save(tmp_path / "labels.npy", seg[0].astype("<u4"))
    return d, tmp_path / "labels.npy"


def serve(start_server, directory, host_ip, mode="auto"):
    metrics_port = free_port()
    server = start_server(
        directory,
        extra=("--writable", "--wire-compression", mode, "--chunk-target", "1MiB",
               "--label-tensors", "seg_*", "--metrics-listen", f"127.0.0.1:{metrics_port}"),
        env={"TESSERA_TOKEN": TOKEN},
        listen=f"{host_ip}:0",
    )
    server.metrics = f"127.0.0.1:{metrics_port}"
    return server


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def body_bytes(server):
    request = urllib.request.Request(
        f"http://{server.metrics}/metrics", headers={"authorization": f"Bearer {TOKEN}"})
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    out = {"raw": 0, "zstd": 0}
    for line in text.splitlines():
        if line.startswith("tessera_do_get_body_bytes_total{"):
            out[line.split('encoding="')[1].split('"')[0]] = int(float(line.split()[-1]))
    return out


def read_from(ns, server, directory, labels_file, *names):
    """Reads `names` with biopb's client inside `ns`; the bytes sent meanwhile, by encoding."""
    files = {"pixels": directory / "pixels.npy", "seg_cells": directory / "seg_cells.npy",
             "seg_prob": directory / "seg_prob.npy", LABELS: labels_file}
    before = body_bytes(server)
    argv = ["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, server.location, TOKEN]
    for name in names:
        argv += [name, str(files[name])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "BIOPB_CACHEFILE_TRANSFER_DISABLED": "1"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {n: True for n in names}
    after = body_bytes(server)
    return {k: after[k] - before[k] for k in after}


def upload_labels(server, labels_file):
    labels = np.load(labels_file)
    client = TensorFlightClient(server.location, token=TOKEN, cache_bytes=0)
    desc = client.setup_array_upload(f"zarr://{LABELS}", labels, chunk_shape=(128, 256))
    assert client.upload_array(desc, labels)["state"] == "READY"


def test_a_slow_peer_gets_compressed_pixels_a_fast_one_raw(start_server, data, veth):
    directory, labels_file = data
    ns, host_ip, _, shape = veth
    pixels_bytes = 64 * 256 * 512 * 2

    shape("100mbit")
    slow = serve(start_server, directory, host_ip)
    # The first read starts raw and turns compressed once the rate is measured.
    first = read_from(ns, slow, directory, labels_file, "pixels")
    assert first["zstd"] > 0, first
    assert first["raw"] + first["zstd"] < pixels_bytes, first
    # The next connection of the same peer starts from that measurement: all compressed.
    second = read_from(ns, slow, directory, labels_file, "pixels")
    assert second["raw"] == 0 and 0 < second["zstd"] < pixels_bytes * 0.8, second

    shape(None)
    fast = serve(start_server, directory, host_ip)
    for _ in range(2):
        sent = read_from(ns, fast, directory, labels_file, "pixels")
        assert sent["zstd"] == 0 and sent["raw"] >= pixels_bytes, sent


def test_labels_go_compressed_to_a_peer_off_loopback_on_any_link(start_server, data, veth):
    directory, labels_file = data
    ns, host_ip, _, shape = veth
    seg_bytes = 16 * 256 * 512 * 2
    prob_bytes = 4 * 256 * 512 * 4
    for rate in (None, "100mbit"):
        shape(rate)
        server = serve(start_server, directory, host_ip)
        upload_labels(server, labels_file)
        # A tensor --label-tensors names and an upload under @labels: compressed at once,
        # first connection, nothing measured yet.
        sent = read_from(ns, server, directory, labels_file, "seg_cells", LABELS)
        assert sent["raw"] == 0 and 0 < sent["zstd"] * 10 < seg_bytes, (rate, sent)
        # A float tensor the pattern names is pixels: noise-like, raw.
        sent = read_from(ns, server, directory, labels_file, "seg_prob")
        assert sent["zstd"] == 0 and sent["raw"] >= prob_bytes, (rate, sent)
