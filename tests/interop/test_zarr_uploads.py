"""`zarr://` uploads through the unmodified biopb 0.13.0 client (docs/decisions/0031): the
upload reads back through Tessera on both routes exactly as a `cache://` one does, and its
Zarr v2 store, found at `metadata_json["zarr_store"]`, opens in zarr-python with the same
values; biopb's own `member_upload_test.py` semantics (the answered id, PENDING writable
but not readable, several tensors on one source, a restart) and `label_upload_test.py`'s
round trip of a label set hold; discard, expiry and a SIGKILL leave the store as
documented."""
import json
import os
import time

import numpy as np
import pyarrow.flight as flight
import pytest
import zarr
from biopb.tensor.ticket_pb2 import ChunkBounds
from test_uploads import WRITABLE, client_for, published_after_a_kill, read_back


def store_of(client, array_id):
    """The path of an upload's Zarr store, as a user finds it."""
    desc = client.get_descriptor(array_id, with_metadata=True)
    return json.loads(desc.metadata_json)["zarr_store"]


def assert_store_holds(path, expected, dim_labels, chunk_shape):
    stored = zarr.open_array(path, mode="r")
    assert stored.metadata.zarr_format == 2
    assert stored.shape == expected.shape
    assert stored.dtype == expected.dtype
    assert tuple(stored.chunks) == tuple(chunk_shape)
    assert stored.attrs["_ARRAY_DIMENSIONS"] == list(dim_labels)
    np.testing.assert_array_equal(stored[...], expected)


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_a_zarr_upload_reads_back_through_tessera_and_zarr_python(mode, monkeypatch, start_server, tmp_path):
    server = start_server(tmp_path, extra=WRITABLE)
    client = client_for(server, mode, monkeypatch=monkeypatch)
    rng = np.random.default_rng(30)
    # Chunk shapes that leave partial cells at the edges (padded chunk files in the store).
    cases = {
        "u16": (rng.integers(0, 65535, (5, 130, 170), dtype=np.uint16), (2, 64, 64), ["z", "y", "x"]),
        "f32": (rng.standard_normal((40, 33)).astype("<f4"), (16, 16), None),
        "i8": (rng.integers(-(2**62), 2**62, (1000,), dtype="<i8"), (300,), None),
        "b1": (rng.integers(0, 2, (17, 19)).astype(bool), (8, 8), None),
        "u1": (rng.integers(0, 255, (3, 50, 60), dtype=np.uint8), (1, 50, 60), None),
    }
    for name, (arr, chunks, labels) in cases.items():
        desc = client.setup_array_upload(
            f"zarr://scratch/@fields/{name}", arr, chunk_shape=chunks, dim_labels=labels
        )
        assert desc.array_id == f"scratch/@fields/{name}"
        status = client.upload_array(desc, arr)
        assert status["state"] == "READY", status
        read_back(client, desc.array_id, arr)
        path = store_of(client, desc.array_id)
        assert os.path.isabs(path) and path.endswith(f"{name}.zarr"), path
        assert_store_holds(path, arr, desc.dim_labels, desc.chunk_shape)
    stats = client.cache_stats()
    if mode == "mmap":
        assert stats["locates"] > 0 and stats["do_gets"] == 0, stats
    else:
        assert stats["locates"] == 0 and stats["do_gets"] > 0, stats


def test_member_upload_semantics_hold_for_zarr(start_server, tmp_path):
    """biopb's member_upload_test.py, on Tessera: the answered id is the request minus the
    scheme, both formats answer the same id and round-trip their pixels, a PENDING tensor
    is writable but neither readable nor listed, one source takes several tensors, and
    what is not a store format, a label set and an unserved source are refused."""
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "image.npy", np.zeros((4, 6), dtype=np.uint16))
    server = start_server(src, extra=WRITABLE)
    client = client_for(server)
    source = "image"
    arr = np.full((4, 6), 7, dtype=np.uint16)
    for scheme in ("zarr", "cache"):
        desc = client.setup_array_upload(f"{scheme}://{source}/@fields/px-{scheme}", arr, chunk_shape=(2, 3))
        assert desc.array_id == f"{source}/@fields/px-{scheme}"
        client.upload_array(desc, arr)
        np.testing.assert_array_equal(client.get_tensor(desc.array_id).compute(), arr)

    filling = client.setup_array_upload(f"zarr://{source}/@fields/filling", arr, chunk_shape=(2, 3))
    grid = tuple(filling.chunk_shape)
    client.upload_chunk(filling, ChunkBounds(start=[0, 0], stop=list(grid)), np.full(grid, 5, np.uint16))
    with pytest.raises(flight.FlightError):
        client.get_tensor(filling.array_id).compute()
    listed = {f.descriptor.path[0].decode() for f in flight.connect(server.location).list_flights()}
    assert f"{source}/@fields/px-zarr" in listed and filling.array_id not in listed, listed
    client.set_upload_status(filling, "READY")
    assert client.get_tensor(filling.array_id).compute().max() == 5
    # Cells never sent read as zeros in Tessera and as the fill value in zarr-python.
    expected = np.zeros((4, 6), np.uint16)
    expected[: grid[0], : grid[1]] = 5
    assert_store_holds(store_of(client, filling.array_id), expected, filling.dim_labels, grid)

    with pytest.raises(flight.FlightError, match="not available"):
        client.setup_array_upload(f"parquet://{source}/@fields/img", arr)
    with pytest.raises(flight.FlightError, match="no served source"):
        client.setup_array_upload("zarr://zarr_nope/@fields/img", arr)


