"""Uploads through the unmodified biopb 0.13.0 client: add_tensor, DoPut of chunks,
set_upload_status, get_upload_status, reads back on both routes, restart, SIGKILL,
TTL, refusals and the token."""
import contextlib
import os
import signal
import subprocess
import threading
import time

import dask.array as da
import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient
from biopb.tensor._upload import UploadRefused
from biopb.tensor.ticket_pb2 import ChunkBounds
from conftest import Server

WRITABLE = ("--writable",)
TOKEN = "upload-token_0123456789abcdef"


def kill_mid_upload(server, client, desc, arr, acked=8):
    """Uploads `arr` on a thread and SIGKILLs `server` once `acked` chunks are acknowledged;
    fails if the upload finished first."""
    failures = []

    def upload():
        try:
            client.upload_array(desc, arr)
        except Exception as exc:  # the server dies under it
            failures.append(exc)

    worker = threading.Thread(target=upload)
    worker.start()
    probe = client_for(server)
    deadline = time.monotonic() + 30
    while probe.get_upload_status(desc.array_id)["uploaded_chunks"] < acked:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(server.pid, signal.SIGKILL)
    server.proc.wait(timeout=20)
    worker.join(timeout=60)
    assert failures, "the upload finished before the kill; make the array larger"


def client_for(server, mode="do_get", token=None, monkeypatch=None):
    if monkeypatch is not None:
        if mode == "do_get":
            monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
        else:
            monkeypatch.delenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", raising=False)
    return TensorFlightClient(server.location, token=token, cache_bytes=0)


