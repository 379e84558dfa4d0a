"""Zarr v2/v3 and OME-Zarr stores served with no conversion: fixtures written at test time by
zarr-python and numcodecs, read through the unmodified biopb 0.13.0 client on both routes
(do_get and the mmap fast path) and compared with zarr-python's own reads; native pyramids
of OME-Zarr 0.4 and 0.5; groups; every refusal by name; a rewritten chunk."""
import json
import time

import numcodecs
import numpy as np
import pyarrow.flight as flight
import pytest
import zarr
from biopb.tensor import TensorFlightClient, descriptor_pb2
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec

RNG = np.random.default_rng(30)
SHAPE = (9, 70, 110)


def _u16():
    return RNG.integers(0, 4000, SHAPE, dtype=np.uint16)


def v2(path, data, chunks=(4, 32, 48), compressor=None, filters=None, order="C", fill_value=0):
    z = zarr.create_array(
        path, shape=data.shape, chunks=chunks, dtype=data.dtype, zarr_format=2,
        compressors=compressor, filters=filters, order=order, fill_value=fill_value,
    )
    z[...] = data
    return z


def v3(path, data, chunks=(4, 32, 48), codecs=None, shards=None, fill_value=0, filters=None):
    z = zarr.create_array(
        path, shape=data.shape, chunks=chunks, shards=shards, dtype=data.dtype, zarr_format=3,
        compressors=codecs if codecs is not None else "auto", serializer="auto",
        filters=filters if filters is not None else "auto", fill_value=fill_value,
    )
    z[...] = data
    return z


def _stores(d):
    """Every codec, layout and dtype the issue names, one store each."""
    stores = {}
    stores["v2_blosc_lz4_shuffle"] = v2(d / "v2_blosc_lz4_shuffle.zarr", _u16(), compressor=numcodecs.Blosc("lz4", shuffle=numcodecs.Blosc.SHUFFLE))
    stores["v2_blosc_zstd_bitshuffle"] = v2(d / "v2_blosc_zstd_bitshuffle.zarr", _u16(), compressor=numcodecs.Blosc("zstd", shuffle=numcodecs.Blosc.BITSHUFFLE))
    stores["v2_blosc_zlib"] = v2(d / "v2_blosc_zlib.zarr", _u16(), compressor=numcodecs.Blosc("zlib"))
    stores["v2_zstd"] = v2(d / "v2_zstd.zarr", _u16(), compressor=numcodecs.Zstd(level=3))
    stores["v2_gzip"] = v2(d / "v2_gzip.zarr", _u16(), compressor=numcodecs.GZip())
    stores["v2_zlib"] = v2(d / "v2_zlib.zarr", _u16(), compressor=numcodecs.Zlib())
    stores["v2_raw"] = v2(d / "v2_raw.zarr", _u16())
    stores["v2_big_endian_f_order"] = v2(d / "v2_big_endian_f_order.zarr", _u16().astype(">u2"), compressor=numcodecs.Blosc(), order="F")
    stores["v2_f8"] = v2(d / "v2_f8.zarr", RNG.standard_normal(SHAPE), compressor=numcodecs.Zstd())
    stores["v2_i1"] = v2(d / "v2_i1.zarr", RNG.integers(-128, 127, SHAPE, dtype=np.int8))
    stores["v3_default"] = v3(d / "v3_default.zarr", _u16())
    stores["v3_big_endian_crc32c"] = v3(d / "v3_big_endian_crc32c.zarr", _u16(), codecs=[Crc32cCodec()])
    stores["v3_blosc"] = v3(d / "v3_blosc.zarr", _u16(), codecs=[BloscCodec(cname="lz4", shuffle="bitshuffle")])
    stores["v3_gzip"] = v3(d / "v3_gzip.zarr", RNG.standard_normal(SHAPE).astype(np.float32), codecs=[GzipCodec()])
    stores["v3_transpose"] = v3(d / "v3_transpose.zarr", _u16(), filters=[TransposeCodec(order=(2, 1, 0))], codecs=[ZstdCodec()])
    stores["v3_sharded"] = v3(d / "v3_sharded.zarr", _u16(), chunks=(2, 16, 16), shards=(4, 64, 96), codecs=[ZstdCodec()])
    stores["v3_f2"] = v3(d / "v3_f2.zarr", RNG.standard_normal(SHAPE).astype(np.float16))
    stores["v3_c8"] = v3(d / "v3_c8.zarr", (RNG.standard_normal(SHAPE) + 1j).astype(np.complex64))
    stores["v3_bool"] = v3(d / "v3_bool.zarr", RNG.integers(0, 2, SHAPE).astype(bool))
    stores["v3_u64"] = v3(d / "v3_u64.zarr", RNG.integers(0, 2**63, SHAPE, dtype=np.uint64))
    # Big-endian bytes codec (v3): written by hand-picked serializer.
    be = zarr.create_array(d / "v3_bytes_big.zarr", shape=SHAPE, chunks=(4, 32, 48), dtype="u2",
                           zarr_format=3, serializer=BytesCodec(endian="big"), compressors=None)
    be[...] = _u16()
    stores["v3_bytes_big"] = be
    # Missing chunks read as the fill value (v2 and v3).
    m2 = zarr.create_array(d / "v2_missing.zarr", shape=SHAPE, chunks=(4, 32, 48), dtype="i4",
                           zarr_format=2, fill_value=-7)
    m2[0:4, 0:32, 0:48] = 5
    stores["v2_missing"] = m2
    m3 = zarr.create_array(d / "v3_missing.zarr", shape=SHAPE, chunks=(4, 32, 48), dtype="f4",
                           zarr_format=3, fill_value=1.5)
    m3[4:8, 32:64, 48:96] = 2.5
    stores["v3_missing"] = m3
    return stores


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("zarr")
    stores = _stores(d)
    return d, {name: np.asarray(z[...]) for name, z in stores.items()}


