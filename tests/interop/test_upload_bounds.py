"""What an upload may cost the server (issue 28 items 2, 6 and 12), through the unmodified
biopb 0.13.0 client and raw pyarrow: grids are bounded at `add_tensor`, plans and listings
of uploads with many cells fit a reply, unfinished chunk DoPuts hold bounded memory that is
freed when their client goes, and reading cells never sent stores nothing."""
import subprocess
import threading
import time
import types

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient
from biopb.tensor._upload import _plan_write
from biopb.tensor.descriptor_pb2 import SliceHint
from biopb.tensor.ticket_pb2 import PutCommand
from conftest import Server, tessera_bin

WRITABLE = ("--writable",)


def client_for(server, monkeypatch=None, mode="do_get"):
    if monkeypatch is not None:
        if mode == "do_get":
            monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
        else:
            monkeypatch.delenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", raising=False)
    return TensorFlightClient(server.location, cache_bytes=0)


def template(shape, dtype):
    """What `setup_array_upload` reads of an array (shape, dtype), without its bytes."""
    return types.SimpleNamespace(shape=shape, dtype=np.dtype(dtype))


def tree_bytes(path):
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def proc_status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/{pid}/status has no {key}")


def test_a_grid_of_2_to_the_40_cells_is_refused_at_add_tensor(start_server, tmp_path):
    server = start_server(tmp_path, extra=WRITABLE)
    client = client_for(server)
    with pytest.raises(flight.FlightError) as refused:
        client.setup_array_upload("cache://scratch/@fields/huge", template((1 << 40,), "|u1"),
                                  chunk_shape=(1,))
    text = str(refused.value)
    assert "1099511627776 cells" in text and "262144" in text, text
    assert "--max-upload-cells" in text, text
    # Nothing was added: the name is free and a bounded grid of the same tensor is taken.
    desc = client.setup_array_upload("cache://scratch/@fields/huge", template((1 << 40,), "|u1"),
                                     chunk_shape=(8 << 20,))
    assert desc.upload_status.expected_chunks == 131072


def many_cells_hold(server, array_id, cells):
    """ListFlights, `tessera ls`, the status and a slice plan all answer; the whole plan is
    refused by name instead of being built."""
    listed = [f.descriptor.path[0].decode() for f in flight.connect(server.location).list_flights()]
    assert array_id in listed, listed
    ls = subprocess.run([tessera_bin(), "ls", server.location], capture_output=True, text=True,
                        timeout=60)
    assert ls.returncode == 0 and array_id in ls.stdout, ls.stderr
    client = client_for(server)
    status = client.get_upload_status(array_id)
    assert (status["state"], status["expected_chunks"]) == ("READY", cells), status
    with pytest.raises(Exception, match="plan a slice"):
        client.get_tensor(array_id)
    got = client.get_tensor(array_id, slice_hint=(slice(1000, 1300),)).compute()
    np.testing.assert_array_equal(got, np.zeros(300, dtype=np.uint8))


def test_an_upload_with_more_cells_than_one_reply_carries_lists_and_plans(start_server, tmp_path):
    """1,310,720 one-byte cells (under a raised --max-upload-cells): one endpoint each would be
    ~120 MB, over the 80 MiB a reply may carry. Before, one such upload set READY made every
    ListFlights and `tessera ls` fail, also after a restart."""
    cells = 5 << 18
    extra = WRITABLE + ("--state-dir", str(tmp_path / "kept"))
    env = {"TESSERA_MAX_UPLOAD_CELLS": str(4 << 20)}
    server = start_server(tmp_path, extra=extra, env=env)
    client = client_for(server)
    desc = client.setup_array_upload("cache://scratch/@fields/many", template((cells,), "|u1"),
                                     chunk_shape=(1,))
    assert desc.upload_status.expected_chunks == cells
    # A producer plans the part it writes, a slice.
    plan = _plan_write(client._state, desc.array_id, SliceHint(start=[0], stop=[10]))
    assert len(plan) == 10
    assert client.set_upload_status(desc, "READY")["state"] == "READY"
    many_cells_hold(server, desc.array_id, cells)
    assert server.stop() == 0
    server = start_server(tmp_path, extra=extra, env=env)
    many_cells_hold(server, desc.array_id, cells)


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_reading_an_empty_ready_upload_stores_nothing(mode, monkeypatch, start_server, tmp_path):
    """A 64 MiB READY upload of which nothing was sent reads as zeros on both routes; the
    state directory does not grow (before, each cell read wrote its zeros into the upload's
    never-evicted store)."""
    server = start_server(tmp_path, extra=WRITABLE)
    client = client_for(server, monkeypatch, mode)
    shape = (64, 1024, 1024)
    desc = client.setup_array_upload("cache://scratch/@fields/empty", template(shape, "<u2"),
                                     chunk_shape=(4, 1024, 1024))
    client.set_upload_status(desc, "READY")
    state = tmp_path / "state0"
    before = tree_bytes(state)
    got = client.get_tensor(desc.array_id).compute()
    assert got.dtype == np.dtype("<u2") and got.shape == shape
    np.testing.assert_array_equal(got, np.zeros(shape, dtype="<u2"))
    part = client.get_tensor(desc.array_id, slice_hint=(slice(3, 9), slice(10, 20), slice(None))).compute()
    np.testing.assert_array_equal(part, np.zeros((6, 10, 1024), dtype="<u2"))
    assert tree_bytes(state) == before, (before, tree_bytes(state))
    if mode == "mmap":
        # chunk_locate sent the client to do_get for the zeros, which live in no file.
        assert client.cache_stats()["do_gets"] > 0


