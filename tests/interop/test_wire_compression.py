"""Compressed chunk replies (`--wire-compression`, docs/decisions/0039): with `zstd` the
biopb client (mapped and over DoGet), pyarrow's Flight client and `tessera get` read exactly
what numpy holds, label sets, u16 pixels and noise whose buffers zstd cannot shrink (sent
raw inside the compressed message, their length written as -1); `off` sends raw bodies;
`auto` compresses a label set for a peer that dials a non-loopback address of this machine
and leaves loopback peers, noise, and pixels on that fast link raw. What was sent is read from the server's
`tessera_do_get_body_bytes_total{encoding}` and from the FlightData bytes themselves."""
import os
import random
import shutil
import socket
import struct
import subprocess
import urllib.request

import grpc
import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient, descriptor_pb2, ticket_pb2
from prerequisites import require

from conftest import tessera_bin

TOKEN = "wire-token_0123456789abcdef"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LABELS = "image/@labels/cells"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def data(tmp_path):
    """A directory of `pixels` (u16, smooth cells under Poisson noise, as a microscope
    records), `noise` (u16 uniform: zstd cannot shrink it) and `image` (one plane, the
    image of the label set); and the label set's values."""
    d = tmp_path / "data"
    d.mkdir()
    rng = np.random.default_rng(39)
    yy, xx = np.mgrid[0:256, 0:256]
    cells = 400 * np.exp(-((yy % 64 - 32) ** 2 + (xx % 64 - 32) ** 2) / 150.0)
    pixels = (100 + cells[None] + rng.poisson(6, (6, 256, 256))).astype("<u2")
    noise = rng.integers(0, 2**16, (4, 256, 256), dtype="<u2")
    labels = ((yy // 32) * 8 + xx // 32 + 1).astype("<u4")
    labels[:40] = 0
    np.save(d / "pixels.npy", pixels)
    np.save(d / "noise.npy", noise)
    np.save(d / "image.npy", pixels[0])
    return d, {"pixels": pixels, "noise": noise, LABELS: labels}


def serve(start_server, directory, mode, listen="127.0.0.1:0"):
    """A writable server with `--wire-compression mode` and a metrics endpoint, listening
    on `listen` (a token is required off loopback, so it always has one)."""
    metrics = f"127.0.0.1:{free_port()}"
    server = start_server(
        directory,
        extra=("--writable", "--wire-compression", mode, "--chunk-target", "128KiB",
               "--metrics-listen", metrics),
        env={"TESSERA_TOKEN": TOKEN},
        listen=listen,
    )
    server.metrics = metrics
    return server


def body_bytes(server):
    """`tessera_do_get_body_bytes_total` by encoding."""
    request = urllib.request.Request(
        f"http://{server.metrics}/metrics", headers={"authorization": f"Bearer {TOKEN}"}
    )
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tessera_do_get_body_bytes_total{"):
            encoding = line.split('encoding="')[1].split('"')[0]
            out[encoding] = int(float(line.split()[-1]))
    assert set(out) == {"raw", "zstd"}, text
    return out


def upload_labels(server, labels):
    client = TensorFlightClient(server.location, token=TOKEN, cache_bytes=0)
    desc = client.setup_array_upload(f"zarr://{LABELS}", labels, chunk_shape=(128, 128))
    assert client.upload_array(desc, labels)["state"] == "READY"


def biopb_reads(server, expected, monkeypatch, mmap):
    if mmap:
        monkeypatch.delenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", raising=False)
    else:
        monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    client = TensorFlightClient(server.location, token=TOKEN, cache_bytes=0)
    for name, arr in expected.items():
        got = client.get_tensor(name).compute()
        assert got.dtype == arr.dtype, name
        assert got.tobytes() == arr.tobytes(), (name, mmap)


def endpoints(server, array_id):
    """(ticket, expected slice) of each chunk of a plan, pyarrow's Flight client asking."""
    client = flight.connect(server.location)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    read = descriptor_pb2.TensorReadOption(array_id=array_id)
    read.fields.paths.append("endpoints")
    request = descriptor_pb2.FlightRequest(tensor_read=read)
    info = client.get_flight_info(
        flight.FlightDescriptor.for_command(request.SerializeToString()), options
    )
    for ep in info.endpoints:
        bounds = ticket_pb2.ChunkBounds.FromString(ep.app_metadata)
        yield client, options, ep.ticket, tuple(slice(a, b) for a, b in zip(bounds.start, bounds.stop))


def pyarrow_reads(server, array_id, expected):
    """Reads every chunk with pyarrow's do_get; each equals numpy's slice."""
    for client, options, ticket, sl in endpoints(server, array_id):
        batch = client.do_get(ticket, options).read_all().to_batches()[0]
        chunk = expected[sl]
        data = batch.column("data")[0].as_py()
        assert data == np.ascontiguousarray(chunk).tobytes(), (array_id, sl)
        assert batch.column("shape")[0].as_py() == list(chunk.shape)


def fields(message):
    """The length-delimited fields of a protobuf message (FlightData has no others)."""
    out, at = {}, 0

    def varint():
        nonlocal at
        value, shift = 0, 0
        while True:
            byte = message[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while at < len(message):
        key = varint()
        assert key & 7 == 2, f"field {key >> 3} is not length-delimited"
        length = varint()
        out[key >> 3] = message[at:at + length]
        at += length
    return out


def raw_bodies(server, array_id, expected):
    """The `data_body` of each chunk's record batch message as sent, with numpy's bytes of
    the chunk, read with a bare gRPC call (no Arrow decoding)."""
    target = server.location.removeprefix("grpc://")
    with grpc.insecure_channel(target) as channel:
        do_get = channel.unary_stream("/arrow.flight.protocol.FlightService/DoGet")
        for _, _, ticket, sl in endpoints(server, array_id):
            request = b"\x0a" + bytes([len(ticket.ticket)]) + ticket.ticket
            assert len(ticket.ticket) < 128
            replies = list(do_get(request, metadata=[("authorization", f"Bearer {TOKEN}")]))
            assert len(replies) == 2
            yield fields(replies[1]).get(1000, b""), np.ascontiguousarray(expected[sl]).tobytes()


def test_zstd_replies_read_exactly_through_biopb_pyarrow_and_tessera_get(
    start_server, data, monkeypatch, tmp_path
):
    directory, expected = data
    server = serve(start_server, directory, "zstd")
    upload_labels(server, expected[LABELS])
    assert body_bytes(server) == {"raw": 0, "zstd": 0}

    biopb_reads(server, expected, monkeypatch, mmap=False)
    sent = body_bytes(server)
    assert sent["raw"] == 0 and sent["zstd"] > 0, sent
    biopb_reads(server, expected, monkeypatch, mmap=True)
    for name, arr in expected.items():
        pyarrow_reads(server, name, arr)

    # Label runs shrink: each chunk's values buffer is a zstd frame after its length.
    for body, raw in raw_bodies(server, LABELS, expected[LABELS]):
        assert struct.pack("<q", len(raw)) + ZSTD_MAGIC in body
        assert len(body) * 10 < len(raw), (len(body), len(raw))
    # Noise does not: its values buffer is stored raw, length -1, inside the zstd message.
    for body, raw in raw_bodies(server, "noise", expected["noise"]):
        assert struct.pack("<q", -1) + raw in body
    sent = body_bytes(server)
    assert sent["raw"] == 0, sent

    out = tmp_path / "got.npy"
    for name in ("pixels", "noise", LABELS):
        done = subprocess.run(
            [tessera_bin(), "get", server.location, name, "-o", out, "--no-mmap"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "TESSERA_TOKEN": TOKEN},
        )
        assert done.returncode == 0, done.stderr
        got = np.load(out)
        assert got.dtype == expected[name].dtype
        assert got.tobytes() == expected[name].tobytes(), name
    assert body_bytes(server)["raw"] == 0


def test_off_sends_raw_bodies(start_server, data, monkeypatch):
    directory, expected = data
    server = serve(start_server, directory, "off")
    upload_labels(server, expected[LABELS])
    biopb_reads(server, expected, monkeypatch, mmap=False)
    pyarrow_reads(server, LABELS, expected[LABELS])
    for body, raw in raw_bodies(server, LABELS, expected[LABELS]):
        assert raw in body
    sent = body_bytes(server)
    assert sent["zstd"] == 0 and sent["raw"] > 0, sent


def test_auto_leaves_loopback_raw(start_server, data, monkeypatch):
    directory, expected = data
    server = serve(start_server, directory, "auto")
    upload_labels(server, expected[LABELS])
    biopb_reads(server, expected, monkeypatch, mmap=False)
    pyarrow_reads(server, LABELS, expected[LABELS])
    sent = body_bytes(server)
    assert sent["zstd"] == 0 and sent["raw"] > 0, sent


def ip(*args):
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def machine_address():
    """An IPv4 address of this machine other than loopback: one it has, else one on a dummy
    interface made for the test (removed afterwards)."""
    require(shutil.which("ip") is not None, "needs iproute2's `ip`")
    for line in ip("-4", "-o", "addr", "show").splitlines():
        address = line.split()[3].split("/")[0]
        if not address.startswith("127."):
            yield address
            return
    require(os.geteuid() == 0, "needs root to add a dummy interface (no other IPv4 address)")
    name = f"tsrw{os.getpid() % 10000}"
    address = f"10.{random.randrange(200, 250)}.{random.randrange(256)}.1"
    ip("link", "add", name, "type", "dummy")
    try:
        ip("addr", "add", f"{address}/32", "dev", name)
        ip("link", "set", name, "up")
        yield address
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True)


def test_auto_compresses_labels_for_a_peer_off_loopback(start_server, data, monkeypatch, machine_address):
    directory, expected = data
    server = serve(start_server, directory, "auto", listen=f"{machine_address}:0")
    assert machine_address in server.location
    upload_labels(server, expected[LABELS])
    assert body_bytes(server) == {"raw": 0, "zstd": 0}

    biopb_reads(server, {LABELS: expected[LABELS]}, monkeypatch, mmap=True)
    pyarrow_reads(server, LABELS, expected[LABELS])
    sent = body_bytes(server)
    assert sent["raw"] == 0 and sent["zstd"] > 0, sent
    for body, raw in raw_bodies(server, LABELS, expected[LABELS]):
        assert struct.pack("<q", len(raw)) + ZSTD_MAGIC in body

    # Noise does not shrink in the sample: sent raw.
    before = body_bytes(server)
    biopb_reads(server, {"noise": expected["noise"]}, monkeypatch, mmap=False)
    after = body_bytes(server)
    assert after["zstd"] == before["zstd"], (before, after)
    assert after["raw"] >= expected["noise"].nbytes, after
    # Microscopy-like pixels shrink, but this peer's link is this machine's own (GB/s, or not
    # measured yet on so few bytes): raw (slow links: test_wire_compression_rate.py).
    before = after["zstd"]
    biopb_reads(server, {"pixels": expected["pixels"]}, monkeypatch, mmap=False)
    assert body_bytes(server)["zstd"] == before
