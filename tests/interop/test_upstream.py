"""A node-local Tessera in front of an origin (`tessera serve grpc://origin:PORT`): the
unmodified biopb client reads the origin's tensors through it, exact, on both routes;
each origin chunk crosses the link once; a changed origin tensor gets new chunk ids; with
the origin stopped, cached chunks keep serving and the others fail UNAVAILABLE naming
the origin. The same reads with biopb's own server as the origin."""
import os
import pathlib
import re
import socket
import sys
import time
import urllib.request

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient, descriptor_pb2

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Small chunks so every fixture is many chunks; the origin cuts one grid for both routes,
# so the chunks the node fetches are the chunks a direct reader of the origin gets.
ORIGIN_GRID = ("--chunk-target", "6KiB", "--mapped-chunk-target", "0")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan(client, array_id):
    opt = descriptor_pb2.TensorReadOption(array_id=array_id)
    opt.fields.paths.append("endpoints")
    req = descriptor_pb2.FlightRequest(tensor_read=opt)
    return client.get_flight_info(flight.FlightDescriptor.for_command(req.SerializeToString()))


def origin_do_gets(metrics_addr):
    """DoGet calls the origin answered OK, from its /metrics."""
    text = urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=10).read().decode()
    total = 0
    for line in text.splitlines():
        if line.startswith("tessera_grpc_calls_total{") and 'method="DoGet"' in line and 'code="OK"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def biopb_client(location, mode, monkeypatch):
    if mode == "do_get":
        monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    else:
        monkeypatch.delenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", raising=False)
    return TensorFlightClient(location, cache_bytes=0)


