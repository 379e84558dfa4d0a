"""Sources in an S3-compatible object store (`tessera serve s3://BUCKET/PREFIX/`), against
moto's S3 server on loopback: the unmodified biopb client reads `.npy` objects (C and
Fortran order) and Zarr v2 and v3 stores written by zarr-python, exact, on both routes; a
truncated object and a missing bucket are refused by name while the rest serves; a
replaced object gets new chunk ids; a denied credential is refused by name; with the store
stopped, cached cells keep serving and the others fail UNAVAILABLE naming the store."""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient, descriptor_pb2

boto3 = pytest.importorskip("boto3") if os.environ.get("CI") != "true" else __import__("boto3")
zarr = pytest.importorskip("zarr") if os.environ.get("CI") != "true" else __import__("zarr")

BUCKET = "tessera-lab"
PREFIX = "exp/"
SECRET = "s3cr3t-never-logged"
KEYS = {"AWS_ACCESS_KEY_ID": "tessera-test", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1"}
GRID = ("--chunk-target", "6KiB")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Moto:
    """moto's S3 server in its own process on a loopback port."""

    def __init__(self, tmp_path):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp_path / f"moto-{self.port}.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1)
                break
            except OSError:
                assert self.proc.poll() is None, "moto_server exited"
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, **{
            "aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"})

    def env(self, **more):
        """The environment a Tessera reading this store gets (no secret on its command line)."""
        return {**KEYS, "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true", **more}

    def put(self, key, body):
        self.s3.put_object(Bucket=BUCKET, Key=key, Body=body)

    def require_auth(self):
        """From now on moto checks credentials: unknown access keys are refused (403)."""
        req = urllib.request.Request(self.endpoint + "/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(req, timeout=5)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture
def moto(tmp_path):
    m = Moto(tmp_path)
    yield m
    m.stop()


def npy_bytes(arr):
    import io

    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def upload_zarr(moto, tmp_path, name, arr, chunks, zarr_format):
    local = tmp_path / name
    z = zarr.create_array(store=str(local), shape=arr.shape, chunks=chunks, dtype=arr.dtype,
                          zarr_format=zarr_format)
    z[...] = arr
    for path in sorted(local.rglob("*")):
        if path.is_file():
            moto.put(PREFIX + name + "/" + path.relative_to(local).as_posix(), path.read_bytes())


@pytest.fixture
def filled(moto, tmp_path, arrays):
    """The bucket: three .npy objects, a Zarr v2 and a Zarr v3 store, a truncated object."""
    moto.s3.create_bucket(Bucket=BUCKET)
    expected = {}
    for name in ("u16_stack", "be_i2", "fortran", "f64_1d"):
        moto.put(f"{PREFIX}{name}.npy", npy_bytes(arrays[name]))
        expected[name] = arrays[name]
    rng = np.random.default_rng(3)
    v2 = rng.integers(0, 60000, (40, 50, 30), dtype="<u2")
    v3 = rng.standard_normal((64, 48)).astype("<f4")
    upload_zarr(moto, tmp_path, "v2.zarr", v2, (10, 25, 30), 2)
    upload_zarr(moto, tmp_path, "v3.zarr", v3, (16, 16), 3)
    expected["v2"], expected["v3"] = v2, v3
    whole = npy_bytes(np.arange(1000, dtype="<i4"))
    moto.put(f"{PREFIX}broken.npy", whole[: len(whole) - 100])
    return expected


def biopb_client(location, mode, monkeypatch):
    if mode == "do_get":
        monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    else:
        monkeypatch.delenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", raising=False)
    return TensorFlightClient(location, cache_bytes=0)


def read_all(client, expected):
    for name, arr in expected.items():
        whole = client.get_tensor(name).compute()
        assert whole.dtype == arr.dtype, name
        assert whole.tobytes() == np.ascontiguousarray(arr).tobytes(), name
        sl = tuple(slice(d // 3, max(d // 3 + 1, (2 * d) // 3)) for d in arr.shape)
        got = client.get_tensor(name, slice_hint=sl).compute()
        assert got.tobytes() == np.ascontiguousarray(arr[sl]).tobytes(), (name, sl)


def read_image(client, local, base):
    """The OME-Zarr image `cells` and its native levels, by scale_hint and by their own ids,
    as zarr-python reads them from the local copy `local`; a slice of level 0 as `base`."""
    import zarr

    for i in range(3):
        want = zarr.open_array(str(local / str(i)), mode="r")[...]
        got = client.get_tensor("cells", scale_hint=[1, 2 ** i, 2 ** i],
                                reduction_method="precompute").compute()
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), i
        assert client.get_tensor(f"cells.{i}").compute().tobytes() == want.tobytes(), i
    sl = (slice(1, 4), slice(20, 101), slice(8, 140))
    assert client.get_tensor("cells", slice_hint=sl).compute().tobytes() == base[sl].tobytes()


def assert_route(client, mode):
    """Every read of `client` went the route `mode` names (its own counters)."""
    stats = client.cache_stats()
    if mode == "mmap":
        assert stats["locates"] > 0 and stats["do_gets"] == 0, stats
    else:
        assert stats["do_gets"] > 0 and stats["locates"] == 0, stats


def plan(client, array_id):
    opt = descriptor_pb2.TensorReadOption(array_id=array_id)
    opt.fields.paths.append("endpoints")
    req = descriptor_pb2.FlightRequest(tensor_read=opt)
    return client.get_flight_info(flight.FlightDescriptor.for_command(req.SerializeToString()))


def log_text(server):
    return "".join(server.log)


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_objects_and_zarr_stores_read_exact_and_bad_ones_are_refused_by_name(
    mode, monkeypatch, start_server, moto, filled
):
    server = start_server(f"s3://{BUCKET}/{PREFIX}", "s3://no-such-bucket-here/x/",
                          extra=GRID, env=moto.env())
    client = biopb_client(server.location, mode, monkeypatch)
    rows = client.query("SELECT source_id, source_url, is_resolved, unresolved_reason FROM sources").to_pylist()
    by_id = {r["source_id"]: r for r in rows}
    assert set(filled) <= set(by_id), by_id
    assert by_id["v2"]["source_url"] == f"s3://{BUCKET}/{PREFIX}v2.zarr"
    broken = by_id["broken"]
    assert not broken["is_resolved"]
    assert f"s3://{BUCKET}/{PREFIX}broken.npy" in broken["unresolved_reason"], broken
    assert "truncated" in broken["unresolved_reason"], broken

    read_all(client, filled)
    read_all(biopb_client(server.location, mode, monkeypatch), filled)
    assert_route(client, mode)
    log = log_text(server)
    assert "s3://no-such-bucket-here/x/" in log and "NoSuchBucket" in log, log[-3000:]
    assert SECRET not in log


def test_a_replaced_object_gets_new_chunk_ids(start_server, moto, filled, monkeypatch):
    server = start_server(f"s3://{BUCKET}/{PREFIX}", extra=GRID + ("--object-store-rescan", "300ms"),
                          env=moto.env())
    raw = flight.connect(server.location)
    before = [ep.ticket.ticket for ep in plan(raw, "u16_stack").endpoints]
    monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    client = TensorFlightClient(server.location, cache_bytes=0)
    assert client.get_tensor("u16_stack").compute().tobytes() == filled["u16_stack"].tobytes()

    second = filled["u16_stack"][::-1].copy() + 7
    moto.put(f"{PREFIX}u16_stack.npy", npy_bytes(second))
    deadline = time.monotonic() + 20
    while True:
        after = [ep.ticket.ticket for ep in plan(raw, "u16_stack").endpoints]
        if not set(after) & set(before):
            break
        assert time.monotonic() < deadline, "the server kept the old chunk ids"
        time.sleep(0.2)
    # moto's listing may show the replaced object's new time before its new ETag: a read
    # then is of the old bytes (read with If-Match on the ETag listed), under ids of their
    # own; a later listing gives the new bytes theirs. Every read is one version, whole.
    while True:
        got = TensorFlightClient(server.location, cache_bytes=0).get_tensor("u16_stack").compute()
        if got.tobytes() == second.tobytes():
            break
        assert got.tobytes() == filled["u16_stack"].tobytes(), "a read mixed two versions"
        assert time.monotonic() < deadline, "the new bytes were never served"
        time.sleep(0.2)
    # A ticket of the old bytes is refused, never answered with the new ones.
    with pytest.raises(flight.FlightError):
        raw.do_get(flight.Ticket(before[len(before) // 2])).read_all()


def test_a_denied_credential_is_refused_by_name_and_the_rest_serves(
    start_server, moto, filled, fixture_dir, arrays, monkeypatch
):
    moto.require_auth()
    server = start_server(f"s3://{BUCKET}/{PREFIX}", fixture_dir, extra=GRID, env=moto.env())
    log = log_text(server)
    assert f"s3://{BUCKET}/{PREFIX}" in log and "denied access" in log, log[-3000:]
    assert "InvalidAccessKeyId" in log or "403" in log, log[-3000:]
    monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    client = TensorFlightClient(server.location, cache_bytes=0)
    assert client.get_tensor("be_i2").compute().tobytes() == arrays["be_i2"].tobytes()
    ids = set(client.query("SELECT source_id FROM sources").column("source_id").to_pylist())
    assert "v2" not in ids and "u16_stack" in ids


def test_with_the_store_stopped_cached_cells_serve_and_others_are_unavailable(
    start_server, moto, filled, monkeypatch
):
    server = start_server(f"s3://{BUCKET}/{PREFIX}", extra=GRID, env=moto.env())
    monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    client = TensorFlightClient(server.location, cache_bytes=0)
    assert client.get_tensor("u16_stack").compute().tobytes() == filled["u16_stack"].tobytes()
    raw = flight.connect(server.location)
    cold = {name: plan(raw, name) for name in ("f64_1d", "v2")}
    moto.stop()

    again = TensorFlightClient(server.location, cache_bytes=0).get_tensor("u16_stack").compute()
    assert again.tobytes() == filled["u16_stack"].tobytes()
    for name, info in cold.items():
        # A middle cell: a plan of a cold tensor decodes its first and last cells at once.
        assert len(info.endpoints) >= 3, (name, len(info.endpoints))
        with pytest.raises(flight.FlightUnavailableError) as refused:
            raw.do_get(info.endpoints[len(info.endpoints) // 2].ticket).read_all()
        message = str(refused.value)
        assert f"s3://{BUCKET}" in message and "unreachable" in message, (name, message)


def write_ome(path, base, version):
    """An OME-Zarr image written with zarr-python: three levels (1, 2, 4 in y and x), NGFF
    0.4 (Zarr v2, `.zattrs`) or 0.5 (Zarr v3, `zarr.json` attributes `ome`), physical
    scales and axis units, a channel name."""
    fmt = 2 if version == "0.4" else 3
    root = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    datasets = []
    for i in range(3):
        level = np.ascontiguousarray(base[:, :: 2 ** i, :: 2 ** i])
        a = root.create_array(str(i), shape=level.shape, chunks=(2, 32, 32), dtype=level.dtype)
        a[...] = level
        datasets.append({"path": str(i), "coordinateTransformations": [
            {"type": "scale", "scale": [2.0, 0.325 * 2 ** i, 0.325 * 2 ** i]}]})
    ms = {"axes": [{"name": n, "type": "space", "unit": "micrometer"} for n in "zyx"],
          "datasets": datasets, "name": "cells"}
    omero = {"channels": [{"label": "DAPI", "color": "0000FF"}]}
    if version == "0.4":
        root.attrs.update({"multiscales": [{**ms, "version": "0.4"}], "omero": omero})
    else:
        root.attrs.update({"ome": {"version": "0.5", "multiscales": [ms], "omero": omero}})


def upload_dir(moto, local, key_prefix):
    for path in sorted(local.rglob("*")):
        if path.is_file():
            moto.put(key_prefix + path.relative_to(local).as_posix(), path.read_bytes())


@pytest.mark.parametrize("version", ["0.4", "0.5"])
@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_an_ome_zarr_image_is_one_tensor_with_its_native_levels(
    version, mode, monkeypatch, start_server, moto, tmp_path
):
    moto.s3.create_bucket(Bucket=BUCKET)
    base = np.random.default_rng(5).integers(0, 60000, (5, 130, 150), dtype="<u2")
    local = tmp_path / "data" / "local.zarr"
    write_ome(local, base, version)
    upload_dir(moto, local, f"{PREFIX}cells.zarr/")
    server = start_server(f"s3://{BUCKET}/{PREFIX}", tmp_path / "data", extra=("--chunk-target", "40KiB"),
                          env=moto.env())
    client = biopb_client(server.location, mode, monkeypatch)
    rows = client.query("SELECT source_id, source_url FROM sources").to_pylist()
    by_id = {r["source_id"]: r["source_url"] for r in rows}
    assert by_id["cells"] == f"s3://{BUCKET}/{PREFIX}cells.zarr", by_id

    # Advertised as the local copy is: labels, native levels, physical scale, metadata.
    remote = client.get_descriptor("cells", with_metadata=True)
    near = client.get_descriptor("local", with_metadata=True)
    assert list(remote.dim_labels) == list(near.dim_labels) == ["z", "y", "x"]
    assert [list(p.scale_hint) for p in remote.pyramid] == [[1, 1, 1], [1, 2, 2], [1, 4, 4]]
    assert all(p.native and p.reduction_method == "precompute" for p in remote.pyramid)
    assert [(list(p.scale_hint), tuple(p.shape), p.native) for p in remote.pyramid] == \
        [(list(p.scale_hint), tuple(p.shape), p.native) for p in near.pyramid]
    assert list(remote.physical_scale) == pytest.approx(list(near.physical_scale))
    assert list(remote.physical_unit) == list(near.physical_unit)
    meta = json.loads(remote.metadata_json)
    assert meta["format"] == "ome-zarr" and meta["channel_names"] == ["DAPI"], meta
    assert meta["ngff_version"] == version

    # Every level, by scale_hint and by its own id, exactly as zarr-python reads it.
    for i in range(3):
        want = zarr.open_array(str(local / str(i)), mode="r")[...]
        got = client.get_tensor("cells", scale_hint=[1, 2 ** i, 2 ** i], reduction_method="precompute").compute()
        assert got.dtype == want.dtype and np.array_equal(got, want), (version, i)
        assert np.array_equal(client.get_tensor(f"cells.{i}").compute(), want), (version, i)
    sl = (slice(1, 4), slice(20, 101), slice(8, 140))
    got = client.get_tensor("cells", slice_hint=sl).compute()
    assert np.array_equal(got, base[sl])
    assert_route(client, mode)

    # An address naming the store itself: the image keeps its name, its levels theirs.
    if mode == "do_get":
        one = start_server(f"s3://{BUCKET}/{PREFIX}cells.zarr", extra=("--chunk-target", "40KiB"),
                           env=moto.env())
        direct = biopb_client(one.location, mode, monkeypatch)
        ids = set(direct.query("SELECT source_id FROM sources").column("source_id").to_pylist())
        assert {"cells", "cells.0", "cells.1", "cells.2"} <= ids, ids
        want = zarr.open_array(str(local / "2"), mode="r")[...]
        got = direct.get_tensor("cells", scale_hint=[1, 4, 4], reduction_method="precompute").compute()
        assert np.array_equal(got, want)


def test_add_source_serves_an_address_under_an_allowed_prefix_and_refuses_others(
    start_server, moto, filled, tmp_path, arrays, monkeypatch
):
    local = tmp_path / "local"
    local.mkdir()
    np.save(local / "bool.npy", arrays["bool"])
    server = start_server(local, extra=GRID + ("--add-source-store-root", f"s3://{BUCKET}/{PREFIX}"),
                          env=moto.env())
    monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    client = TensorFlightClient(server.location, cache_bytes=0)
    ids = set(client.query("SELECT source_id FROM sources").column("source_id").to_pylist())
    assert "v2" not in ids and "bool" in ids

    result = client.register_local_path(f"s3://{BUCKET}/{PREFIX}")
    assert set(result.added) == set(filled), result
    failed = {f.path: f.reason for f in result.failed}
    assert "broken" in failed and "truncated" in failed["broken"], failed
    read_all(client, filled)
    rows = client.query("SELECT source_id, source_url FROM sources").to_pylist()
    assert {r["source_id"]: r["source_url"] for r in rows}["v3"] == f"s3://{BUCKET}/{PREFIX}v3.zarr"

    # Again: listed again, nothing new; a deleted object is removed.
    moto.s3.delete_object(Bucket=BUCKET, Key=f"{PREFIX}f64_1d.npy")
    again = client.register_local_path(f"s3://{BUCKET}/{PREFIX}")
    assert not again.added and list(again.removed) == ["f64_1d"], again

    # Outside the allowed prefix, and a scheme that cannot be listed: refused by name.
    with pytest.raises(flight.FlightServerError, match="add_source_store_roots") as outside:
        client.register_local_path(f"s3://{BUCKET}/other/")
    assert f"s3://{BUCKET}/other/" in str(outside.value)
    with pytest.raises(flight.FlightServerError, match="cannot be listed"):
        client.register_local_path("https://127.0.0.1:9/data/")
    np.testing.assert_array_equal(client.get_tensor("bool").compute(), arrays["bool"])


def test_add_source_of_an_address_is_refused_without_a_store_root(start_server, moto, filled, fixture_dir):
    server = start_server(fixture_dir, extra=("--add-source-root", str(fixture_dir)), env=moto.env())
    client = TensorFlightClient(server.location, cache_bytes=0)
    with pytest.raises(flight.FlightServerError, match="--add-source-store-root"):
        client.register_local_path(f"s3://{BUCKET}/{PREFIX}")
