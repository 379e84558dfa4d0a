"""ROI annotations through the unmodified biopb 0.13.0 client: put, list, delete and
prune, check_rev conflicts, every geometry arm and each refusal, the caps, sealed ROI
tickets (valid, expired, tampered, another version), restart and SIGKILL durability,
the token."""
import hashlib
import hmac
import json
import os
import signal
import struct
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from biopb.image.annotation_pb2 import RoiAnnotation
from biopb.tensor import TensorFlightClient
from biopb.tensor._roi_rows import rois_to_table
from biopb.tensor.descriptor_pb2 import CatalogQuery
from biopb.tensor.ticket_pb2 import PutCommand, RoiPut, TensorTicket

TOKEN = "interop-token_0123456789"


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    np.save(d / "img.npy", np.arange(64 * 80, dtype="<u2").reshape(64, 80))
    np.save(d / "other.npy", np.zeros((4, 10, 10), dtype="<f4"))
    return d


def client_of(server, token=None):
    return TensorFlightClient(server.location, token=token, cache_bytes=0)


def ann(shape_json=None, **fields):
    """A RoiAnnotation whose geometry is given as proto3 JSON of biopb.image.ROI."""
    from google.protobuf import json_format

    a = RoiAnnotation(**{k: v for k, v in fields.items() if k != "plane"})
    json_format.Parse(json.dumps(shape_json or {"point": {"x": 1, "y": 2}}), a.roi)
    for axis, index in fields.get("plane", {}).items():
        a.plane[axis] = index
    return a


EVERY_ARM = {
    "point": {"point": {"x": 3.5, "y": 4.25}},
    "rectangle": {"rectangle": {"topLeft": {"x": 1, "y": 2}, "bottomRight": {"x": 30, "y": 40}}},
    "ellipse": {"ellipse": {"center": {"x": 10, "y": 10}, "radius": {"x": 4, "y": 2}, "rotation": 0.5}},
    "polygon": {"polygon": {"points": [{"x": 0, "y": 0}, {"x": 10, "y": 0}, {"x": 5, "y": 8}]}},
    "polyline": {"polyline": {"points": [{"x": 0, "y": 0}, {"x": 20, "y": 5}], "width": 3}},
    "text": {"text": {"at": {"x": 7, "y": 9}, "text": "nucleus\nleft"}},
}


def test_put_list_update_delete_every_arm(start_server, data_dir):
    server = start_server(data_dir)
    c = client_of(server)
    assert c.list_rois("img").rois == []
    put = c.put_rois(
        "img",
        [
            ann(shape, set_name="shapes", label=name, props_json='{"c": 1}', plane={0: 2})
            for name, shape in EVERY_ARM.items()
        ]
        + [ann(label="unset", drawn_against_version=b"\x01\x02")],
    )
    assert put.conflicts == []
    assert len(put.stored) == 7
    for stored in put.stored:
        assert len(stored.roi_id) == 32 and stored.rev == 1
        assert stored.created_at_unix_ms > 0 and stored.updated_at_unix_ms == stored.created_at_unix_ms
    by_label = {s.label: s for s in put.stored}
    assert by_label["unset"].set_name == "default"
    for name, shape in EVERY_ARM.items():
        assert by_label[name].roi.WhichOneof("shape") == name
    assert by_label["text"].roi.text.text == "nucleus\nleft"
    assert by_label["polyline"].roi.polyline.width == 3

    listed = c.list_rois("img")
    assert not listed.truncated
    assert {(s.set_name, s.count, s.reserved) for s in listed.sets} == {
        ("shapes", 6, False),
        ("default", 1, False),
    }
    got = {r.roi_id: r for r in listed.rois}
    assert set(got) == {s.roi_id for s in put.stored}
    for s in put.stored:
        r = got[s.roi_id]
        assert r.roi == s.roi and r.label == s.label and r.set_name == s.set_name
        assert r.array_id == "img" and r.rev == 1
    assert dict(got[by_label["polygon"].roi_id].plane) == {0: 2}
    assert got[by_label["rectangle"].roi_id].props_json == '{"c": 1}'
    assert got[by_label["unset"].roi_id].drawn_against_version == b"\x01\x02"
    assert not got[by_label["point"].roi_id].HasField("drawn_against_version")
    # One set by name; the other tensor has none.
    assert {r.label for r in c.list_rois("img", "default").rois} == {"unset"}
    assert c.list_rois("other").rois == []

    # Update by id: rev bumps, created_at stays; a client-named id is created.
    point = by_label["point"]
    moved = ann({"point": {"x": 50, "y": 60}}, roi_id=point.roi_id, set_name="shapes", label="moved")
    upd = c.put_rois("img", [moved, ann(roi_id="my-own-id", label="named")])
    assert [s.rev for s in upd.stored] == [2, 1]
    assert upd.stored[0].created_at_unix_ms == point.created_at_unix_ms
    assert upd.stored[1].roi_id == "my-own-id"
    again = {r.roi_id: r for r in c.list_rois("img").rois}
    assert again[point.roi_id].roi.point.x == 50 and again[point.roi_id].label == "moved"

    # Delete: by ids (an unknown id is simply absent), by set, then everything.
    gone = c.delete_rois("img", [point.roi_id, "no-such-id"])
    assert list(gone.deleted) == [point.roi_id]
    assert sorted(c.delete_rois("img", set_name="default").deleted) == sorted(
        [by_label["unset"].roi_id, "my-own-id"]
    )
    assert len(c.delete_rois("img").deleted) == 5
    listed = c.list_rois("img")
    assert listed.rois == [] and list(listed.sets) == []


