"""TIFF, BigTIFF and OME-TIFF files served with no conversion: fixtures written at test time
by tifffile (codecs from imagecodecs), read through the unmodified biopb 0.13.0 client on
both routes (do_get and the mmap fast path) and compared with `tifffile.imread`; an ImageJ
hyperstack, OME-TIFF axes and physical scale, a SubIFD pyramid served as native levels;
every refusal by name; a rewritten file."""
import json
import os
import struct
import time

import numpy as np
import pyarrow.flight as flight
import pytest
import tifffile
from biopb.tensor import TensorFlightClient, descriptor_pb2, ticket_pb2

RNG = np.random.default_rng(32)
PAGES = (3, 70, 110)


def _u16(shape=PAGES):
    return RNG.integers(0, 60000, shape, dtype=np.uint16)


def _files(d):
    """One file per compression, layout, dtype and byte order the issue names."""
    files = {}

    def put(name, data, **kw):
        # Pages stay pages: tifffile would take a leading axis of 3 for planar RGB samples.
        kw.setdefault("photometric", "minisblack")
        tifffile.imwrite(d / f"{name}.tif", data, **kw)
        files[name] = d / f"{name}.tif"

    for comp in ["none", "lzw", "zlib", "adobe_deflate", "packbits", "zstd"]:
        c = None if comp == "none" else comp
        put(f"{comp}_strips", _u16(), compression=c, rowsperstrip=16)
        put(f"{comp}_tiles", _u16(), compression=c, tile=(32, 48))
    put("horizontal_u16", _u16(), compression="zlib", predictor=True, tile=(32, 32))
    put("horizontal_i4", RNG.integers(-2**31, 2**31 - 1, PAGES, dtype=np.int32), compression="lzw", predictor=2, rowsperstrip=9)
    put("float_f4", RNG.standard_normal(PAGES).astype(np.float32), compression="zlib", predictor=3, tile=(32, 32))
    put("float_f8", RNG.standard_normal(PAGES), compression="zstd", predictor=3, rowsperstrip=5)
    for dt in ["u1", "i1", "i2", "u4", "i8", "u8", "f2"]:
        info = np.iinfo(dt) if dt[0] in "iu" else None
        data = (RNG.integers(info.min, info.max, PAGES, dtype=dt, endpoint=True)
                if info else RNG.standard_normal(PAGES).astype(dt))
        put(f"dtype_{dt}", data, rowsperstrip=20)
    put("bigtiff", _u16(), bigtiff=True, compression="zstd", tile=(32, 32))
    put("big_endian", _u16(), byteorder=">", compression="zlib", predictor=True, tile=(32, 32))
    put("big_endian_f4", RNG.standard_normal(PAGES).astype(np.float32), byteorder=">", compression="lzw", predictor=3, rowsperstrip=7)
    put("big_endian_raw", _u16(), byteorder=">")
    put("single_page", _u16((70, 110)), compression="zlib", tile=(32, 32))
    put("rgb_chunky", RNG.integers(0, 255, (70, 110, 3), dtype=np.uint8), photometric="rgb", compression="lzw", tile=(32, 32))
    put("rgb_planar", RNG.integers(0, 255, (3, 70, 110), dtype=np.uint8), photometric="rgb", planarconfig="separate", compression="zlib", rowsperstrip=8)
    put("rgb_chunky_pages", RNG.integers(0, 255, (2, 70, 110, 3), dtype=np.uint8), photometric="rgb", rowsperstrip=10)
    return files


@pytest.fixture(scope="module")
def tiff_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiff")
    files = _files(d)
    return d, {name: tifffile.imread(path) for name, path in files.items()}


def _route(mode, monkeypatch):
    if mode == "do_get":
        monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    else:
        monkeypatch.delenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", raising=False)