def read_all(client, arrays):
    for name, expected in arrays.items():
        whole = client.get_tensor(name).compute()
        assert whole.dtype == expected.dtype, name
        assert whole.tobytes() == np.ascontiguousarray(expected).tobytes(), name
        sl = tuple(slice(d // 3, max(d // 3 + 1, (2 * d) // 3)) for d in expected.shape)
        got = client.get_tensor(name, slice_hint=sl).compute()
        assert got.tobytes() == np.ascontiguousarray(expected[sl]).tobytes(), (name, sl)


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_a_node_local_server_reads_the_origin_exact_and_fetches_each_chunk_once(
    mode, monkeypatch, start_server, fixture_dir, arrays
):
    metrics = f"127.0.0.1:{free_port()}"
    origin = start_server(fixture_dir, extra=ORIGIN_GRID + ("--metrics-listen", metrics))
    node = start_server(origin.location, extra=("--chunk-target", "6KiB"))
    raw = flight.connect(origin.location)
    origin_chunks = {name: len(plan(raw, name).endpoints) for name in arrays}
    assert origin_do_gets(metrics) == 0

    client = biopb_client(node.location, mode, monkeypatch)
    listed = set(client.query("SELECT array_id FROM tensors").column("array_id").to_pylist())
    assert set(arrays) <= listed, listed
    read_all(client, arrays)
    # Read again through a second client: everything is local now.
    read_all(biopb_client(node.location, mode, monkeypatch), arrays)
    fetched = origin_do_gets(metrics)
    assert fetched == sum(origin_chunks.values()), (fetched, origin_chunks)

    stats = client.cache_stats()
    if mode == "mmap":
        assert stats["locates"] > 0 and stats["do_gets"] == 0, stats
    else:
        assert stats["do_gets"] > 0 and stats["locates"] == 0, stats

    # What the origin says a tensor is, the node says too.
    direct = TensorFlightClient(origin.location, cache_bytes=0)
    for name in ("u16_stack", "be_i2", "f32_4d"):
        there, here = direct.get_descriptor(name), client.get_descriptor(name)
        for field in ("shape", "dtype", "dim_labels", "physical_scale"):
            assert getattr(here, field, None) == getattr(there, field, None), (name, field)


def write_ome_zarr(path, levels):
    """An NGFF 0.4 image (Zarr v2) of the given `levels` (full resolution first), written by
    zarr-python, in chunks small enough that every level is several."""
    import zarr

    root = zarr.open_group(path, mode="w", zarr_format=2)
    datasets = []
    for i, level in enumerate(levels):
        root.create_array(str(i), shape=level.shape, chunks=(2, 16, 16), dtype=level.dtype)[...] = level
        factors = [levels[0].shape[k] / level.shape[k] for k in range(level.ndim)]
        datasets.append({"path": str(i), "coordinateTransformations": [{"type": "scale", "scale": factors}]})
    axes = [{"name": n, "type": "space"} for n in ("z", "y", "x")]
    root.attrs.update({"multiscales": [{"version": "0.4", "axes": axes, "datasets": datasets}]})


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_the_origins_stored_levels_are_the_nodes_pyramid(mode, monkeypatch, start_server, tmp_path):
    """An OME-Zarr image on the origin: the node advertises its stored levels as native and
    reads each from the origin's level, never reduced locally (the levels here are not
    any reduction of full resolution, so a level computed on the node would differ)."""
    rng = np.random.default_rng(32)
    levels = [rng.integers(0, 60000, shape, dtype=np.uint16) for shape in ((4, 64, 48), (4, 32, 24), (4, 16, 12))]
    data = tmp_path / "origin"
    data.mkdir()
    write_ome_zarr(data / "cells.zarr", levels)
    metrics = f"127.0.0.1:{free_port()}"
    origin = start_server(data, extra=ORIGIN_GRID + ("--metrics-listen", metrics))
    node = start_server(origin.location, extra=("--chunk-target", "6KiB"))
    client = biopb_client(node.location, mode, monkeypatch)
    desc = client.get_descriptor("cells")
    there = TensorFlightClient(origin.location, cache_bytes=0).get_descriptor("cells")
    assert [(list(p.scale_hint), list(p.shape), p.native, p.reduction_method) for p in desc.pyramid] == [
        (list(p.scale_hint), list(p.shape), p.native, p.reduction_method) for p in there.pyramid
    ]
    assert [list(p.scale_hint) for p in desc.pyramid] == [[1, 1, 1], [1, 2, 2], [1, 4, 4]]
    fetched = []
    for _ in range(2):
        for i, level in enumerate(levels):
            factors = [1, 2**i, 2**i]
            got = client.get_tensor("cells", scale_hint=factors, reduction_method="precompute").compute()
            assert got.tobytes() == level.tobytes(), (mode, i)
            if i:
                assert client.get_tensor(f"cells.{i}").compute().tobytes() == level.tobytes(), (mode, i)
        sl = (slice(1, 3), slice(5, 30), slice(2, 20))
        got = client.get_tensor("cells", slice_hint=sl, scale_hint=[1, 4, 4], reduction_method="precompute").compute()
        assert got.tobytes() == np.ascontiguousarray(levels[2][1:3, 1:8, 0:5]).tobytes()
        fetched.append(origin_do_gets(metrics))
    # The second round crossed the link for nothing: every level chunk is cached.
    assert fetched[0] > 0 and fetched[1] == fetched[0], fetched


def test_readers_at_once_cross_the_link_once(start_server, fixture_dir, arrays, monkeypatch):
    """Eight readers of one cold tensor at once: each origin chunk is fetched once."""
    monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    import concurrent.futures

    metrics = f"127.0.0.1:{free_port()}"
    origin = start_server(fixture_dir, extra=ORIGIN_GRID + ("--metrics-listen", metrics))
    node = start_server(origin.location, extra=("--chunk-target", "6KiB"))
    chunks = len(plan(flight.connect(origin.location), "u16_stack").endpoints)
    expected = arrays["u16_stack"].tobytes()

    def read(_):
        return TensorFlightClient(node.location, cache_bytes=0).get_tensor("u16_stack").compute().tobytes()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert all(got == expected for got in pool.map(read, range(8)))
    assert origin_do_gets(metrics) == chunks


def test_a_changed_origin_tensor_gets_new_chunk_ids(start_server, tmp_path):
    data = tmp_path / "origin"
    data.mkdir()
    first = np.arange(40 * 50, dtype="<u2").reshape(40, 50)
    np.save(data / "a.npy", first)
    origin = start_server(data, extra=ORIGIN_GRID)
    node = start_server(origin.location, extra=("--chunk-target", "6KiB", "--upstream-poll", "200ms"))
    raw = flight.connect(node.location)
    before = [ep.ticket.ticket for ep in plan(raw, "a").endpoints]
    client = TensorFlightClient(node.location, cache_bytes=0)
    assert client.get_tensor("a").compute().tobytes() == first.tobytes()

    second = first[::-1].copy() + 7
    np.save(data / "a.tmp.npy", second)
    os.replace(data / "a.tmp.npy", data / "a.npy")
    deadline = time.monotonic() + 20
    while True:
        after = [ep.ticket.ticket for ep in plan(raw, "a").endpoints]
        if not set(after) & set(before):
            break
        assert time.monotonic() < deadline, "the node kept the old chunk ids"
        time.sleep(0.2)
    got = TensorFlightClient(node.location, cache_bytes=0).get_tensor("a").compute()
    assert got.tobytes() == second.tobytes()
    # A ticket of the old bytes is refused, never answered with the new ones.
    with pytest.raises(flight.FlightError):
        raw.do_get(flight.Ticket(before[0])).read_all()


def test_with_the_origin_down_cached_chunks_serve_and_others_are_unavailable(
    start_server, fixture_dir, arrays, monkeypatch
):
    origin = start_server(fixture_dir, extra=ORIGIN_GRID)
    node = start_server(origin.location, extra=("--chunk-target", "6KiB"))
    upstream = origin.location
    monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    client = TensorFlightClient(node.location, cache_bytes=0)
    assert client.get_tensor("u16_stack").compute().tobytes() == arrays["u16_stack"].tobytes()
    raw = flight.connect(node.location)
    cold = plan(raw, "f64_1d")
    assert origin.stop() == 0

    again = TensorFlightClient(node.location, cache_bytes=0).get_tensor("u16_stack").compute()
    assert again.tobytes() == arrays["u16_stack"].tobytes()
    with pytest.raises(flight.FlightUnavailableError) as refused:
        # A middle cell: a plan of a cold tensor decodes its first and last cells at once
        # (docs/decisions/0022).
        raw.do_get(cold.endpoints[len(cold.endpoints) // 2].ticket).read_all()
    message = str(refused.value)
    assert "upstream" in message and upstream.removeprefix("grpc://") in message, message


def reference_server():
    sys.path.insert(0, str(ROOT / "benches" / "reference"))
    import biopb_reference

    return biopb_reference


def test_biopb_server_as_the_origin(monkeypatch, start_server, tmp_path, arrays):
    ref = reference_server()
    try:
        binary = ref.ensure_installed()
    except Exception as err:  # noqa: BLE001
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"biopb's reference server is not installed: {err}")
    data = tmp_path / "ref-data"
    data.mkdir()
    picked = {k: arrays[k] for k in ("u16_stack", "f64_1d", "u8_rgb")}
    for name, arr in picked.items():
        np.save(tmp_path / f"{name}.npy", arr)
        ref.write_zarr_v2(tmp_path / f"{name}.npy", data / f"{name}.zarr", 6 << 10, tmp_path / "zstate")
    server = ref.ReferenceServer(binary, data, tmp_path / "ref", tmp_path / "ref-cache", min_sources=len(picked))
    try:
        node = start_server(server.location, extra=("--chunk-target", "6KiB"))
        direct = TensorFlightClient(server.location, cache_bytes=0)
        rows = direct.query("SELECT source_id, source_url FROM sources").to_pylist()
        ids = {pathlib.Path(r["source_url"]).stem: r["source_id"] for r in rows if r["source_url"].endswith(".zarr")}
        assert set(picked) <= set(ids), rows
        for mode in ("do_get", "mmap"):
            client = biopb_client(node.location, mode, monkeypatch)
            for name, expected in picked.items():
                got = client.get_tensor(ids[name]).compute()
                assert got.tobytes() == np.ascontiguousarray(expected).tobytes(), (mode, name)
                sl = tuple(slice(d // 3, max(d // 3 + 1, (2 * d) // 3)) for d in expected.shape)
                part = client.get_tensor(ids[name], slice_hint=sl).compute()
                assert part.tobytes() == np.ascontiguousarray(expected[sl]).tobytes(), (mode, name)
    finally:
        server.stop()