def test_check_rev_conflicts_leave_the_rest_of_the_batch(start_server, data_dir):
    server = start_server(data_dir)
    c = client_of(server)
    a, b = c.put_rois("img", [ann(label="a"), ann(label="b")]).stored
    # A second writer moves `a` on.
    c.put_rois("img", [ann(roi_id=a.roi_id, label="a2", rev=a.rev)], check_rev=True)
    stale = ann(roi_id=a.roi_id, label="a-stale", rev=a.rev)
    fresh = ann(roi_id=b.roi_id, label="b2", rev=b.rev)
    res = c.put_rois("img", [stale, fresh, ann(label="new")], check_rev=True)
    assert [(x.roi_id, x.stored_rev) for x in res.conflicts] == [(a.roi_id, 2)]
    assert [s.label for s in res.stored] == ["b2", "new"]
    labels = {r.roi_id: r.label for r in c.list_rois("img").rois}
    assert labels[a.roi_id] == "a2" and labels[b.roi_id] == "b2"
    # Without check_rev the last writer wins.
    res = c.put_rois("img", [stale])
    assert res.conflicts == [] and res.stored[0].rev == 3


REFUSALS = [
    ({"mask": {"rectangle": {}}}, {}, "'mask' is not stored"),
    ({"mesh": {"verts": [{"x": 1}]}}, {}, "'mesh' is not stored"),
    ({}, {}, "no geometry"),
    ({"point": {"x": "NaN"}}, {}, "point.x is NaN"),
    ({"rectangle": {"topLeft": {"y": "Infinity"}}}, {}, "must be finite"),
    ({"polygon": {"points": [{"x": 1}, {"x": 2}]}}, {}, "at least 3 points"),
    ({"polyline": {"points": [{"x": 1}]}}, {}, "at least 2 points"),
    ({"text": {"at": {"x": 1}, "text": "  "}}, {}, "non-empty caption"),
    ({"text": {"text": "x" * 2001}}, {}, "2000"),
    (None, {"set_name": "@ome"}, "reserved"),
    (None, {"array_id": "other"}, "does not match"),
    (None, {"roi_id": "a,b"}, "comma"),
    (None, {"props_json": "x" * (70 << 10)}, "max_roi_bytes"),
]


@pytest.mark.parametrize("shape,fields,reason", REFUSALS, ids=[r[2] for r in REFUSALS])
def test_each_refusal_names_why_and_writes_nothing(start_server, data_dir, shape, fields, reason):
    server = start_server(data_dir)
    c = client_of(server)
    bad = RoiAnnotation(label="bad", **fields)
    if shape is not None:
        from google.protobuf import json_format

        if "mask" in shape or "mesh" in shape or shape == {}:
            json_format.Parse(json.dumps(shape), bad.roi)
            batch = [ann(label="good"), bad]
            put = lambda: c.put_rois("img", batch)  # noqa: E731
        else:
            # Values the client's own encoder cannot write (NaN as text, too long): send
            # the rows as the wire carries them.
            put = lambda: raw_put(server, "img", [{"geometry": json.dumps(shape)}])  # noqa: E731
    else:
        bad.roi.point.x = 1
        put = lambda: c.put_rois("img", [ann(label="good"), bad])  # noqa: E731
    with pytest.raises(flight.FlightError, match=reason):
        put()
    assert c.list_rois("img").rois == []