def _same(got, want, name):
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert got.dtype.newbyteorder("=") == want.dtype.newbyteorder("="), (name, got.dtype, want.dtype)
    assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f"), name


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_every_codec_layout_and_dtype_reads_as_tifffile_does(mode, monkeypatch, start_server, tiff_dir):
    _route(mode, monkeypatch)
    d, expected = tiff_dir
    # Small chunk targets: every read spans many cells, each whole tiles or strips.
    server = start_server(d, extra=("--chunk-target", "20KiB", "--mapped-chunk-target", "60KiB"))
    client = TensorFlightClient(server.location, cache_bytes=0)
    for name, want in expected.items():
        _same(client.get_tensor(name).compute(), want, name)
        sl = tuple(slice(max(0, n // 5), n - n // 7) for n in want.shape)
        _same(client.get_tensor(name, slice_hint=sl).compute(), want[sl], name)
    stats = client.cache_stats()
    if mode == "mmap":
        assert stats["locates"] > 0 and stats["do_gets"] == 0, stats
    else:
        assert stats["do_gets"] > 0 and stats["locates"] == 0, stats


@pytest.mark.parametrize("name", ["zstd_tiles", "big_endian", "rgb_planar", "none_strips"])
def test_pyarrow_do_get_reads_the_same_bytes(name, start_server, tiff_dir):
    d, expected = tiff_dir
    server = start_server(d, extra=("--chunk-target", "20KiB", "--mapped-chunk-target", "20KiB"))
    raw = flight.connect(server.location)
    want = expected[name]
    out = np.zeros(want.shape, want.dtype.newbyteorder("="))
    info = _plan(raw, name)
    assert len(info.endpoints) > 1
    for ep in info.endpoints:
        bounds = ticket_pb2.ChunkBounds.FromString(ep.app_metadata)
        batch = raw.do_get(ep.ticket).read_all().to_batches()[0]
        shape = batch.column("shape")[0].as_py()
        dtype = batch.column("dtype")[0].as_py()
        chunk = np.frombuffer(batch.column("data").buffers()[2], dtype=dtype,
                              count=int(np.prod(shape))).reshape(shape)
        out[tuple(slice(a, b) for a, b in zip(bounds.start, bounds.stop))] = chunk
    _same(out, want, name)


def test_cells_are_whole_tiles_and_labels_name_samples(start_server, tiff_dir):
    d, _ = tiff_dir
    server = start_server(d, extra=("--chunk-target", "20KiB", "--mapped-chunk-target", "20KiB"))
    client = TensorFlightClient(server.location)
    desc = client.get_descriptor("zstd_tiles", with_metadata=True)
    meta = json.loads(desc.metadata_json)
    assert meta["format"] == "tiff" and meta["tile_shape"] == [32, 48]
    for extent, n, dim in zip(desc.chunk_shape, [1, 32, 48], PAGES):
        assert extent % n == 0 or extent == dim, desc.chunk_shape
    assert list(desc.dim_labels) == ["z", "y", "x"]
    assert list(client.get_descriptor("rgb_chunky").dim_labels) == ["y", "x", "s"]
    assert list(client.get_descriptor("rgb_planar").dim_labels) == ["s", "y", "x"]
    assert json.loads(client.get_descriptor("bigtiff", with_metadata=True).metadata_json)["bigtiff"] is True


def test_jpeg_reads_as_libjpeg_does_within_stated_tolerance(start_server, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    # Smooth content, so the decoders' rounding is the only difference.
    y, x = np.mgrid[0:96, 0:128]
    gray = ((np.sin(x / 9) + np.cos(y / 13)) * 60 + 128).astype(np.uint8)
    tifffile.imwrite(d / "gray.tif", gray, compression="jpeg", tile=(32, 32))
    rgb = np.stack([gray, gray[::-1], np.roll(gray, 7, 1)], axis=-1)
    tifffile.imwrite(d / "rgb.tif", rgb, compression="jpeg", photometric="rgb", rowsperstrip=16)
    server = start_server(d)
    client = TensorFlightClient(server.location, cache_bytes=0)
    for name in ["gray", "rgb"]:
        want = tifffile.imread(d / f"{name}.tif")
        got = client.get_tensor(name).compute()
        assert got.shape == want.shape and got.dtype == want.dtype, name
        # zune-jpeg and libjpeg-turbo decode the same stream but round the IDCT (gray: at
        # most one level) and upsample subsampled chroma differently (RGB: a few levels at
        # chroma edges); most samples are equal.
        diff = np.abs(got.astype(int) - want.astype(int))
        assert diff.max() <= (1 if name == "gray" else 6), (name, diff.max())
        assert (diff == 0).mean() > 0.7, (name, (diff == 0).mean())


def test_an_imagej_hyperstack_is_labelled_tzcyx(start_server, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    data = _u16((2, 3, 2, 40, 50))
    tifffile.imwrite(d / "hyper.tif", data, imagej=True, metadata={"axes": "TZCYX", "spacing": 2.5, "unit": "um"})
    server = start_server(d)
    client = TensorFlightClient(server.location, cache_bytes=0)
    desc = client.get_descriptor("hyper", with_metadata=True)
    assert list(desc.dim_labels) == ["t", "z", "c", "y", "x"]
    assert json.loads(desc.metadata_json)["tiff_flavour"] == "imagej"
    assert list(desc.physical_scale)[1] == pytest.approx(2.5)
    _same(client.get_tensor("hyper").compute(), tifffile.imread(d / "hyper.tif"), "hyper")


def _write_ome_pyramid(path, base, levels=2, tile=(32, 32)):
    """An OME-TIFF whose pages carry their reduced levels in SubIFDs (tifffile `subifds=`)."""
    meta = {"axes": "CZYX", "PhysicalSizeX": 0.325, "PhysicalSizeY": 0.325,
            "PhysicalSizeZ": 2.0, "PhysicalSizeZUnit": "µm"}
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(base, subifds=levels, tile=tile, compression="zlib", metadata=meta)
        for k in range(1, levels + 1):
            f = 2 ** k
            tif.write(np.ascontiguousarray(base[..., ::f, ::f]), subfiletype=1, tile=tile, compression="zlib")


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_ome_tiff_axes_scale_and_subifd_levels(mode, monkeypatch, start_server, tmp_path):
    _route(mode, monkeypatch)
    d = tmp_path / "data"
    d.mkdir()
    base = _u16((2, 3, 150, 170))
    _write_ome_pyramid(d / "cells.ome.tif", base)
    levels = [tifffile.imread(d / "cells.ome.tif", level=k) for k in range(3)]
    assert levels[1].shape == (2, 3, 75, 85)
    server = start_server(d, extra=("--chunk-target", "20KiB"))
    client = TensorFlightClient(server.location, cache_bytes=0)
    desc = client.get_descriptor("cells.ome", with_metadata=True)
    assert list(desc.dim_labels) == ["c", "z", "y", "x"]
    assert list(desc.physical_scale) == pytest.approx([1.0, 2.0, 0.325, 0.325])
    assert list(desc.physical_unit)[1:] == ["µm", "µm", "µm"]
    assert json.loads(desc.metadata_json)["format"] == "ome-tiff"
    assert [list(p.scale_hint) for p in desc.pyramid] == [[1, 1, 1, 1], [1, 1, 2, 2], [1, 1, 4, 4]]
    assert all(p.native and p.reduction_method == "precompute" for p in desc.pyramid)
    assert [tuple(p.shape) for p in desc.pyramid] == [lv.shape for lv in levels]
    _same(client.get_tensor("cells.ome").compute(), levels[0], "level 0")
    for k, level in enumerate(levels):
        f = 2 ** k
        got = client.get_tensor("cells.ome", scale_hint=[1, 1, f, f], reduction_method="precompute").compute()
        _same(got, level, f"level {k}")
        # Each level is also served under `<id>.<level>`.
        _same(client.get_tensor(f"cells.ome.{k}").compute() if k else got, level, f"id of level {k}")
    sl = (slice(0, 2), slice(1, 3), slice(20, 101), slice(8, 140))
    got = client.get_tensor("cells.ome", slice_hint=sl, scale_hint=[1, 1, 4, 4], reduction_method="precompute").compute()
    _same(got, levels[2][:, 1:3, 20 // 4:-(-101 // 4), 8 // 4:-(-140 // 4)], "sliced level 2")


def _plan(client, array_id):
    opt = descriptor_pb2.TensorReadOption(array_id=array_id)
    opt.fields.paths.append("endpoints")
    req = descriptor_pb2.FlightRequest(tensor_read=opt)
    return client.get_flight_info(flight.FlightDescriptor.for_command(req.SerializeToString()))


def _patch_tag(path, tag, value):
    """Overwrites the inline value of `tag` in the first directory of a classic little-endian file."""
    with tifffile.TiffFile(path) as tif:
        t = tif.pages[0].tags[tag]
        at = t.valueoffset
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(struct.pack("<H", value))


def _bomb(path):
    """A one-strip Deflate file whose strip inflates to far more than its 16 x 16 pixels."""
    tifffile.imwrite(path, np.zeros((16, 16), np.uint8), compression="zlib")
    import zlib
    bomb = zlib.compress(b"\0" * (1 << 22), 9)
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        off_at = page.tags["StripOffsets"].valueoffset
        cnt_at = page.tags["StripByteCounts"].valueoffset
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size)
        f.write(bomb)
        f.seek(off_at)
        f.write(struct.pack("<I", size))
        f.seek(cnt_at)
        f.write(struct.pack("<I", len(bomb)))


def test_each_bad_file_is_refused_by_name_and_the_others_serve(start_server, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    good = _u16()
    tifffile.imwrite(d / "good.tif", good, compression="zlib", tile=(32, 32))
    # Truncated: the last tiles lie past the end.
    tifffile.imwrite(d / "truncated.tif", _u16(), compression="zlib", tile=(32, 32))
    with open(d / "truncated.tif", "r+b") as f:
        f.truncate(os.path.getsize(d / "truncated.tif") // 2)
    # JPEG 2000 (compression 34712), by name.
    tifffile.imwrite(d / "j2k.tif", _u16((20, 20)))
    _patch_tag(d / "j2k.tif", "Compression", 34712)
    # A circular chain: the first directory's next offset points at itself.
    tifffile.imwrite(d / "circular.tif", _u16((8, 8)))
    with tifffile.TiffFile(d / "circular.tif") as tif:
        ifd = tif.pages[0].offset
        n = len(tif.pages[0].tags)
    with open(d / "circular.tif", "r+b") as f:
        f.seek(ifd + 2 + 12 * n)
        f.write(struct.pack("<I", ifd))
    # Tile counts that do not match the image: width grown under the tile offsets.
    tifffile.imwrite(d / "miscounted.tif", _u16((64, 64)), tile=(32, 32))
    _patch_tag(d / "miscounted.tif", "ImageWidth", 96)
    # Absurd dimensions.
    tifffile.imwrite(d / "absurd.tif", _u16((8, 8)))
    _patch_tag(d / "absurd.tif", "ImageWidth", 0)
    # Samples not served: 1-bit.
    tifffile.imwrite(d / "bilevel.tif", np.ones((8, 16), bool))
    # Not a TIFF at all.
    (d / "fake.tif").write_bytes(b"\x93NUMPY not a tiff")
    # A multi-file OME-TIFF set.
    xml = ('<?xml version="1.0" encoding="UTF-8"?><OME xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06">'
           '<Image ID="Image:0"><Pixels ID="Pixels:0" DimensionOrder="XYZCT" Type="uint16" SizeX="8" SizeY="8" SizeZ="2" SizeC="1" SizeT="1">'
           '<TiffData IFD="0" PlaneCount="1"><UUID FileName="set_1.ome.tif">urn:uuid:1</UUID></TiffData>'
           '<TiffData IFD="0" FirstZ="1" PlaneCount="1"><UUID FileName="set_2.ome.tif">urn:uuid:2</UUID></TiffData>'
           '</Pixels></Image></OME>')
    tifffile.imwrite(d / "set_1.ome.tif", _u16((8, 8)), description=xml, metadata=None)
    _bomb(d / "bomb.tif")
    server = start_server(d)
    client = TensorFlightClient(server.location, cache_bytes=0)
    _same(client.get_tensor("good").compute(), good, "good")
    reasons = {
        "truncated": "past the end",
        "j2k": "JPEG 2000 is not read",
        "circular": "form a cycle",
        "miscounted": "its geometry has",
        "absurd": "absurd",
        "bilevel": "1-bit samples",
        "fake": "not a TIFF file",
        "set_1.ome": "multi-file OME-TIFF set",
    }
    for name, needle in reasons.items():
        with pytest.raises(ValueError, match=name.split(".")[0]) as err:
            client.resolve_source(name)
        assert needle in str(err.value), (name, str(err.value))
        assert needle in "".join(server.log), name
    # The bomb is refused when its strip is decoded, by name; the rest still serves.
    with pytest.raises(Exception, match="decompression bomb"):
        client.get_tensor("bomb").compute()
    _same(client.get_tensor("good").compute(), good, "good")


def test_a_folder_mixing_npy_zarr_and_tiff_serves_each(start_server, tmp_path):
    import zarr
    d = tmp_path / "data"
    d.mkdir()
    a = _u16((10, 12))
    np.save(d / "arr.npy", a)
    z = zarr.create_array(d / "store.zarr", shape=(10, 12), chunks=(5, 6), dtype="u2", zarr_format=2)
    z[...] = a
    tifffile.imwrite(d / "img.tiff", a, compression="zlib")
    (d / "scan.czi").write_bytes(b"ZISRAWFILE")
    server = start_server(d)
    client = TensorFlightClient(server.location, cache_bytes=0)
    for name in ["arr", "store", "img"]:
        _same(client.get_tensor(name).compute(), a, name)
    with pytest.raises(ValueError, match="Zeiss CZI"):
        client.resolve_source("scan")


def test_a_rewritten_file_gets_new_ids_and_old_tickets_are_refused(start_server, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    first = _u16()
    tifffile.imwrite(d / "live.tif", first, compression="zlib", tile=(32, 32))
    server = start_server(d, extra=("--watch", "--watch-interval", "200ms"))
    client = TensorFlightClient(server.location, cache_bytes=0)
    _same(client.get_tensor("live").compute(), first, "before")
    raw = flight.connect(server.location)
    old = _plan(raw, "live")
    second = _u16()
    tifffile.imwrite(d / "live.tif", second, compression="zlib", tile=(32, 32))
    deadline = time.time() + 20
    while True:
        now = client.get_tensor("live").compute()
        if np.array_equal(now, second):
            break
        assert np.array_equal(now, first), "a read mixed old and new bytes"
        assert time.time() < deadline, "the rewritten file was never served"
        time.sleep(0.2)
    new = _plan(raw, "live")
    assert {e.ticket.ticket for e in new.endpoints}.isdisjoint({e.ticket.ticket for e in old.endpoints})
    with pytest.raises(flight.FlightError, match="plan"):
        raw.do_get(old.endpoints[0].ticket).read_all()