def label_sets(client, image_array_id):
    """The array ids served under an image's `@labels/` prefix, sorted (biopb's helper asks
    `sources` with `UNNEST(tensors) AS u(t)`, a form the catalog does not plan; the
    `tensors` table holds the same rows)."""
    prefix = image_array_id.replace("'", "''") + "/@labels/"
    table = client.query(
        f"SELECT array_id FROM tensors WHERE starts_with(array_id, '{prefix}') ORDER BY array_id"
    )
    return table.column(0).to_pylist()


def test_label_sets_round_trip_under_their_image(start_server, tmp_path):
    """biopb's label_upload_test.py on Tessera: a label set of a served image and of a
    published member is created PENDING (polled, not listed), published by upload_array,
    read back, listed under its image and written as a Zarr store; a set on a PENDING
    member, a `cache://` set, a set that does not span its image and a float set are
    refused."""
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "image.npy", np.zeros((64, 64), dtype=np.uint16))
    server = start_server(src, extra=WRITABLE)
    client = client_for(server)
    labels = np.zeros((64, 64), dtype=np.uint32)
    labels[:8, :8] = 3
    labels[32:40, 32:40] = 5

    desc = client.setup_array_upload("zarr://image/@labels/nuclei", labels, chunk_shape=(32, 32))
    assert desc.array_id == "image/@labels/nuclei"
    assert client.get_upload_status(desc.array_id)["state"] == "PENDING"
    assert label_sets(client, "image") == []
    assert client.upload_array(desc, labels)["state"] == "READY"
    read = client.get_tensor(desc.array_id)
    assert read.dtype == np.uint32
    np.testing.assert_array_equal(read.compute(), labels)
    client.upload_array(client.setup_array_upload("zarr://image/@labels/cells", labels), labels)
    assert label_sets(client, "image") == ["image/@labels/cells", "image/@labels/nuclei"]
    assert_store_holds(store_of(client, desc.array_id), labels, desc.dim_labels, desc.chunk_shape)

    image = np.full((64, 64), 2, dtype=np.uint16)
    member = client.setup_array_upload("zarr://image/@fields/img", image)
    with pytest.raises(flight.FlightError, match="READY"):
        client.setup_array_upload("zarr://image/@fields/img/@labels/nuclei", labels)
    client.upload_array(member, image)
    on_member = client.setup_array_upload("zarr://image/@fields/img/@labels/nuclei", labels)
    client.upload_array(on_member, labels)
    assert on_member.array_id == "image/@fields/img/@labels/nuclei"
    assert label_sets(client, member.array_id) == [on_member.array_id]
    np.testing.assert_array_equal(client.get_tensor(on_member.array_id).compute(), labels)

    with pytest.raises(flight.FlightError, match="a label set is NGFF"):
        client.setup_array_upload("cache://image/@labels/other", labels)
    with pytest.raises(flight.FlightError, match="does not span"):
        client.setup_array_upload("zarr://image/@labels/small", labels[:32])
    with pytest.raises(flight.FlightError, match="integer labels"):
        client.setup_array_upload("zarr://image/@labels/float", labels.astype(np.float32))
    with pytest.raises(flight.FlightError, match="no tensor this server serves"):
        client.setup_array_upload("zarr://nosuch/@labels/cells", labels)


def test_a_published_zarr_upload_reads_back_in_the_next_life(start_server, tmp_path):
    state = tmp_path / "zarr-state"
    extra = WRITABLE + ("--state-dir", str(state))
    server = start_server(tmp_path, extra=extra)
    client = client_for(server)
    arr = np.full((4, 6), 9, dtype=np.uint16)
    desc = client.setup_array_upload("zarr://scratch/@fields/img", arr, chunk_shape=(2, 3))
    client.upload_array(desc, arr)
    path = store_of(client, desc.array_id)
    assert server.stop() == 0

    server = start_server(tmp_path, extra=extra)
    client = client_for(server)
    np.testing.assert_array_equal(client.get_tensor(desc.array_id).compute(), arr)
    assert store_of(client, desc.array_id) == path
    assert_store_holds(path, arr, desc.dim_labels, desc.chunk_shape)


def test_discard_and_expiry_remove_the_store(start_server, tmp_path):
    server = start_server(tmp_path, extra=WRITABLE)
    client = client_for(server)
    arr = np.arange(64, dtype=np.uint8)
    desc = client.setup_array_upload("zarr://scratch/@fields/gone", arr)
    client.upload_array(desc, arr)
    path = store_of(client, desc.array_id)
    assert os.path.isdir(path)
    client.set_upload_status(desc, "DISCARDED", reason="not needed")
    assert not os.path.exists(path)

    short = client.setup_array_upload("zarr://scratch/@fields/short", arr, ttl_seconds=2)
    client.upload_array(short, arr)
    path = store_of(client, short.array_id)
    deadline = time.monotonic() + 15
    while os.path.exists(path):
        assert time.monotonic() < deadline, "the expired upload's store was not removed"
        time.sleep(0.2)
    assert client.get_upload_status(short.array_id)["state"] == "DISCARDED"


def test_sigkill_mid_upload_leaves_a_store_of_exactly_the_acked_chunks(tmp_path):
    """SIGKILL while chunks are in flight: after a restart the store holds a file for each
    acknowledged chunk and no other, so zarr-python reads what Tessera reads: each plane
    the chunk sent or zeros, never a torn or unacknowledged one."""
    with published_after_a_kill(tmp_path, "zarr://scratch/@fields/killed", seed=31) as (
        client, desc, got, status
    ):
        path = store_of(client, desc.array_id)
        chunk_files = [n for n in os.listdir(path) if not n.startswith(".")]
        assert len(chunk_files) == status["uploaded_chunks"], (chunk_files, status)
        np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], got)