def raw_put(server, array_id, rows, token=None, check_rev=False):
    """A roi_put DoPut of hand-made rows in the ROI row schema."""
    table = rois_to_table([])
    full = []
    for row in rows:
        base = {name: None for name in table.schema.names}
        base.update({"roi_id": "", "array_id": "", "set_name": "", "label": "", "rev": 0})
        base.update(row)
        full.append(base)
    table = pa.Table.from_pylist(full, schema=table.schema)
    fc = flight.FlightClient(server.location)
    opts = flight.FlightCallOptions(
        headers=[(b"authorization", f"Bearer {token}".encode())] if token else []
    )
    cmd = PutCommand(roi_put=RoiPut(array_id=array_id, check_rev=check_rev))
    writer, reader = fc.do_put(
        flight.FlightDescriptor.for_command(cmd.SerializeToString()), table.schema, options=opts
    )
    with writer:
        writer.write_table(table)
        writer.done_writing()
        return reader.read()


def test_unknown_tensor_and_missing_array_id_are_refused(start_server, data_dir):
    server = start_server(data_dir)
    c = client_of(server)
    with pytest.raises(flight.FlightError, match="no-such"):
        c.put_rois("no-such", [ann()])
    with pytest.raises(flight.FlightError, match="names no array_id"):
        c.put_rois("", [ann()])
    with pytest.raises(flight.FlightError, match="roi_id 'x' appears twice"):
        c.put_rois("img", [ann(roi_id="x"), ann(roi_id="x")])
    with pytest.raises(flight.FlightError, match="reserved"):
        c.delete_rois("img", set_name="@ome")


def test_the_per_tensor_cap_refuses_a_batch_that_would_pass_it(start_server, data_dir):
    server = start_server(data_dir)
    c = client_of(server)
    batch = [ann({"point": {"x": i}}, label=f"p{i}") for i in range(10_000)]
    assert len(c.put_rois("img", batch).stored) == 10_000
    listed = c.list_rois("img")
    assert len(listed.rois) == 10_000 and not listed.truncated
    with pytest.raises(flight.FlightError, match=r"10000 stored \+ 1 new .*max_rois_per_tensor"):
        c.put_rois("img", [ann(label="one too many")])
    # Updating a stored one still fits; another tensor has its own cap.
    first = listed.rois[0]
    c.put_rois("img", [ann(roi_id=first.roi_id, label="edited")])
    c.put_rois("other", [ann(label="elsewhere")])
    with pytest.raises(flight.FlightError, match="at most 10000 rows"):
        c.put_rois("other", batch + [ann()])
    # One message is bounded by the server's 16 MiB request limit; a stream of many is
    # bounded as a whole.
    table = rois_to_table([ann(props_json="p" * (60 << 10))] * 1200)
    fc = flight.FlightClient(server.location)
    cmd = PutCommand(roi_put=RoiPut(array_id="other"))
    writer, reader = fc.do_put(flight.FlightDescriptor.for_command(cmd.SerializeToString()), table.schema)
    with pytest.raises(flight.FlightError, match="at most 64 MiB"):
        with writer:
            writer.write_table(table, max_chunksize=100)
            writer.done_writing()
            reader.read()
    assert [r.label for r in c.list_rois("other").rois] == ["elsewhere"]


def test_the_put_limit_counts_the_bytes_sent(start_server, data_dir):
    """A 9.6 MB put is far under the 64 MiB a put may carry; counted by decoded Arrow
    memory (whole shared buffers once per batch) it was refused as over 64 MiB."""
    server = start_server(data_dir)
    c = client_of(server)
    batch = [ann(label=f"r{i}", props_json="p" * 9_600) for i in range(1_000)]
    assert len(c.put_rois("img", batch).stored) == 1_000
    assert sum(len(r.props_json) for r in c.list_rois("img").rois) == 9_600_000