def read_back(client, array_id, expected):
    got = client.get_tensor(array_id).compute()
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.tobytes() == np.ascontiguousarray(expected).tobytes()
    sl = tuple(slice(d // 3, max(d // 3 + 1, (2 * d) // 3)) for d in expected.shape)
    part = client.get_tensor(array_id, slice_hint=sl).compute()
    assert part.tobytes() == np.ascontiguousarray(expected[sl]).tobytes()


def chunks_of(desc):
    """Every cell of the answered grid, in C order, as (start, stop)."""
    shape, chunk = list(desc.shape), list(desc.chunk_shape)
    grid = [range(0, d, c) for d, c in zip(shape, chunk)]
    cells = [()]
    for axis, starts in enumerate(grid):
        cells = [c + (s,) for c in cells for s in starts]
    return [
        (start, tuple(min(s + c, d) for s, c, d in zip(start, chunk, shape)))
        for start in cells
    ]


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_whole_upload_reads_back_exactly_on_both_routes(mode, monkeypatch, start_server, tmp_path):
    server = start_server(tmp_path, extra=WRITABLE + ("--chunk-target", "64KiB"))
    client = client_for(server, mode, monkeypatch=monkeypatch)
    assert client.health_check()["writable"] is True
    rng = np.random.default_rng(1)
    cases = {
        "u16": rng.integers(0, 65535, (5, 130, 170), dtype=np.uint16),
        "f32": rng.standard_normal((40, 33)).astype("<f4"),
        "i8": rng.integers(-(2**62), 2**62, (1000,), dtype="<i8"),
        "b1": rng.integers(0, 2, (17, 19)).astype(bool),
        "u1": rng.integers(0, 255, (3, 50, 60), dtype=np.uint8),
    }
    for name, arr in cases.items():
        desc = client.setup_array_upload(f"cache://scratch/@fields/{name}", arr)
        assert desc.array_id == f"scratch/@fields/{name}"
        assert client.get_upload_status(desc.array_id)["state"] == "PENDING"
        status = client.upload_array(desc, arr)
        assert status["state"] == "READY", status
        assert status["uploaded_chunks"] == status["expected_chunks"] > 0
        read_back(client, desc.array_id, arr)
    stats = client.cache_stats()
    if mode == "mmap":
        assert stats["locates"] > 0 and stats["do_gets"] == 0, stats
    else:
        assert stats["locates"] == 0 and stats["do_gets"] > 0, stats
    listed = {f.descriptor.path[0].decode() for f in flight.connect(server.location).list_flights()}
    assert {f"scratch/@fields/{n}" for n in cases} <= listed


def test_a_numpy_upload_over_one_put_message_is_cut_to_fit(start_server, tmp_path):
    # The client asks for one chunk of the whole array (its default for numpy); 32 MiB is
    # within the chunk cap but not within one DoPut message (16 MiB): the plan cuts it.
    server = start_server(tmp_path, extra=WRITABLE)
    client = client_for(server)
    arr = np.arange(4096 * 4096, dtype="<u2").reshape(4096, 4096)
    desc = client.setup_array_upload("cache://scratch/@fields/big", arr)
    assert np.prod(desc.chunk_shape) * arr.itemsize < 16 << 20, desc.chunk_shape
    status = client.upload_array(desc, arr)
    assert status["state"] == "READY", status
    assert status["uploaded_chunks"] == status["expected_chunks"] > 1
    read_back(client, desc.array_id, arr)


def test_dask_sliced_and_chunk_by_chunk_uploads(start_server, tmp_path):
    server = start_server(tmp_path, extra=WRITABLE)
    client = client_for(server)
    rng = np.random.default_rng(2)
    arr = rng.integers(0, 60000, (64, 96), dtype=np.uint16)

    # A dask array with its own chunking, uploaded in two slices, then published.
    darr = da.from_array(arr, chunks=(16, 32))
    desc = client.setup_array_upload("cache://scratch/@fields/sliced", darr)
    assert list(desc.chunk_shape) == [16, 32]
    first = client.upload_array(desc, darr, slice_hint=(slice(0, 32), slice(None)))
    assert first["state"] == "PENDING" and first["uploaded_chunks"] == 6, first
    client.upload_array(desc, darr, slice_hint=(slice(32, 64), slice(None)))
    assert client.get_upload_status(desc.array_id)["uploaded_chunks"] == 12
    assert client.set_upload_status(desc, "READY")["state"] == "READY"
    read_back(client, desc.array_id, arr)

    # Chunk by chunk, one left out: it reads back as zeros.
    desc = client.setup_array_upload("cache://scratch/@fields/byhand", arr, chunk_shape=(32, 48))
    cells = chunks_of(desc)
    assert len(cells) == 4
    for start, stop in cells[:-1]:
        sl = tuple(slice(a, b) for a, b in zip(start, stop))
        client.upload_chunk(desc, ChunkBounds(start=start, stop=stop), arr[sl])
    # A retried chunk is idempotent.
    start, stop = cells[0]
    client.upload_chunk(desc, ChunkBounds(start=start, stop=stop), arr[:32, :48])
    status = client.get_upload_status(desc.array_id)
    assert (status["expected_chunks"], status["uploaded_chunks"]) == (4, 3), status
    client.set_upload_status(desc, "READY")
    expected = arr.copy()
    expected[32:, 48:] = 0
    read_back(client, desc.array_id, expected)
    with pytest.raises(ValueError, match="not one chunk"):
        client.upload_chunk(desc, ChunkBounds(start=[0, 0], stop=[10, 10]), arr[:10, :10])


def test_status_ladder_and_refusals(start_server, tmp_path):
    np.save(tmp_path / "img.npy", np.arange(12, dtype=np.uint8).reshape(3, 4))
    server = start_server(tmp_path, extra=WRITABLE)
    client = client_for(server)
    arr = np.arange(600, dtype="<f8").reshape(20, 30)
    desc = client.setup_array_upload("cache://scratch/@fields/ladder", arr, chunk_shape=(10, 30))
    assert desc.upload_status.expected_chunks == 2
    assert desc.HasField("ttl_seconds") and desc.ttl_seconds > 0

    # Reads of a PENDING upload are refused; the name is taken.
    with pytest.raises(Exception, match="PENDING"):
        client.get_tensor(desc.array_id).compute()
    with pytest.raises(flight.FlightError, match="already taken"):
        client.setup_array_upload("cache://scratch/@fields/ladder", arr)

    # A wrong dtype, a wrong shape, a ticket of another tensor: each refused, nothing stored.
    good = ChunkBounds(start=[0, 0], stop=[10, 30])
    with pytest.raises(flight.FlightError, match="Int32"):
        client.upload_chunk(desc, good, arr[:10].astype("<i4"))
    with pytest.raises(flight.FlightError, match="300 elements"):
        client.upload_chunk(desc, good, arr[:5])
    from biopb.tensor._upload import _plan_write, _put_chunk  # the client's own write path
    source_plan = _plan_write(client._state, "img", None)
    with pytest.raises(flight.FlightError, match="'img', which is not an upload"):
        # A read ticket of a served source is no upload's ticket.
        _put_chunk(client._state.client, client._state.call_options, "img",
                   source_plan[0].ticket, np.load(tmp_path / "img.npy"))
    other = client.setup_array_upload("cache://scratch/@fields/other", arr, chunk_shape=(10, 30), ttl_seconds=1)
    other_plan = _plan_write(client._state, other.array_id, None)
    # A ticket of an earlier upload of the same name (discarded, then added again).
    client.set_upload_status(other, "DISCARDED")
    while client.get_upload_status(other.array_id)["state"] != "UNKNOWN":
        time.sleep(0.2)
    other = client.setup_array_upload("cache://scratch/@fields/other", arr, chunk_shape=(10, 30))
    with pytest.raises(flight.FlightError, match="earlier upload"):
        _put_chunk(client._state.client, client._state.call_options, other.array_id,
                   other_plan[0].ticket, arr[:10])
    assert client.get_upload_status(desc.array_id)["uploaded_chunks"] == 0

    # Up the ladder, a no-op at the same state, never back.
    client.upload_chunk(desc, good, arr[:10])
    assert client.set_upload_status(desc, "PENDING")["state"] == "PENDING"
    assert client.set_upload_status(desc, "READY")["state"] == "READY"
    assert client.set_upload_status(desc, "READY")["state"] == "READY"
    with pytest.raises(flight.FlightError, match="cannot move back"):
        client.set_upload_status(desc, "PENDING")
    # A sealed upload refuses chunks with the client's typed refusal.
    with pytest.raises(UploadRefused) as refused:
        client.upload_chunk(desc, ChunkBounds(start=[10, 0], stop=[20, 30]), arr[10:])
    assert refused.value.state == "READY"

    # DISCARDED from READY: storage reclaimed, the name stays taken, writes refused typed.
    data_root = tmp_path / "state0" / "uploads" / "data"
    before = set(data_root.iterdir())
    done = client.set_upload_status(desc, "DISCARDED", reason="wrong parameters")
    assert done["state"] == "DISCARDED" and done["reason"] == "wrong parameters"
    with pytest.raises(UploadRefused) as refused:
        client.set_upload_status(desc, "READY")
    assert refused.value.state == "DISCARDED" and refused.value.reason == "wrong parameters"
    with pytest.raises(flight.FlightError, match="already taken"):
        client.setup_array_upload("cache://scratch/@fields/ladder", arr)
    assert client.get_upload_status(desc.array_id)["state"] == "DISCARDED"
    # Discarding what is no upload answers UNKNOWN; other ids and formats are refused.
    assert client.set_upload_status("scratch/@fields/never", "DISCARDED")["state"] == "UNKNOWN"
    assert client.get_upload_status("scratch/@fields/never")["state"] == "UNKNOWN"
    with pytest.raises(flight.FlightError, match="Zarr"):
        client.setup_array_upload("zarr://scratch/@labels/cells", arr)
    with pytest.raises(flight.FlightError, match="no served source"):
        client.setup_array_upload("cache://nosuch/@fields/x", arr)
    with pytest.raises(flight.FlightError, match="ttl_seconds"):
        client.setup_array_upload("cache://scratch/@fields/zero", arr, ttl_seconds=0)
    after = set(data_root.iterdir())
    assert len(after) == len(before) - 1 and after < before, (before, after)


def test_upload_onto_a_served_source(start_server, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "image.npy", np.zeros((4, 4), dtype=np.uint8))
    server = start_server(src, extra=WRITABLE)
    client = client_for(server)
    arr = np.arange(48, dtype=np.uint16).reshape(6, 8)
    desc = client.setup_array_upload("cache://image/@fields/mask", arr)
    assert desc.array_id == "image/@fields/mask"
    assert not desc.HasField("ttl_seconds")
    rows = client.query("SELECT array_id FROM tensors", format="records")
    assert [r["array_id"] for r in rows] == ["image"], rows  # PENDING: not listed
    client.upload_array(desc, arr)
    read_back(client, desc.array_id, arr)
    # READY: a row of `tensors` and a tensor of its source in `sources`.
    rows = client.query("SELECT array_id, source_id, shape, dtype, nbytes FROM tensors ORDER BY array_id",
                        format="records")
    assert rows[1] == {"array_id": "image/@fields/mask", "source_id": "image", "shape": [6, 8],
                       "dtype": "<u2", "nbytes": 96}, rows
    sources = client.query("SELECT source_id, tensors FROM sources", format="records")
    assert [t["array_id"] for t in sources[0]["tensors"]] == ["image", "image/@fields/mask"], sources
    scratch = np.ones(5, dtype=np.uint8)
    client.upload_array(client.setup_array_upload("cache://scratch/@fields/s", scratch), scratch)
    ids = [r["source_id"] for r in client.query("SELECT source_id FROM sources ORDER BY source_id",
                                                format="records")]
    assert ids == ["image", "scratch"], ids


def test_read_only_server_refuses_writes_naming_the_flag(start_server, tmp_path):
    server = start_server(tmp_path)
    client = client_for(server)
    assert client.health_check()["writable"] is False
    with pytest.raises(flight.FlightError, match="--writable"):
        client.setup_array_upload("cache://scratch/@fields/x", np.zeros(4))
    with pytest.raises(flight.FlightError, match="--writable"):
        client.set_upload_status("scratch/@fields/x", "READY")


def test_writes_need_the_token(start_server, tmp_path):
    server = start_server(tmp_path, extra=WRITABLE + ("--token", TOKEN))
    arr = np.arange(100, dtype=np.int16)
    bad = TensorFlightClient(server.location, token="wrong-token_0123456789abcd", cache_bytes=0)
    with pytest.raises(flight.FlightUnauthenticatedError):
        bad.setup_array_upload("cache://scratch/@fields/t", arr)
    good = client_for(server, token=TOKEN)
    desc = good.setup_array_upload("cache://scratch/@fields/t", arr)
    plan_client = good._state
    from biopb.tensor._upload import _plan_write, _put_chunk
    plan = _plan_write(plan_client, desc.array_id, None)
    anonymous = flight.connect(server.location)
    with pytest.raises(flight.FlightUnauthenticatedError):
        _put_chunk(anonymous, flight.FlightCallOptions(), desc.array_id, plan[0].ticket, arr)
    with pytest.raises(flight.FlightUnauthenticatedError):
        bad.set_upload_status(desc, "READY")
    assert good.upload_array(desc, arr)["state"] == "READY"
    read_back(good, desc.array_id, arr)


def test_restart_keeps_ready_and_pending_uploads(start_server, tmp_path):
    state = tmp_path / "kept-state"
    extra = WRITABLE + ("--state-dir", str(state))
    server = start_server(tmp_path, extra=extra)
    client = client_for(server)
    rng = np.random.default_rng(3)
    ready = rng.integers(0, 65535, (50, 70), dtype=np.uint16)
    pending = rng.standard_normal((40, 40)).astype("<f4")
    d1 = client.setup_array_upload("cache://scratch/@fields/ready", ready)
    client.upload_array(d1, ready)
    d2 = client.setup_array_upload("cache://scratch/@fields/pending", pending, chunk_shape=(10, 40))
    client.upload_chunk(d2, ChunkBounds(start=[0, 0], stop=[10, 40]), pending[:10])
    assert server.stop() == 0

    server = start_server(tmp_path, extra=extra)
    client = client_for(server)
    read_back(client, d1.array_id, ready)
    status = client.get_upload_status(d2.array_id)
    assert (status["state"], status["uploaded_chunks"]) == ("PENDING", 1), status
    for i in range(1, 4):
        client.upload_chunk(d2, ChunkBounds(start=[10 * i, 0], stop=[10 * i + 10, 40]), pending[10 * i:10 * i + 10])
    client.set_upload_status(d2, "READY")
    read_back(client, d2.array_id, pending)


def test_sigkill_between_acks_then_resume(start_server, tmp_path):
    state = tmp_path / "killed-state"
    extra = WRITABLE + ("--state-dir", str(state))
    rng = np.random.default_rng(4)
    arr = rng.integers(0, 65535, (8, 256, 256), dtype=np.uint16)
    # Started by hand: the fixture expects a clean exit of every server it started.
    server = Server([tmp_path, "--cache-dir", tmp_path / "killed-cache", *extra])
    client = client_for(server)
    done = client.setup_array_upload("cache://scratch/@fields/done", arr[0])
    client.upload_array(done, arr[0])
    desc = client.setup_array_upload("cache://scratch/@fields/killed", arr, chunk_shape=(1, 256, 256))
    for i in range(5):
        client.upload_chunk(desc, ChunkBounds(start=[i, 0, 0], stop=[i + 1, 256, 256]), arr[i:i + 1])
    os.kill(server.pid, signal.SIGKILL)
    server.proc.wait(timeout=20)

    server = start_server(tmp_path, extra=extra)
    client = client_for(server)
    read_back(client, done.array_id, arr[0])
    status = client.get_upload_status(desc.array_id)
    assert (status["state"], status["uploaded_chunks"]) == ("PENDING", 5), status
    for i in range(5, 8):
        client.upload_chunk(desc, ChunkBounds(start=[i, 0, 0], stop=[i + 1, 256, 256]), arr[i:i + 1])
    assert client.set_upload_status(desc, "READY")["uploaded_chunks"] == 8
    read_back(client, desc.array_id, arr)


def test_ttl_expires_discards_then_frees_the_name(start_server, tmp_path):
    state = tmp_path / "ttl-state"
    extra = WRITABLE + ("--state-dir", str(state))
    server = start_server(tmp_path, extra=extra)
    client = client_for(server)
    arr = np.arange(64, dtype=np.uint8)
    desc = client.setup_array_upload("cache://scratch/@fields/short", arr, ttl_seconds=2)
    assert desc.ttl_seconds == 2
    client.upload_array(desc, arr)
    read_back(client, desc.array_id, arr)
    deadline = time.monotonic() + 15
    while client.get_upload_status(desc.array_id)["state"] != "DISCARDED":
        assert time.monotonic() < deadline, "the upload did not expire"
        time.sleep(0.2)
    status = client.get_upload_status(desc.array_id)
    assert "expired" in status["reason"], status
    # A read says why it is not readable: expired, not only DISCARDED.
    with pytest.raises(Exception, match="DISCARDED and not readable: expired"):
        client.get_tensor(desc.array_id).compute()
    # The tombstone lasts the lifetime again, across a restart, then the name frees.
    assert server.stop() == 0
    server = start_server(tmp_path, extra=extra)
    client = client_for(server)
    deadline = time.monotonic() + 15
    while client.get_upload_status(desc.array_id)["state"] != "UNKNOWN":
        assert time.monotonic() < deadline, "the name was not freed"
        time.sleep(0.2)
    again = client.setup_array_upload("cache://scratch/@fields/short", arr)
    assert again.array_id == desc.array_id


def test_a_full_disk_refuses_cleanly_and_keeps_what_was_acked(tmp_path):
    """The state directory on a 6 MiB tmpfs: chunks are refused once it is full, the
    upload stays PENDING with exactly the acknowledged chunks, which read back exactly,
    and discarding it frees the room."""
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot mount a tmpfs for the full-disk test: {mounted.stderr}")
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr}")
    server = None
    try:
        server = Server([tmp_path, "--cache-dir", tmp_path / "cache", "--writable",
                         "--state-dir", mount / "state"])
        client = client_for(server)
        rng = np.random.default_rng(5)
        arr = rng.integers(0, 255, (12, 1024, 1024), dtype=np.uint8)
        desc = client.setup_array_upload("cache://scratch/@fields/big", arr, chunk_shape=(1, 1024, 1024))
        acked = 0
        with pytest.raises(flight.FlightUnavailableError, match="full"):
            for i in range(12):
                client.upload_chunk(desc, ChunkBounds(start=[i, 0, 0], stop=[i + 1, 1024, 1024]), arr[i:i + 1])
                acked += 1
        assert 0 < acked < 12
        status = client.get_upload_status(desc.array_id)
        assert (status["state"], status["uploaded_chunks"]) == ("PENDING", acked), status
        client.set_upload_status(desc, "READY")
        got = client.get_tensor(desc.array_id, slice_hint=(slice(0, acked), slice(None), slice(None))).compute()
        assert got.tobytes() == arr[:acked].tobytes()
        client.set_upload_status(desc, "DISCARDED")
        small = np.arange(1000, dtype=np.uint16)
        again = client.setup_array_upload("cache://scratch/@fields/after", small)
        assert client.upload_array(again, small)["state"] == "READY"
        read_back(client, again.array_id, small)
    finally:
        if server is not None:
            assert server.stop() == 0, "".join(server.log)
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.parametrize("layout", ["c", "fortran", "big_endian"])
def test_tessera_put_uploads_a_npy_that_reads_back_exactly(layout, start_server, tmp_path):
    from conftest import tessera_bin
    server = start_server(tmp_path, extra=WRITABLE + ("--token", TOKEN, "--chunk-target", "64KiB"))
    rng = np.random.default_rng(6)
    arr = rng.integers(-30000, 30000, (7, 120, 90), dtype="<i2")
    if layout == "fortran":
        arr = np.asfortranarray(arr)
    elif layout == "big_endian":
        arr = arr.astype(">i2")
    path = tmp_path / f"{layout}.npy"
    np.save(path, arr)
    env = {**os.environ, "TESSERA_TOKEN": TOKEN}
    done = subprocess.run([tessera_bin(), "put", server.location, f"scratch/@fields/{layout}", str(path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "READY" in done.stdout, done.stdout
    client = client_for(server, token=TOKEN)
    got = client.get_tensor(f"scratch/@fields/{layout}").compute()
    assert got.dtype == np.dtype("<i2")
    np.testing.assert_array_equal(got, arr)
    listed = subprocess.run([tessera_bin(), "ls", server.location], capture_output=True, text=True,
                            env=env, timeout=60)
    assert f"scratch/@fields/{layout}" in listed.stdout, listed.stdout
    again = subprocess.run([tessera_bin(), "put", server.location, f"scratch/@fields/{layout}", str(path)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 1 and "already taken" in again.stderr, again.stderr


@contextlib.contextmanager
def published_after_a_kill(tmp_path, url, seed):
    """Uploads a 128-plane u16 array (no zero values) to `url`, SIGKILLs the server once 8
    chunks are acknowledged, restarts it on the same state directory and publishes the upload
    as it is: every acknowledged chunk reads back exactly and every other plane as zeros.
    Yields the client of the restarted server, the descriptor, the read and the status."""
    extra = ["--writable", "--state-dir", tmp_path / "killed-state"]
    planes = 128
    arr = np.random.default_rng(seed).integers(1, 65535, (planes, 512, 512), dtype=np.uint16)
    server = Server([tmp_path, "--cache-dir", tmp_path / "c1", *extra])
    client = client_for(server)
    desc = client.setup_array_upload(url, arr, chunk_shape=(1, 512, 512))
    kill_mid_upload(server, client, desc, arr)

    server2 = Server([tmp_path, "--cache-dir", tmp_path / "c2", *extra])
    try:
        client = client_for(server2)
        status = client.get_upload_status(desc.array_id)
        assert status["state"] == "PENDING" and 8 <= status["uploaded_chunks"] < planes, status
        client.set_upload_status(desc, "READY")
        got = client.get_tensor(desc.array_id).compute()
        exact = 0
        for i in range(planes):
            if np.array_equal(got[i], arr[i]):
                exact += 1
            else:
                assert not got[i].any(), f"plane {i} is neither the sent chunk nor zeros"
        assert exact == status["uploaded_chunks"], (exact, status)
        yield client, desc, got, status
    finally:
        assert server2.stop() == 0, "".join(server2.log)


def test_sigkill_mid_upload_array_keeps_exactly_the_acked_chunks(tmp_path):
    """SIGKILL while `upload_array` has chunks in flight: after a restart the upload is
    PENDING, and published as it is every counted chunk reads back exactly and every
    other cell as zeros -- never a torn or stale chunk."""
    with published_after_a_kill(tmp_path, "cache://scratch/@fields/inflight", seed=8):
        pass


def test_scratch_lifetimes_are_capped_by_upload_max_ttl(start_server, tmp_path):
    server = start_server(tmp_path, extra=WRITABLE + ("--upload-max-ttl", "1m"))
    client = client_for(server)
    arr = np.zeros(10, dtype=np.uint8)
    assert client.setup_array_upload("cache://scratch/@fields/a", arr, ttl_seconds=3600).ttl_seconds == 60
    assert client.setup_array_upload("cache://scratch/@fields/b", arr).ttl_seconds == 60
    assert client.setup_array_upload("cache://scratch/@fields/c", arr, ttl_seconds=5).ttl_seconds == 5


def mount_tmpfs(mount, size):
    """Mounts a tmpfs of `size` at `mount` (needs root); skips otherwise, fails under CI."""
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot mount a tmpfs for the full-disk test: {mounted.stderr}")
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr}")


def fill(path):
    """Writes into `path` until the filesystem takes not one byte more."""
    with open(path, "wb", buffering=0) as f:
        block = b"\0" * (64 << 10)
        for size in (len(block), 1):
            try:
                while f.write(block[:size]):
                    pass
            except OSError:
                pass


def test_a_full_state_disk_recovers_by_a_discard_without_a_restart(tmp_path):
    """Issue 28 item 13. The state directory's filesystem fills up (someone else's file
    takes the last byte): annotation writes and upload records fail UNAVAILABLE, not
    INTERNAL; discarding an upload, the way to free room, works on the full disk; and both
    databases (the upload manifest and the annotations) work again once there is room,
    without a restart (redb answered "Previous I/O error occurred" until one)."""
    from biopb.image.annotation_pb2 import RoiAnnotation
    from google.protobuf import json_format

    def point(label):
        roi = RoiAnnotation(label=label)
        json_format.Parse('{"point": {"x": 1, "y": 2}}', roi.roi)
        return roi

    mount = tmp_path / "small"
    mount_tmpfs(mount, "8m")
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "img.npy", np.zeros((64, 64), dtype=np.uint8))
    server = None
    try:
        server = Server([src, "--cache-dir", tmp_path / "cache", "--writable",
                         "--state-dir", mount / "state"])
        client = client_for(server)
        rng = np.random.default_rng(13)
        big = rng.integers(0, 255, (4, 1024, 1024), dtype=np.uint8)
        desc = client.setup_array_upload("cache://scratch/@fields/big", big, chunk_shape=(1, 1024, 1024))
        assert client.upload_array(desc, big)["state"] == "READY"
        client.put_rois("img", [point("before")])

        filler = mount / "filler"
        fill(filler)
        # Writes to both databases fail, each as UNAVAILABLE, until each has had to grow.
        roi_failed = None
        for i in range(200):
            try:
                client.put_rois("img", [point(f"full-{i}-{j}" + "x" * 100) for j in range(50)])
            except flight.FlightError as exc:
                roi_failed = exc
                break
        assert isinstance(roi_failed, flight.FlightUnavailableError), repr(roi_failed)
        assert "full" in str(roi_failed)
        add_failed = None
        for i in range(2000):
            try:
                client.setup_array_upload(f"cache://scratch/@fields/small{i}", np.zeros(4, np.uint8))
            except flight.FlightError as exc:
                add_failed = exc
                break
        assert isinstance(add_failed, flight.FlightUnavailableError), repr(add_failed)
        assert "full" in str(add_failed)

        # The discard works on the full disk and frees the room.
        done = client.set_upload_status(desc, "DISCARDED", reason="making room")
        assert done["state"] == "DISCARDED", done
        assert not any((mount / "state" / "uploads" / "data").iterdir())

        # Both databases work again in that room, the other file still there: no restart.
        small = np.arange(1000, dtype=np.uint16)
        again = client.setup_array_upload("cache://scratch/@fields/after", small)
        assert client.upload_array(again, small)["state"] == "READY"
        read_back(client, again.array_id, small)
        client.put_rois("img", [point("after")])
        labels = {r.label for r in client.list_rois("img").rois}
        assert {"before", "after"} <= labels, labels
        assert client.get_upload_status(desc.array_id)["reason"] == "making room"
        os.remove(filler)
    finally:
        if server is not None:
            assert server.stop() == 0, "".join(server.log)
        subprocess.run(["umount", str(mount)], check=False)


def proc_counts(pid):
    """(threads, open descriptors) of process `pid`, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def test_many_uploads_hold_bounded_descriptors_and_threads(start_server, tmp_path):
    """Issue 28 item 14. 300 uploads, each written and read back: the server's threads and
    descriptors stay bounded by --upload-open-stores (each open store held two descriptors
    and a thread each: 1,500 uploads took 3,017 descriptors and 1,506 threads), every upload
    reads back exactly, and one more than --upload-max-count is refused by that name."""
    count, open_stores = 300, 16
    server = start_server(tmp_path, extra=WRITABLE + (
        "--upload-open-stores", str(open_stores), "--upload-max-count", str(count)))
    client = client_for(server)
    first = np.arange(16, dtype="<u2").reshape(2, 8)
    desc = client.setup_array_upload("cache://scratch/@fields/first", first, chunk_shape=(1, 8))
    client.upload_array(desc, first)
    threads0, fds0 = proc_counts(server.pid)
    arrays = {"scratch/@fields/first": first}
    peak = (threads0, fds0)
    for i in range(1, count):
        arr = (np.arange(16, dtype="<u2") + i).reshape(2, 8)
        desc = client.setup_array_upload(f"cache://scratch/@fields/u{i:03d}", arr, chunk_shape=(1, 8))
        assert client.upload_array(desc, arr)["state"] == "READY"
        arrays[desc.array_id] = arr
        if i % 50 == 0:
            peak = tuple(max(p, n) for p, n in zip(peak, proc_counts(server.pid)))
    for array_id, arr in arrays.items():
        got = client.get_tensor(array_id).compute()
        assert got.tobytes() == arr.tobytes(), array_id
    peak = tuple(max(p, n) for p, n in zip(peak, proc_counts(server.pid)))
    threads, fds = peak
    assert threads <= threads0 + 24, f"threads {threads0} -> {threads} for {count} uploads"
    assert fds <= fds0 + 2 * open_stores + 24, f"descriptors {fds0} -> {fds} for {count} uploads"
    with pytest.raises(flight.FlightError, match=f"holds {count} uploads.*upload_max_count"):
        client.setup_array_upload("cache://scratch/@fields/one-more", first)


def test_long_discard_reasons_and_axis_labels_are_refused(start_server, tmp_path):
    """A 10 MB discard reason is refused as the client's typed UploadRefused (nothing
    changes; it used to be stored and then sent back in every later refusal's metadata),
    and a 1 MB axis label is refused by its length."""
    server = start_server(tmp_path, extra=WRITABLE)
    client = client_for(server)
    arr = np.arange(12, dtype=np.uint8).reshape(3, 4)
    with pytest.raises(flight.FlightError, match=r"dim_labels\[1\] is 1000000 bytes, over the limit of 256"):
        client.setup_array_upload("cache://scratch/@fields/labels", arr, dim_labels=["y", "x" * 1_000_000])
    desc = client.setup_array_upload("cache://scratch/@fields/reason", arr, dim_labels=["y", "x" * 256])
    with pytest.raises(UploadRefused) as refused:
        client.set_upload_status(desc, "DISCARDED", reason="r" * 10_000_000)
    assert refused.value.state == "PENDING"
    assert "10000000 bytes, over the limit of 1024" in refused.value.reason
    assert client.get_upload_status(desc.array_id)["state"] == "PENDING"
    done = client.set_upload_status(desc, "DISCARDED", reason="r" * 1024)
    assert done["state"] == "DISCARDED" and done["reason"] == "r" * 1024
    with pytest.raises(UploadRefused) as refused:
        client.set_upload_status(desc, "READY")
    assert refused.value.state == "DISCARDED" and refused.value.reason == "r" * 1024