def unfinished_put(client, ticket, batch, batches, gone, errors):
    """A DoPut that sends `batches` copies of `batch` and never finishes: its writer stays
    open until the test has closed `client` (its connection gone) and set `gone`."""
    desc = flight.FlightDescriptor.for_command(PutCommand(chunk_ticket=ticket).SerializeToString())
    writer = None
    try:
        writer, _ = client.do_put(desc, batch.schema)
        for _ in range(batches):
            writer.write_batch(batch)
    except Exception as exc:  # refused or cut off: what the test expects of most
        errors.append(exc)
    gone.wait()
    del writer


def test_unfinished_chunk_do_puts_hold_bounded_memory_freed_when_the_client_goes(start_server, tmp_path):
    """Sixteen DoPuts to 12 MiB cells of a u8 upload (cells fit one DoPut message) each send
    60 MiB and stall. Before, each held everything it sent (the cap was 8 bytes per element),
    and nothing bounded their number: 16 x 60 MiB. Now a chunk is capped at its cell's bytes
    and the server holds at most --max-upload-bytes-in-flight of them (16 MiB here: one
    chunk); the others wait for room, holding only what HTTP/2 flow control lets their
    connection send (32 MiB). Closing the client frees everything."""
    # Freed buffers are returned to the kernel at once, so RSS shows what the server holds
    # rather than what glibc keeps for reuse.
    env = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20), "TESSERA_MAX_UPLOAD_BYTES_IN_FLIGHT": "16MiB"}
    server = start_server(tmp_path, extra=WRITABLE, env=env)
    client = client_for(server)
    desc = client.setup_array_upload("cache://scratch/@fields/stalled", template((16, 12 << 20), "|u1"),
                                     chunk_shape=(1, 12 << 20))
    plan = _plan_write(client._state, desc.array_id, None)
    assert len(plan) == 16
    batch = pa.record_batch([pa.array(np.ones(4 << 20, dtype=np.uint8))], names=["data"])
    baseline = proc_status(server.pid, "VmRSS")
    hostile, gone, errors = flight.connect(server.location), threading.Event(), []
    threads = [threading.Thread(target=unfinished_put,
                                args=(hostile, chunk.ticket, batch, 15, gone, errors), daemon=True)
               for chunk in plan]
    for t in threads:
        t.start()
    time.sleep(8)
    peak = proc_status(server.pid, "VmHWM") - baseline
    held = proc_status(server.pid, "VmRSS") - baseline
    print(f"peak RSS +{peak >> 20} MiB, held +{held >> 20} MiB")
    assert peak < 128 << 20, f"16 unfinished DoPuts raised the server's peak RSS by {peak >> 20} MiB"
    hostile.close()
    gone.set()
    for t in threads:
        t.join(timeout=40)
    deadline = time.monotonic() + 10
    while proc_status(server.pid, "VmRSS") - baseline > 48 << 20:
        assert time.monotonic() < deadline, (
            f"the server still holds {(proc_status(server.pid, 'VmRSS') - baseline) >> 20} MiB "
            f"after the clients went (it held {held >> 20} MiB)")
        time.sleep(0.2)
    # The upload still takes a whole chunk: nothing stayed reserved.
    put = flight.connect(server.location)
    writer, reader = put.do_put(
        flight.FlightDescriptor.for_command(PutCommand(chunk_ticket=plan[0].ticket).SerializeToString()),
        batch.schema)
    for _ in range(3):
        writer.write_batch(batch)
    writer.done_writing()
    reader.read()
    writer.close()
    assert client.get_upload_status(desc.array_id)["uploaded_chunks"] == 1