def test_restart_keeps_annotations_and_sigkill_after_the_ack_loses_nothing(
    start_server, data_dir, tmp_path
):
    state = tmp_path / "kept-state"
    server = start_server(data_dir, extra=("--state-dir", state))
    c = client_of(server)
    stored = c.put_rois("img", [ann(label=f"r{i}") for i in range(5)]).stored
    os.kill(server.pid, signal.SIGKILL)
    server.proc.wait()
    server.proc.returncode = 0  # killed on purpose; the fixture checks clean exits
    again = start_server(data_dir, extra=("--state-dir", state))
    listed = client_of(again).list_rois("img")
    assert {r.roi_id for r in listed.rois} == {s.roi_id for s in stored}
    assert {r.label for r in listed.rois} == {f"r{i}" for i in range(5)}


def test_sigkill_mid_batch_writes_nothing_of_it(start_server, data_dir, tmp_path):
    state = tmp_path / "kept-state"
    server = start_server(data_dir, extra=("--state-dir", state))
    client_of(server).put_rois("img", [ann(label="before")])
    # Half a batch is on the wire when the server dies: the stream never finished, so
    # the batch never committed.
    table = rois_to_table([ann(label=f"half{i}") for i in range(2000)])
    fc = flight.FlightClient(server.location)
    cmd = PutCommand(roi_put=RoiPut(array_id="img"))
    writer, _reader = fc.do_put(
        flight.FlightDescriptor.for_command(cmd.SerializeToString()), table.schema
    )
    writer.write_table(table.slice(0, 1000))
    time.sleep(0.3)
    os.kill(server.pid, signal.SIGKILL)
    server.proc.wait()
    server.proc.returncode = 0
    with pytest.raises(Exception):
        writer.write_table(table.slice(1000))
        writer.done_writing()
        writer.close()
    again = start_server(data_dir, extra=("--state-dir", state))
    assert [r.label for r in client_of(again).list_rois("img").rois] == ["before"]


def test_token_gates_every_annotation_call(start_server, data_dir):
    server = start_server(data_dir, extra=("--token", TOKEN))
    anon = client_of(server)
    with pytest.raises(flight.FlightUnauthenticatedError):
        anon.put_rois("img", [ann()])
    with pytest.raises(flight.FlightUnauthenticatedError):
        anon.list_rois("img")
    with pytest.raises(flight.FlightUnauthenticatedError):
        anon.delete_rois("img")
    with pytest.raises(flight.FlightUnauthenticatedError):
        anon.prune_rois(30)
    good = client_of(server, TOKEN)
    good.put_rois("img", [ann(label="mine")])
    assert [r.label for r in good.list_rois("img").rois] == ["mine"]


def seal_key(state_dir):
    return (state_dir / "annotations" / "seal.key").read_bytes()


def forge_grant(key, array_id, version, expires_at):
    """A grant sealed the way the server seals (docs/reference/biopb-protocol.md)."""
    msg = b""
    for part in (b"tessera roi grant v1", array_id.encode(), version):
        msg += struct.pack(">Q", len(part)) + part
    msg += struct.pack(">Q", expires_at)
    return hmac.new(key, msg, hashlib.sha256).digest()


