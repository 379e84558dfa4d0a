"""Downsampled reads through the unmodified biopb 0.13.0 client: `nearest` and `area`
compared with numpy (the staged formula of the reference server), on several dtypes and
ranks, scales that do and do not divide the shape, whole and sliced, over do_get and over
the mmap fast path; the advertised pyramid; and the named refusals of bad scale hints."""
import numpy as np
import pytest
from biopb.tensor import TensorFlightClient

# Small chunks so every read covers many scaled chunks; the mapped grid is coarser.
GRID = ("--chunk-target", "6KiB", "--mapped-chunk-target", "48KiB")


def _arrays():
    rng = np.random.default_rng(21)
    return {
        "u8_2d": rng.integers(0, 256, (97, 130), dtype=np.uint8),
        "u16_3d": rng.integers(0, 65536, (7, 64, 90), dtype=np.uint16),
        "be_i16_2d": rng.integers(-32768, 32767, (61, 75), dtype=np.int16).astype(">i2"),
        "f32_4d": rng.standard_normal((3, 5, 40, 48)).astype(np.float32) * 1000,
        "f16_5d": rng.standard_normal((2, 3, 5, 24, 30)).astype(np.float16),
        "u16_5d": rng.integers(0, 65536, (2, 2, 9, 33, 40), dtype=np.uint16),
        "c8_2d": (rng.standard_normal((40, 50)) + 1j * rng.standard_normal((40, 50))).astype(np.complex64),
    }


# Per array: scales that divide its shape and scales that do not.
SCALES = {
    "u8_2d": [(2, 2), (3, 7), (97, 1), (16, 16), (1, 130)],
    "u16_3d": [(1, 4, 4), (2, 3, 5), (7, 64, 90), (1, 16, 9)],
    "be_i16_2d": [(2, 2), (5, 3), (8, 16)],
    # (1, 1, 16, 48) and (1, 1, 1, 8, 30): the whole reduction has length 1 after the axis,
    # so numpy sums its blocks pairwise, not term by term.
    "f32_4d": [(1, 1, 2, 2), (3, 2, 3, 5), (1, 5, 8, 16), (1, 1, 40, 1), (1, 1, 16, 48)],
    "f16_5d": [(1, 1, 1, 2, 2), (2, 3, 2, 5, 7), (1, 1, 5, 8, 10), (1, 1, 1, 8, 30)],
    "u16_5d": [(1, 1, 2, 4, 4), (2, 2, 3, 3, 3)],
    "c8_2d": [(2, 2), (3, 7), (16, 50), (1, 10)],
}


