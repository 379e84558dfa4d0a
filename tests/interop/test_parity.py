"""Behaviour matched to biopb-tensor-server 0.13.0 where its own tests and its clients
depend on it (issue 35): the phrases clients match refusals on, the scratch source and its
lifetime cap, discard reasons on reads, annotations on any array id of a served source and
the switch that turns annotations off, and the upload names biopb refuses. Each through
the unmodified biopb client against a real server on loopback."""
import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.image.annotation_pb2 import RoiAnnotation
from biopb.tensor import TensorFlightClient
from google.protobuf import json_format

SHAPE = (4, 4)


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    np.save(d / "img.npy", np.arange(64, dtype="<u2").reshape(8, 8))
    return d


def client_of(server):
    return TensorFlightClient(server.location, cache_bytes=0)


def add(client, name, ttl=None, scheme="cache", source="scratch"):
    return client.setup_array_upload(
        f"{scheme}://{source}/@fields/{name}",
        np.empty(SHAPE, dtype=np.uint16),
        chunk_shape=(2, 2),
        ttl_seconds=ttl,
    )


def roi(x=1.0, y=2.0):
    a = RoiAnnotation()
    json_format.Parse('{"point": {"x": %s, "y": %s}}' % (x, y), a.roi)
    return a


def test_refusals_carry_the_phrases_biopb_clients_match(start_server, data_dir):
    c = client_of(start_server(data_dir, extra=("--writable",)))
    with pytest.raises(ValueError, match="no field 'nope'"):
        c.get_descriptor("img/nope")
    with pytest.raises(ValueError, match="Source not found") as unknown:
        c.get_descriptor("nosuch")
    assert "no known source" in str(unknown.value) and "no such source" in str(unknown.value)
    desc = add(c, "taken")
    with pytest.raises(Exception, match="already exists as") as taken:
        add(c, "taken")
    assert "already taken" in str(taken.value)
    with pytest.raises(Exception, match="not readable yet"):
        c.get_tensor(desc.array_id).compute()
    with pytest.raises(Exception, match="'s3' is not a store format"):
        add(c, "x", scheme="s3")
    c.upload_array(desc, np.full(SHAPE, 7, dtype=np.uint16))
    with pytest.raises(Exception, match="not a state"):
        c.set_upload_status(desc, "PENDING")


@pytest.mark.parametrize("name, why", [
    ("CON", "device name"),
    ("nul.v2", "device name"),
    ("Lpt3", "device name"),
    (".hidden", "may not start with '.'"),
])
def test_upload_names_biopb_refuses_are_refused(start_server, data_dir, name, why):
    c = client_of(start_server(data_dir, extra=("--writable",)))
    with pytest.raises(Exception, match=why):
        add(c, name)
    # Near misses are names like any other.
    assert add(c, f"x{name.lstrip('.')}").array_id == f"scratch/@fields/x{name.lstrip('.')}"


def test_scratch_caps_lifetimes_at_one_day_by_default_and_zero_turns_the_cap_off(
    start_server, data_dir
):
    c = client_of(start_server(data_dir, extra=("--writable",)))
    assert add(c, "undated").ttl_seconds == 86400
    assert add(c, "longer", ttl=10 * 86400).ttl_seconds == 86400
    assert add(c, "brief", ttl=30).ttl_seconds == 30
    for off in ("0", "0s"):
        uncapped = client_of(start_server(data_dir, extra=("--writable", "--upload-max-ttl", off)))
        assert not add(uncapped, "forever").HasField("ttl_seconds")
        assert add(uncapped, "asked", ttl=10 * 86400).ttl_seconds == 10 * 86400


def test_a_zero_duration_elsewhere_is_refused_as_zero_not_as_gibberish(tmp_path):
    import subprocess

    from conftest import tessera_bin

    out = subprocess.run(
        [tessera_bin(), "serve", "--settle-window", "0s", "--cache-dir", tmp_path / "c"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0
    assert "duration '0s' is zero" in out.stderr and "not understood" not in out.stderr, out.stderr


def test_scratch_is_served_before_any_upload(start_server, data_dir):
    c = client_of(start_server(data_dir, extra=("--writable",)))
    with pytest.raises(ValueError, match="no tensors yet"):
        c.get_descriptor("scratch")
    sources = {r["source_id"] for r in c.query("SELECT source_id FROM sources", format="records")}
    assert sources == {"img", "scratch"}
    # Its default tensor, once it has one, is its first READY upload.
    desc = add(c, "first")
    c.upload_array(desc, np.full(SHAPE, 7, dtype=np.uint16))
    np.testing.assert_array_equal(c.get_array("scratch"), np.full(SHAPE, 7, dtype=np.uint16))
    # A read-only server lists no scratch source (its READY uploads stay readable by id).
    ro = client_of(start_server(data_dir))
    assert "scratch" not in {r["source_id"] for r in ro.query("SELECT source_id FROM sources", format="records")}


def test_a_discarded_uploads_read_error_carries_the_reason(start_server, data_dir):
    c = client_of(start_server(data_dir, extra=("--writable",)))
    desc = add(c, "bad")
    c.upload_array(desc, np.full(SHAPE, 7, dtype=np.uint16))
    chunks = c.get_tensor(desc.array_id)  # planned while READY
    c.set_upload_status(desc, "DISCARDED", reason="wrong parameters")
    with pytest.raises(Exception, match="DISCARDED.*wrong parameters"):
        chunks.compute()
    with pytest.raises(Exception, match="wrong parameters"):
        c.get_tensor(desc.array_id).compute()


def test_annotations_go_on_any_array_id_of_a_served_source(start_server, data_dir):
    c = client_of(start_server(data_dir, extra=("--writable",)))
    stored = c.put_rois("img/overlay", [roi()]).stored
    assert len(stored) == 1
    assert [r.roi_id for r in c.list_rois("img/overlay").rois] == [stored[0].roi_id]
    assert c.list_rois("img").rois == []
    # Uploads are array ids of their source too, at any state.
    desc = add(c, "seg")
    assert len(c.put_rois(desc.array_id, [roi(3, 4)]).stored) == 1
    # An id under no served source is still refused.
    with pytest.raises(flight.FlightError, match="Source not found"):
        c.put_rois("nosuch/x", [roi()])


@pytest.mark.parametrize("how", ["flag", "env"])
def test_annotations_off_answers_every_roi_call_unavailable(start_server, data_dir, how):
    if how == "flag":
        server = start_server(data_dir, extra=("--annotations=false",))
    else:
        server = start_server(data_dir, env={"TESSERA_ANNOTATIONS": "false"})
    c = client_of(server)
    for call in (lambda: c.put_rois("img", [roi()]), lambda: c.list_rois("img"),
                 lambda: c.delete_rois("img", set_name="default")):
        with pytest.raises(flight.FlightUnavailableError, match="annotations are turned off"):
            call()
    assert TensorFlightClient.roi_ticket_from_pb(c.get_tensor("img", output="pb")) is None
    np.testing.assert_array_equal(c.get_array("img"), np.arange(64, dtype="<u2").reshape(8, 8))
