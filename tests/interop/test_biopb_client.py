"""The unmodified biopb 0.13.0 client reads Tessera bit-exact, over do_get and
over the mmap fast path."""
import os

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient

# A small chunk target so every fixture is cut into many chunks.
SMALL_CHUNKS = ("--chunk-target", "6KiB")

SLICES = [
    (slice(1, 5), slice(3, 60), slice(10, 80)),
    (slice(0, 1), slice(0, 70), slice(0, 90)),
    (slice(5, 6), slice(69, 70), slice(89, 90)),
]


def slices_for(shape):
    out = [tuple(slice(0, d) for d in shape)]
    out.append(tuple(slice(d // 3, max(d // 3 + 1, (2 * d) // 3)) for d in shape))
    out.append(tuple(slice(d - 1, d) for d in shape))
    return out


# Loopback plans of reads that map are cut on a coarser grid (docs/decisions/0015); "0"
# keeps every plan on the fine grid. Every read must give the same bytes on both.
GRIDS = {"one_grid": ("--mapped-chunk-target", "0"), "mapped_grid": ("--mapped-chunk-target", "48KiB")}


@pytest.mark.parametrize("grid", sorted(GRIDS))
@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_every_fixture_reads_whole_and_sliced(mode, grid, monkeypatch, start_server, fixture_dir, arrays):
    if mode == "do_get":
        monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    else:
        monkeypatch.delenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", raising=False)
    server = start_server(fixture_dir, extra=SMALL_CHUNKS + GRIDS[grid])
    client = TensorFlightClient(server.location, cache_bytes=0)
    assert client.health_check()["protocol"] == 3
    for name, expected in arrays.items():
        whole = client.get_tensor(name).compute()
        assert whole.dtype == expected.dtype, name
        assert whole.shape == expected.shape, name
        np.testing.assert_array_equal(whole, expected, err_msg=name)
        assert whole.tobytes() == np.ascontiguousarray(expected).tobytes(), name
        for sl in slices_for(expected.shape):
            got = client.get_tensor(name, slice_hint=sl).compute()
            assert got.tobytes() == np.ascontiguousarray(expected[sl]).tobytes(), (name, sl)
        np.testing.assert_array_equal(client.get_array(name), expected)

    stats = client.cache_stats()
    if mode == "mmap":
        assert stats["locates"] > 0, stats
        assert client.cache_info()["view_items"] >= 0
        assert stats["do_gets"] == 0, f"the fast path must serve every chunk: {stats}"
    else:
        assert stats["locates"] == 0, stats
        assert stats["do_gets"] > 0, stats


def test_big_endian_is_carried_end_to_end(start_server, fixture_dir, arrays):
    server = start_server(fixture_dir)
    client = TensorFlightClient(server.location, cache_bytes=0)
    got = client.get_tensor("be_i2").compute()
    assert got.dtype.str == ">i2"
    np.testing.assert_array_equal(got, arrays["be_i2"])


def test_unknown_array_raises_value_error(start_server, fixture_dir):
    server = start_server(fixture_dir)
    client = TensorFlightClient(server.location)
    with pytest.raises(ValueError):
        client.get_tensor("no_such_tensor")


def test_descriptor_and_scale_refusal(start_server, fixture_dir, arrays):
    server = start_server(fixture_dir)
    client = TensorFlightClient(server.location)
    desc = client.get_descriptor("u16_stack")
    assert list(desc.shape) == list(arrays["u16_stack"].shape)
    assert desc.dtype == "<u2"
    # Scaled reads are served (tests/interop/test_scaled_reads.py); bad hints are refused.
    with pytest.raises(ValueError, match="scale_hint"):
        client.get_tensor("u16_stack", scale_hint=[1, 2, 0]).compute()


TOKEN = "interop-token_0123456789"


def test_token_is_required(start_server, fixture_dir, arrays):
    server = start_server(fixture_dir, extra=("--token", TOKEN))
    good = TensorFlightClient(server.location, token=TOKEN, cache_bytes=0)
    np.testing.assert_array_equal(good.get_tensor("u8_rgb").compute(), arrays["u8_rgb"])
    bad = TensorFlightClient(server.location, token="wrong-token_0123456789", cache_bytes=0)
    with pytest.raises(flight.FlightUnauthenticatedError):
        bad.get_tensor("u8_rgb").compute()


def test_rewritten_file_reads_new_bytes(start_server, tmp_path):
    d = tmp_path / "rw"
    d.mkdir()
    first = np.arange(1000, dtype="<u4").reshape(10, 100)
    np.save(d / "x.npy", first)
    server = start_server(d)
    client = TensorFlightClient(server.location, cache_bytes=0)
    np.testing.assert_array_equal(client.get_tensor("x").compute(), first)
    second = first[::-1].copy() * 3
    np.save(d / "x.npy", second)
    os.utime(d / "x.npy", ns=(1, 2))  # force a new mtime even on coarse clocks
    np.testing.assert_array_equal(client.get_tensor("x").compute(), second)