def staged_area(a, scale):
    """The reference's `area`, as the issue states it: edge-pad to whole blocks, cast to
    the working type, average one axis at a time from the last, round and clip ints.
    Complex numbers average in their own precision (result_type(c8, f32) is c8)."""
    target = [-(-d // s) * s for d, s in zip(a.shape, scale)]
    pad = [(0, t - d) for d, t in zip(a.shape, target)]
    m = np.pad(a, pad, mode="edge") if any(p for _, p in pad) else a
    work = np.float64 if a.dtype.kind in "iu" else np.result_type(a.dtype, np.float32)
    m = m.astype(work)
    for ax in reversed(range(a.ndim)):
        s = scale[ax]
        if s == 1:
            continue
        m = m.reshape(m.shape[:ax] + (m.shape[ax] // s, s) + m.shape[ax + 1:]).mean(axis=ax + 1)
    if a.dtype.kind in "iu":
        info = np.iinfo(a.dtype)
        m = np.clip(np.round(m), info.min, info.max)
    return m.astype(a.dtype)


def nearest(a, scale):
    return a[tuple(slice(None, None, s) for s in scale)]


def reduced_window(sl, scale):
    """The window of the whole reduction a sliced scaled read returns."""
    return tuple(slice(x.start // s, -(-x.stop // s)) for x, s in zip(sl, scale))


def slices_for(shape):
    return [
        tuple(slice(d // 3, max(d // 3 + 1, (2 * d) // 3)) for d in shape),
        tuple(slice(d - 1, d) for d in shape),
        tuple(slice(1 if d > 1 else 0, d) for d in shape),
    ]


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    arrays = _arrays()
    for name, arr in arrays.items():
        np.save(d / f"{name}.npy", arr)
    return d, arrays


def _route(mode, monkeypatch):
    if mode == "do_get":
        monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    else:
        monkeypatch.delenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", raising=False)


def _check_stats(client, mode):
    stats = client.cache_stats()
    if mode == "mmap":
        assert stats["locates"] > 0 and stats["do_gets"] == 0, stats
    else:
        assert stats["locates"] == 0 and stats["do_gets"] > 0, stats


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
@pytest.mark.parametrize("method", ["nearest", "area"])
def test_scaled_reads_equal_numpy(method, mode, monkeypatch, start_server, data_dir):
    _route(mode, monkeypatch)
    d, arrays = data_dir
    server = start_server(d, extra=GRID)
    client = TensorFlightClient(server.location, cache_bytes=0)
    reduce = staged_area if method == "area" else nearest
    for name, a in arrays.items():
        for scale in SCALES[name]:
            expected = reduce(a, scale)
            got = client.get_tensor(name, scale_hint=list(scale), reduction_method=method).compute()
            assert got.dtype == a.dtype, (name, scale)
            assert got.shape == tuple(-(-n // s) for n, s in zip(a.shape, scale)), (name, scale)
            assert got.tobytes() == np.ascontiguousarray(expected).tobytes(), (name, scale, method)
            for sl in slices_for(a.shape):
                got = client.get_tensor(
                    name, slice_hint=sl, scale_hint=list(scale), reduction_method=method
                ).compute()
                want = np.ascontiguousarray(expected[reduced_window(sl, scale)])
                assert got.shape == want.shape, (name, scale, sl)
                assert got.tobytes() == want.tobytes(), (name, scale, sl, method)
            whole = client.get_array(name, scale_hint=list(scale), reduction_method=method)
            assert whole.tobytes() == np.ascontiguousarray(expected).tobytes(), (name, scale)
    _check_stats(client, mode)


def test_default_method_and_aliases(start_server, data_dir):
    d, arrays = data_dir
    server = start_server(d, extra=GRID)
    client = TensorFlightClient(server.location, cache_bytes=0)
    a = arrays["u16_3d"]
    scale = [1, 3, 4]
    assert client.get_tensor("u16_3d", scale_hint=scale).compute().tobytes() == (
        np.ascontiguousarray(nearest(a, scale)).tobytes()
    )
    for alias in ("stride", "decimate"):
        got = client.get_array("u16_3d", scale_hint=scale, reduction_method=alias)
        np.testing.assert_array_equal(got, nearest(a, scale))
    for alias in ("mean", "linear", "AREA"):
        got = client.get_array("u16_3d", scale_hint=scale, reduction_method=alias)
        np.testing.assert_array_equal(got, staged_area(a, scale))


@pytest.mark.parametrize(
    "scale, method, needles",
    [
        ([2, 2], None, ["scale_hint [2, 2]", "2 values", "3 axes"]),
        ([1, 0, 2], None, ["0 on axis 1", "positive"]),
        ([1, 2, -4], None, ["-4 on axis 2", "positive"]),
        ([1, 65, 2], None, ["65 on axis 1", "length is 64"]),
        ([1, 2, 2], "precompute", ["precompute", "'nearest'", "'area'"]),
        ([1, 2, 2], "bicubic", ["'bicubic'", "'nearest'", "'area'"]),
    ],
)
def test_bad_scale_hints_are_refused_by_name(scale, method, needles, start_server, data_dir):
    d, _ = data_dir
    server = start_server(d, extra=GRID)
    client = TensorFlightClient(server.location, cache_bytes=0)
    with pytest.raises(ValueError) as err:
        client.get_tensor("u16_3d", scale_hint=scale, reduction_method=method).compute()
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_area_of_bool_is_refused_and_nearest_is_served(start_server, tmp_path):
    d = tmp_path / "b"
    d.mkdir()
    b = np.random.default_rng(3).integers(0, 2, (20, 30)).astype(bool)
    np.save(d / "mask.npy", b)
    server = start_server(d)
    client = TensorFlightClient(server.location, cache_bytes=0)
    with pytest.raises(ValueError, match="bool"):
        client.get_tensor("mask", scale_hint=[2, 2], reduction_method="area").compute()
    np.testing.assert_array_equal(client.get_array("mask", scale_hint=[2, 3]), b[::2, ::3])


@pytest.mark.parametrize(
    "shape, labels_note, levels",
    [
        ((512, 512), "small plane", [[1, 1]]),
        ((5032, 5032), "2-D level", [[1, 1], [4, 4]]),
        ((1024, 4096, 4096), "2-D and 3-D levels", [[1, 1, 1], [1, 4, 4], [4, 16, 16]]),
        ((3, 512, 1024, 1024), "c z y x: 3-D only", [[1, 1, 1, 1], [1, 2, 2, 2]]),
    ],
)
def test_pyramid_follows_the_reference_policy(shape, labels_note, levels, start_server, tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    # A header over a sparse payload: the descriptor never reads the pixels.
    path = d / "big.npy"
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=shape)
    del arr
    server = start_server(d)
    client = TensorFlightClient(server.location, cache_bytes=0)
    desc = client.get_descriptor("big")
    assert [list(level.scale_hint) for level in desc.pyramid] == levels, labels_note
    for level in desc.pyramid:
        assert list(level.shape) == [-(-n // s) for n, s in zip(shape, level.scale_hint)]
        computed = any(s > 1 for s in level.scale_hint)
        assert level.native is not computed
        assert level.reduction_method == "nearest"


def test_pyramid_method_and_policy_come_from_the_config_file(start_server, tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    np.lib.format.open_memmap(d / "img.npy", mode="w+", dtype=np.uint16, shape=(3000, 3000))
    config = tmp_path / "tessera.toml"
    config.write_text('[pyramid]\nmethod = "area"\nplane_max_pixels = 1000000\n')
    server = start_server(d, extra=("--config", str(config)))
    client = TensorFlightClient(server.location, cache_bytes=0)
    desc = client.get_descriptor("img")
    assert [list(level.scale_hint) for level in desc.pyramid] == [[1, 1], [4, 4]]
    assert [level.reduction_method for level in desc.pyramid] == ["nearest", "area"]
    # The advertised level reads back at its advertised shape.
    level = desc.pyramid[1]
    got = client.get_array("img", scale_hint=list(level.scale_hint), reduction_method=level.reduction_method)
    assert list(got.shape) == list(level.shape)