def _route(mode, monkeypatch):
    if mode == "do_get":
        monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    else:
        monkeypatch.delenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", raising=False)


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_every_codec_and_layout_reads_as_zarr_python_does(mode, monkeypatch, start_server, store_dir):
    _route(mode, monkeypatch)
    d, expected = store_dir
    # Small chunk targets: every read spans many cells, each whole store chunks.
    server = start_server(d, extra=("--chunk-target", "40KiB", "--mapped-chunk-target", "120KiB"))
    client = TensorFlightClient(server.location, cache_bytes=0)
    for name, want in expected.items():
        got = client.get_tensor(name).compute()
        assert got.shape == want.shape, name
        assert got.dtype == want.dtype.newbyteorder("<") or got.dtype == want.dtype, (name, got.dtype)
        assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"), name
        sl = (slice(2, 7), slice(10, 61), slice(33, 100))
        part = client.get_tensor(name, slice_hint=sl).compute()
        assert np.array_equal(part, want[sl], equal_nan=want.dtype.kind in "fc"), name
    stats = client.cache_stats()
    if mode == "mmap":
        assert stats["locates"] > 0 and stats["do_gets"] == 0, stats
    else:
        assert stats["do_gets"] > 0 and stats["locates"] == 0, stats


def test_cells_are_whole_store_chunks(start_server, store_dir):
    d, _ = store_dir
    server = start_server(d, extra=("--chunk-target", "40KiB", "--mapped-chunk-target", "40KiB"))
    client = TensorFlightClient(server.location)
    desc = client.get_descriptor("v3_sharded", with_metadata=True)
    meta = json.loads(desc.metadata_json)
    assert meta["format"] == "zarr" and meta["zarr_format"] == 3
    native = meta["zarr_chunks"]  # the shard shape: the unit zarrs decodes whole
    assert native == [4, 64, 96]
    for extent, n, dim in zip(desc.chunk_shape, native, SHAPE):
        assert extent % n == 0 or extent == dim, (desc.chunk_shape, native)


def _ome(path, levels, version, axes=("z", "y", "x"), units=("micrometer", "micrometer", "nanometer")):
    """An OME-Zarr image of `levels` written with zarr-python: NGFF 0.4 (Zarr v2, `.zattrs`)
    or 0.5 (Zarr v3, `zarr.json` attributes `ome`). Scales are physical sizes, not factors."""
    fmt = 2 if version == "0.4" else 3
    root = zarr.open_group(path, mode="w", zarr_format=fmt)
    datasets = []
    for i, level in enumerate(levels):
        a = root.create_array(str(i), shape=level.shape, chunks=(2, 32, 32), dtype=level.dtype)
        a[...] = level
        f = [levels[0].shape[k] / level.shape[k] for k in range(3)]
        datasets.append({
            "path": str(i),
            "coordinateTransformations": [{"type": "scale", "scale": [2.0 * f[0], 0.325 * f[1], 325.0 * f[2]]}],
        })
    ms = {
        "axes": [{"name": n, "type": "space", "unit": u} for n, u in zip(axes, units)],
        "datasets": datasets,
        "name": "cells",
    }
    omero = {"channels": [{"label": "DAPI", "color": "0000FF"}]}
    if version == "0.4":
        ms["version"] = "0.4"
        root.attrs.update({"multiscales": [ms], "omero": omero})
    else:
        root.attrs.update({"ome": {"version": "0.5", "multiscales": [ms], "omero": omero}})
    return root


def _pyramid(base):
    l1 = base[:, ::2, ::2]
    l2 = base[:, ::4, ::4]
    return [base, np.ascontiguousarray(l1), np.ascontiguousarray(l2)]


