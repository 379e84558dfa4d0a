"""Any Arrow Flight client can read Tessera: raw pyarrow.flight do_get and the mmap
contract exactly as the biopb client exercises it."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
from biopb.tensor import descriptor_pb2, ticket_pb2


def plan(client, array_id):
    opt = descriptor_pb2.TensorReadOption(array_id=array_id)
    opt.fields.paths.append("endpoints")
    req = descriptor_pb2.FlightRequest(tensor_read=opt)
    return client.get_flight_info(flight.FlightDescriptor.for_command(req.SerializeToString()))


def test_raw_do_get_and_schema_stamp(start_server, fixture_dir, arrays):
    server = start_server(fixture_dir)
    client = flight.connect(server.location)
    info = plan(client, "f32_4d")
    meta = info.schema.metadata
    assert meta[b"chunk_wire_protocol"] == b"2"
    assert meta[b"flight_protocol"] == b"3"
    expected = arrays["f32_4d"]
    out = np.empty_like(expected)
    for ep in info.endpoints:
        bounds = ticket_pb2.ChunkBounds.FromString(ep.app_metadata)
        table = client.do_get(ep.ticket).read_all()
        assert table.num_rows == 1
        batch = table.to_batches()[0]
        shape = batch.column("shape")[0].as_py()
        dtype = batch.column("dtype")[0].as_py()
        data = np.frombuffer(batch.column("data").buffers()[2], dtype=dtype, count=int(np.prod(shape))).reshape(shape)
        sl = tuple(slice(a, b) for a, b in zip(bounds.start, bounds.stop))
        out[sl] = data
    assert out.tobytes() == expected.tobytes()


def test_segments_read_like_the_biopb_fast_path(start_server, fixture_dir, arrays):
    server = start_server(fixture_dir, extra=("--chunk-target", "4KiB"))
    client = flight.connect(server.location)
    info = plan(client, "u16_stack")
    expected = arrays["u16_stack"]
    for ep in info.endpoints:
        body = next(client.do_action(flight.Action("chunk_locate", ep.ticket.ticket))).body.to_pybytes()
        loc = json.loads(body)
        assert loc["available"] is True
        assert os.stat(loc["segment_path"]).st_ino == loc["generation_id"]
        mm = pa.memory_map(loc["segment_path"], "r")
        schema = pa.ipc.open_stream(mm).schema
        mm.seek(loc["byte_offset"])
        batch = pa.ipc.read_record_batch(pa.ipc.read_message(mm), schema)
        shape = batch.column("shape")[0].as_py()
        buf = batch.column("data").buffers()[2]
        assert buf.address % 64 == 0, "payload is 64-byte aligned in the mapping"
        chunk = np.frombuffer(buf, dtype=batch.column("dtype")[0].as_py(), count=int(np.prod(shape))).reshape(shape)
        bounds = ticket_pb2.ChunkBounds.FromString(ep.app_metadata)
        sl = tuple(slice(a, b) for a, b in zip(bounds.start, bounds.stop))
        np.testing.assert_array_equal(chunk, expected[sl])


def test_unknown_action_says_so(start_server, fixture_dir):
    server = start_server(fixture_dir)
    client = flight.connect(server.location)
    try:
        list(client.do_action(flight.Action("frobnicate", b"")))
    except flight.FlightServerError as e:
        assert "Unknown action" in str(e)
    else:
        raise AssertionError("an unknown action must fail")
