"""First plans that fit every loopback reader (issue 33, docs/decisions/0041): before a
loopback client has read anything, the server cannot know whether it will map; its first plan
is cut on the coarse grid, whose cells are capped at 24 MiB while the server learns, so a
client that never maps (the unmodified biopb client with BIOPB_CACHEFILE_TRANSFER_DISABLED=1,
plain pyarrow) never receives a reply its allocator serves with fresh pages. The bytes read
either way equal numpy's, and a client that maps still maps every chunk of that plan."""
import itertools

import numpy as np
import pyarrow.flight as flight
from biopb.tensor import TensorFlightClient, descriptor_pb2, ticket_pb2

MiB = 1 << 20
# LEARN_CELL_CAP in server/src/grid/route.rs.
CAP = 24 * MiB
FINE = 8 * MiB
# 1 MiB planes: the old 64 MiB coarse target merged 64 of them into one cell.
SHAPE = (96, 512, 1024)


def volume(tmp_path):
    arr = np.random.default_rng(41).integers(0, 1 << 16, SHAPE, dtype=np.uint16)
    path = tmp_path / "stack.npy"
    np.save(path, arr)
    return path, arr


def cell_bytes(bounds, itemsize):
    return int(np.prod([b - a for a, b in zip(bounds.start, bounds.stop)])) * itemsize


def plan_cells(location, array_id):
    """The cells (ChunkBounds) and tickets of a whole-tensor plan, as plain pyarrow sees it."""
    client = flight.connect(location)
    opt = descriptor_pb2.TensorReadOption(array_id=array_id)
    opt.fields.paths.append("endpoints")
    req = descriptor_pb2.FlightRequest(tensor_read=opt)
    info = client.get_flight_info(flight.FlightDescriptor.for_command(req.SerializeToString()))
    return client, [(ticket_pb2.ChunkBounds.FromString(ep.app_metadata), ep.ticket) for ep in info.endpoints]


def test_a_never_mapping_biopb_client_gets_no_cell_over_the_cap(start_server, tmp_path, monkeypatch):
    path, expected = volume(tmp_path)
    server = start_server(path)
    monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    client = TensorFlightClient(server.location, cache_bytes=0)
    first = client.get_tensor("stack")
    cells = [int(np.prod(block)) * 2 for block in itertools.product(*first.chunks)]
    assert max(cells) <= CAP, f"the first plan hands out a {max(cells) / MiB:.1f} MiB cell"
    assert max(cells) > FINE, "the first plan of a loopback client is still the coarse grid"
    got = first.compute()
    assert got.tobytes() == expected.tobytes()
    stats = client.cache_stats()
    assert stats["locates"] == 0 and stats["do_gets"] == len(cells), stats


def test_a_plain_pyarrow_client_reads_the_first_plan_exactly(start_server, tmp_path):
    path, expected = volume(tmp_path)
    server = start_server(path)
    client, cells = plan_cells(server.location, "stack")
    assert max(cell_bytes(b, 2) for b, _ in cells) <= CAP
    out = np.zeros_like(expected)
    for bounds, ticket in cells:
        batch = client.do_get(ticket).read_all().to_batches()[0]
        shape = batch.column("shape")[0].as_py()
        data = np.frombuffer(batch.column("data").buffers()[2], dtype="<u2", count=int(np.prod(shape)))
        out[tuple(slice(a, b) for a, b in zip(bounds.start, bounds.stop))] = data.reshape(shape)
    assert out.tobytes() == expected.tobytes()


def test_a_mapping_client_maps_every_chunk_of_the_capped_plan(start_server, tmp_path, monkeypatch):
    path, expected = volume(tmp_path)
    server = start_server(path)
    monkeypatch.delenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", raising=False)
    client = TensorFlightClient(server.location, cache_bytes=0)
    got = client.get_tensor("stack").compute()
    assert got.tobytes() == expected.tobytes()
    stats = client.cache_stats()
    # 96 planes of 1 MiB in cells of 24: four locates, no DoGet.
    assert stats["do_gets"] == 0 and stats["locates"] == SHAPE[0] * MiB // CAP, stats


def test_pinned_mapped_plans_keep_the_configured_target(start_server, tmp_path):
    path, _ = volume(tmp_path)
    server = start_server(path, extra=("--loopback-plans", "mapped", "--mapped-chunk-target", "64MiB"))
    _, cells = plan_cells(server.location, "stack")
    # 96 planes on a 64 MiB target: two balanced cells of 48.
    assert max(cell_bytes(b, 2) for b, _ in cells) == 48 * MiB