def test_sealed_roi_tickets(start_server, data_dir, tmp_path):
    state = tmp_path / "sealed-state"
    server = start_server(data_dir, extra=("--token", TOKEN, "--state-dir", state))
    owner = client_of(server, TOKEN)
    owner.put_rois("img", [ann(label="a", set_name="s1"), ann(label="b", set_name="s2")])
    pb = owner.get_tensor("img", output="pb")
    ticket = TensorFlightClient.roi_ticket_from_pb(pb)
    assert ticket
    read = TensorTicket.FromString(ticket).roi_read
    assert read.array_id == "img" and read.grant.expires_at > time.time() + 3600

    # A holder without a token reads every set, or one, through the sealed ticket.
    pb.auth_token = ""
    assert {r.label for r in TensorFlightClient.list_rois_from_pb(pb).rois} == {"a", "b"}
    assert [r.label for r in TensorFlightClient.list_rois_from_pb(pb, "s2").rois] == ["b"]
    anon = client_of(server)
    assert {r.label for r in anon.list_rois("img", roi_ticket=ticket).rois} == {"a", "b"}
    # ... and nothing else: no chunk, no catalog query, no unsealed read, no write.
    with pytest.raises(flight.FlightUnauthenticatedError):
        anon.get_tensor("img").compute()
    with pytest.raises(flight.FlightUnauthenticatedError):
        anon.list_rois("img")
    with pytest.raises(flight.FlightUnauthenticatedError):
        anon.put_rois("img", [ann()])
    # The exemption is DoGet of a sealed roi_read only: a chunk ticket (also one merged
    # after a sealed ROI ticket, which makes it a chunk ticket) or a catalog query
    # without the token is refused.
    bearer = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    raw = flight.FlightClient(server.location)
    chunk = raw.get_flight_info(flight.FlightDescriptor.for_path("img"), bearer).endpoints[0].ticket
    assert raw.do_get(chunk, bearer).read_all().num_rows == 1
    catalog = TensorTicket(catalog_query=CatalogQuery(sql="SELECT 1")).SerializeToString()
    # Garbage and oversized requests get the token's refusal too.
    for refused in (chunk.ticket, ticket + chunk.ticket, catalog, b"\xff" * 10, b"x" * 200_000):
        with pytest.raises(flight.FlightUnauthenticatedError):
            raw.do_get(flight.Ticket(refused)).read_all()

    def with_grant(**changes):
        t = TensorTicket.FromString(ticket)
        for k, v in changes.items():
            setattr(t.roi_read.grant, k, v)
        return t.SerializeToString()

    # Tampered: a flipped seal bit, a longer life, another tensor under the same seal.
    flipped = bytearray(read.grant.seal)
    flipped[0] ^= 1
    for bad in (
        with_grant(seal=bytes(flipped)),
        with_grant(expires_at=read.grant.expires_at + 60),
    ):
        with pytest.raises(flight.FlightUnauthenticatedError, match="not sealed by this server"):
            anon.list_rois("img", roi_ticket=bad)
    other = TensorTicket.FromString(ticket)
    other.roi_read.array_id = "other"
    with pytest.raises(flight.FlightUnauthenticatedError, match="not sealed by this server"):
        anon.list_rois("other", roi_ticket=other.SerializeToString())

    # Expired: sealed with the server's own key, but its time is over.
    past = int(time.time()) - 10
    expired = with_grant(
        expires_at=past,
        seal=forge_grant(seal_key(state), "img", read.grant.content_version, past),
    )
    with pytest.raises(flight.FlightUnauthenticatedError, match="expired"):
        anon.list_rois("img", roi_ticket=expired)
    # The forged-with-the-key path is the server's own seal: a live one reads.
    future = int(time.time()) + 600
    live = with_grant(
        expires_at=future,
        seal=forge_grant(seal_key(state), "img", read.grant.content_version, future),
    )
    assert len(anon.list_rois("img", roi_ticket=live).rois) == 2

    # Another version: the file is rewritten, so the old plan's ticket no longer reads.
    time.sleep(0.05)
    np.save(data_dir / "img.npy", np.ones((64, 81), dtype="<u2"))
    with pytest.raises(flight.FlightUnauthenticatedError, match="another version"):
        anon.list_rois("img", roi_ticket=ticket)
    fresh = TensorFlightClient.roi_ticket_from_pb(owner.get_tensor("img", output="pb"))
    assert len(anon.list_rois("img", roi_ticket=fresh).rois) == 2

    # Seals outlive a restart (the key is in the state directory).
    server.stop()
    again = start_server(data_dir, extra=("--token", TOKEN, "--state-dir", state))
    assert len(client_of(again).list_rois("img", roi_ticket=fresh).rois) == 2


def test_prune_reports_and_applies(start_server, data_dir, tmp_path):
    state = tmp_path / "prune-state"
    server = start_server(data_dir, extra=("--state-dir", state))
    c = client_of(server)
    c.put_rois("img", [ann(), ann()])
    with pytest.raises(flight.FlightError, match="must be positive"):
        c.prune_rois(0)
    # Served now, so not unseen; nothing to delete.
    report = c.prune_rois(1, apply=True)
    assert list(report.unseen) == [] and report.deleted == 0
    assert len(c.list_rois("img").rois) == 2
    server.stop()
    # The tensor is no longer served: its annotations stay listable and deletable, and a
    # prune counts their age from the last time it was served (just now: not yet 1 day).
    (data_dir / "img.npy").unlink()
    again = start_server(data_dir, extra=("--state-dir", state))
    c = client_of(again)
    assert len(c.list_rois("img").rois) == 2
    assert list(c.prune_rois(1, apply=True).unseen) == []
    assert len(c.list_rois("img").rois) == 2