@pytest.mark.parametrize("version", ["0.4", "0.5"])
@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_ome_zarr_levels_are_a_native_pyramid(version, mode, monkeypatch, start_server, tmp_path):
    _route(mode, monkeypatch)
    d = tmp_path / "data"
    d.mkdir()
    levels = _pyramid(RNG.integers(0, 60000, (5, 130, 150), dtype=np.uint16))
    _ome(d / "cells.zarr", levels, version)
    server = start_server(d, extra=("--chunk-target", "40KiB"))
    client = TensorFlightClient(server.location, cache_bytes=0)
    desc = client.get_descriptor("cells", with_metadata=True)
    assert list(desc.dim_labels) == ["z", "y", "x"]
    assert [list(p.scale_hint) for p in desc.pyramid] == [[1, 1, 1], [1, 2, 2], [1, 4, 4]]
    assert all(p.native and p.reduction_method == "precompute" for p in desc.pyramid)
    assert [tuple(p.shape) for p in desc.pyramid] == [lv.shape for lv in levels]
    # Physical scale from NGFF scale and units, in micrometres (325 nm = 0.325 µm).
    assert list(desc.physical_scale) == pytest.approx([2.0, 0.325, 0.325])
    assert set(desc.physical_unit) == {"µm"}
    meta = json.loads(desc.metadata_json)
    assert meta["format"] == "ome-zarr" and meta["channel_names"] == ["DAPI"]
    assert np.array_equal(client.get_tensor("cells").compute(), levels[0])
    for i, level in enumerate(levels):
        factors = [1, 2 ** i, 2 ** i]
        got = client.get_tensor("cells", scale_hint=factors, reduction_method="precompute").compute()
        assert np.array_equal(got, level), (version, i)
        # Levels are also served under their own ids.
        assert np.array_equal(client.get_tensor(f"cells.{i}").compute(), level)
    # A sliced precompute read reads the stored level over the slice in its coordinates.
    sl = (slice(1, 4), slice(20, 101), slice(8, 140))
    got = client.get_tensor("cells", slice_hint=sl, scale_hint=[1, 4, 4], reduction_method="precompute").compute()
    want = levels[2][1:4, 20 // 4:-(-101 // 4), 8 // 4:-(-140 // 4)]
    assert np.array_equal(got, want)
    # A computed scaled read still works beside the stored levels.
    got = client.get_tensor("cells", scale_hint=[1, 2, 2], reduction_method="nearest").compute()
    assert np.array_equal(got, levels[0][:, ::2, ::2])
    with pytest.raises(Exception, match="no precomputed level matches"):
        client.get_tensor("cells", scale_hint=[1, 3, 3], reduction_method="precompute").compute()


def test_a_group_serves_each_array_under_its_path(start_server, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    g = zarr.open_group(d / "plate.zarr", mode="w", zarr_format=2)
    a = g.create_array("raw", shape=(30, 40), chunks=(10, 10), dtype="u2")
    a[...] = np.arange(1200, dtype=np.uint16).reshape(30, 40)
    sub = g.create_group("masks")
    b = sub.create_array("nuclei", shape=(30, 40), chunks=(30, 40), dtype="u4")
    b[...] = 3
    server = start_server(d)
    client = TensorFlightClient(server.location)
    assert np.array_equal(client.get_tensor("plate.raw").compute(), a[...])
    assert np.array_equal(client.get_tensor("plate.masks.nuclei").compute(), b[...])


def _write(path, name, text):
    path.mkdir(parents=True, exist_ok=True)
    (path / name).write_text(text)


def test_each_bad_store_is_refused_by_name_and_the_others_serve(start_server, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    good = v2(d / "good.zarr", _u16(), compressor=numcodecs.Zstd())
    lz4 = v2(d / "lz4.zarr", _u16(), compressor=numcodecs.LZ4())
    assert lz4.metadata.compressor.codec_id == "lz4"
    _write(d / "garbage.zarr", ".zarray", "{ this is not json")
    _write(d / "objects.zarr", ".zarray", json.dumps({
        "zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "|O", "compressor": None,
        "filters": None, "order": "C", "fill_value": None}))
    _write(d / "absurd.zarr", ".zarray", json.dumps({
        "zarr_format": 2, "shape": [2**40, 2**40], "chunks": [1024, 1024], "dtype": "<u2",
        "compressor": None, "filters": None, "order": "C", "fill_value": 0}))
    (d / "empty.zarr").mkdir()
    import tifffile
    tifffile.imwrite(d / "stack.tif", np.zeros((2, 8, 8), np.uint16))
    corrupt = v2(d / "corrupt.zarr", _u16(), compressor=numcodecs.Zstd())
    (d / "corrupt.zarr" / "0.0.0").write_bytes(b"\x00garbage, not zstd")
    # Cells of whole store chunks (4, 32, 48) on both routes, so a bad chunk fails its cells only.
    server = start_server(d, extra=("--chunk-target", "12KiB", "--mapped-chunk-target", "12KiB"))
    client = TensorFlightClient(server.location, cache_bytes=0)
    assert np.array_equal(client.get_tensor("good").compute(), good[...])
    # A TIFF beside the stores is served too (test_tiff_sources.py).
    assert client.get_tensor("stack").compute().shape == (2, 8, 8)
    reasons = {
        "lz4": "codec 'lz4', which this server does not read",
        "garbage": "metadata is not valid",
        "objects": "dtype '|O'",
        "absurd": "over the limit",
        "empty": "no Zarr metadata",
    }
    for name, needle in reasons.items():
        with pytest.raises(ValueError, match=name) as err:
            client.resolve_source(name)
        assert needle in str(err.value), (name, str(err.value))
        assert needle in "".join(server.log), name
    # A chunk that fails to decode fails that read by name; the rest of the store serves.
    with pytest.raises(Exception, match="corrupt"):
        client.get_tensor("corrupt", slice_hint=(slice(0, 1), slice(0, 1), slice(0, 1))).compute()
    tail = (slice(4, 9), slice(32, 70), slice(48, 110))
    assert np.array_equal(client.get_tensor("corrupt", slice_hint=tail).compute(), corrupt[tail])
    assert np.array_equal(client.get_tensor("good").compute(), good[...])


def _plan(client, array_id):
    opt = descriptor_pb2.TensorReadOption(array_id=array_id)
    opt.fields.paths.append("endpoints")
    req = descriptor_pb2.FlightRequest(tensor_read=opt)
    return client.get_flight_info(flight.FlightDescriptor.for_command(req.SerializeToString()))


def test_a_rewritten_chunk_gets_new_ids_and_old_tickets_are_refused(start_server, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    z = v2(d / "live.zarr", _u16(), chunks=(9, 70, 110), compressor=numcodecs.Zstd())
    server = start_server(d, extra=("--watch", "--watch-interval", "200ms"))
    client = TensorFlightClient(server.location, cache_bytes=0)
    before = client.get_tensor("live").compute()
    assert np.array_equal(before, z[...])
    raw = flight.connect(server.location)
    old = _plan(raw, "live")
    z[0, 0, 0] = 4321  # rewrites the one chunk file in place
    deadline = time.time() + 20
    while True:
        now = client.get_tensor("live").compute()
        if now[0, 0, 0] == 4321:
            break
        assert np.array_equal(now, before), "a read mixed old and new bytes"
        assert time.time() < deadline, "the rewritten chunk was never served"
        time.sleep(0.2)
    assert np.array_equal(now, z[...])
    with pytest.raises(flight.FlightError, match="plan"):
        raw.do_get(old.endpoints[0].ticket).read_all()


def test_an_hcs_plate_lists_its_field_images(start_server, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    plate = zarr.open_group(d / "screen.zarr", mode="w", zarr_format=2)
    plate.attrs["plate"] = {"rows": [{"name": "A"}], "columns": [{"name": "1"}],
                            "wells": [{"path": "A/1", "rowIndex": 0, "columnIndex": 0}]}
    well = plate.create_group("A").create_group("1")
    well.attrs["well"] = {"images": [{"path": "0"}]}
    field = RNG.integers(0, 60000, (2, 64, 64), dtype=np.uint16)
    _ome(d / "screen.zarr" / "A" / "1" / "0", _pyramid(field), "0.4")
    server = start_server(d)
    client = TensorFlightClient(server.location)
    assert np.array_equal(client.get_tensor("screen.A.1.0").compute(), field)
    assert [list(p.scale_hint) for p in client.get_descriptor("screen.A.1.0").pyramid][-1] == [1, 4, 4]


def test_register_local_path_serves_zarr_stores_and_ome_images(start_server, tmp_path):
    inbox = tmp_path / "inbox"
    (inbox / "drop").mkdir(parents=True)
    arr = v3(inbox / "drop" / "raw.zarr", _u16(), codecs=[ZstdCodec()])
    levels = _pyramid(RNG.integers(0, 60000, (3, 64, 64), dtype=np.uint16))
    _ome(inbox / "drop" / "img.zarr", levels, "0.5")
    served = tmp_path / "served"
    served.mkdir()
    server = start_server(served, extra=("--add-source-root", inbox))
    client = TensorFlightClient(server.location)
    result = client.register_local_path(str(inbox / "drop"))
    assert {"drop.raw", "drop.img", "drop.img.0", "drop.img.1", "drop.img.2"} <= set(result.added)
    assert np.array_equal(client.get_tensor("drop.raw").compute(), arr[...])
    got = client.get_tensor("drop.img", scale_hint=[1, 4, 4], reduction_method="precompute").compute()
    assert np.array_equal(got, levels[2])