def test_a_server_without_its_state_directory_refuses_annotations(start_server, data_dir, tmp_path):
    state = tmp_path / "shared-state"
    first = start_server(data_dir, extra=("--state-dir", state))
    client_of(first).put_rois("img", [ann()])
    second = start_server(data_dir, extra=("--state-dir", state))
    c = client_of(second)
    assert client_of(first).health_check()["annotations_persisted"] is True
    assert c.health_check()["annotations_persisted"] is False
    with pytest.raises(flight.FlightUnavailableError, match="--state-dir"):
        c.put_rois("img", [ann()])
    with pytest.raises(flight.FlightUnavailableError, match="held by another server"):
        c.list_rois("img")
    # Its plans carry no ROI ticket (it could not honour one).
    assert TensorFlightClient.roi_ticket_from_pb(c.get_tensor("img", output="pb")) is None


def test_sql_rois_table_for_full_access_callers(start_server, data_dir):
    server = start_server(data_dir, extra=("--token", TOKEN))
    c = client_of(server, TOKEN)
    c.put_rois("img", [ann(label="cell"), ann(label="cell"), ann(EVERY_ARM["text"], label="note", plane={1: 4})])
    c.put_rois("other", [ann(label="cell", drawn_against_version=b"\xab")])
    rows = c.query("SELECT label, count(*) AS n FROM rois GROUP BY label ORDER BY label", format="records")
    assert rows == [{"label": "cell", "n": 3}, {"label": "note", "n": 1}]
    note = c.query("SELECT * FROM rois WHERE shape = 'text'", format="records")
    assert len(note) == 1 and note[0]["array_id"] == "img" and note[0]["plane"] == '{"1":4}'
    assert json.loads(note[0]["geometry"])["text"]["text"] == "nucleus\nleft"
    assert note[0]["rev"] == 1 and note[0]["drawn_against_version"] is None
    joined = c.query(
        "SELECT r.drawn_against_version AS v, t.array_id FROM rois r "
        "JOIN tensors t ON t.array_id = r.array_id WHERE r.array_id = 'other'",
        format="records",
    )
    assert joined == [{"v": "ab", "array_id": "other"}]
    # Without the token there is no catalog at all, and a sealed ROI ticket opens none.
    with pytest.raises(flight.FlightUnauthenticatedError):
        client_of(server).query("SELECT count(*) FROM rois")


def test_sigkill_at_any_moment_of_a_put_leaves_all_or_nothing(start_server, data_dir, tmp_path):
    """A 5,000-row put killed at moments spread over its life (client encoding, the
    stream, the transaction, the reply): after a restart the batch is there whole or not
    at all."""
    import threading

    batch = [ann({"point": {"x": i}}, label=f"k{i}") for i in range(5000)]
    # How long a whole put takes here, so the kills spread over it on any machine.
    timing = start_server(data_dir, extra=("--state-dir", tmp_path / "timing-state"))
    started = time.perf_counter()
    client_of(timing).put_rois("img", batch)
    whole = time.perf_counter() - started
    timing.stop()
    outcomes = []
    for n, share in enumerate((0.05, 0.3, 0.5, 0.7, 0.85, 1.0, 2.0)):
        delay = share * whole
        state = tmp_path / f"kill-state{n}"
        server = start_server(data_dir, extra=("--state-dir", state))
        c = client_of(server)
        acked = []

        def put(c=c, acked=acked):
            try:
                acked.append(len(c.put_rois("img", batch).stored))
            except Exception:  # noqa: BLE001 -- the server was killed under it
                pass

        t = threading.Thread(target=put)
        t.start()
        time.sleep(delay)
        os.kill(server.pid, signal.SIGKILL)
        server.proc.wait()
        server.proc.returncode = 0
        t.join(30)
        again = start_server(data_dir, extra=("--state-dir", state))
        count = len(client_of(again).list_rois("img").rois)
        assert count in (0, 5000), f"killed after {delay}s: {count} of 5000 rows survived"
        if acked:
            assert count == 5000, "an acknowledged put was lost"
        outcomes.append(count)
        again.stop()
    # The spread reached both sides of the commit on this machine or the test proves little.
    assert 0 in outcomes and 5000 in outcomes, outcomes
