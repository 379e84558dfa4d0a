"""Catalog answers and ROI reads go zstd-compressed to peers off loopback under
`--wire-compression auto`, and raw under `off` (docs/decisions/0039 item 11).

The peer is in a network namespace behind a veth pair (the fixture and helpers of
test_wire_compression_rate.py), so its address is not loopback. Inside it the unmodified
biopb 0.13.0 client (`query`, `list_rois`) and pyarrow's own Flight client (`do_get` of a
catalog and a ROI ticket, `read_all`) read the same tables from a server under `auto` and
one under `off`, both serving the same files with the same annotations: every reply must
be exactly what was filed (the catalog rows the files make, the ROIs the puts stored), the
server's `tessera_table_replies_total{table,encoding}` must name zstd for `auto` and raw for
`off`, and the ROI reply must cross the veth in fewer bytes from `auto` than from `off`."""
import json
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
from biopb.image.annotation_pb2 import RoiAnnotation
from biopb.tensor import TensorFlightClient
from google.protobuf import json_format

from test_wire_compression_rate import TOKEN, serve, sh, veth  # noqa: F401 (veth: a fixture)

SQL = "SELECT source_id, source_url FROM sources ORDER BY source_id"
ROIS = 1500

#: The peer's side: the catalog and the ROI listing of `img`, through biopb's client and
#: through pyarrow's do_get, printed as JSON.
PEER = r"""
import json, sys
import pyarrow.flight as flight
from biopb.tensor import TensorFlightClient
from biopb.tensor.descriptor_pb2 import CatalogQuery
from biopb.tensor.ticket_pb2 import RoiRead, TensorTicket
from google.protobuf import json_format
location, token, sql = sys.argv[1:4]
client = TensorFlightClient(location, token=token, cache_bytes=0)
out = {
    "biopb_catalog": client.query(sql, format="records"),
    "biopb_rois": [json_format.MessageToDict(r) for r in client.list_rois("img").rois],
}
raw = flight.connect(location)
options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
def read(ticket):
    return raw.do_get(flight.Ticket(ticket.SerializeToString()), options).read_all()
out["pyarrow_catalog"] = read(TensorTicket(catalog_query=CatalogQuery(sql=sql))).to_pylist()
rois = read(TensorTicket(roi_read=RoiRead(array_id="img")))
out["pyarrow_roi_ids"] = sorted(rois.column("roi_id").to_pylist())
out["pyarrow_roi_rows"] = rois.num_rows
print(json.dumps(out))
"""


def table_replies(server):
    request = urllib.request.Request(
        f"http://{server.metrics}/metrics", headers={"authorization": f"Bearer {TOKEN}"})
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tessera_table_replies_total{"):
            table = line.split('table="')[1].split('"')[0]
            encoding = line.split('encoding="')[1].split('"')[0]
            out[(table, encoding)] = int(float(line.split()[-1]))
    return out


def host_interface(host_ip):
    """The veth end that carries `host_ip`."""
    shown = sh("ip", "-o", "-4", "addr", "show", "to", host_ip).stdout.split()
    return shown[1]


def sent_bytes(interface):
    return int(open(f"/sys/class/net/{interface}/statistics/tx_bytes").read())


def annotations():
    out = []
    for i in range(ROIS):
        a = RoiAnnotation(set_name="nuclei", label=f"nucleus {i % 7}",
                          props_json='{"classifier": "unet-v2", "score": 0.5}')
        json_format.Parse(json.dumps({"rectangle": {"topLeft": {"x": i, "y": 2 * i},
                                                    "bottomRight": {"x": i + 30, "y": 2 * i + 40}}}),
                          a.roi)
        out.append(a)
    return out


@pytest.fixture
def files(tmp_path):
    d = tmp_path / "files"
    d.mkdir()
    np.save(d / "img.npy", np.arange(64 * 80, dtype="<u2").reshape(64, 80))
    np.save(d / "stack.npy", np.zeros((4, 10, 10), dtype="<f4"))
    return d


def test_catalog_and_roi_replies_are_compressed_to_a_peer_off_loopback(start_server, files, veth):
    ns, host_ip, _, _ = veth
    interface = host_interface(host_ip)
    # The files, and the scratch source of uploads (`serve` starts the server writable).
    expected_catalog = sorted(
        [{"source_id": p.stem, "source_url": p.resolve().as_uri()} for p in files.glob("*.npy")]
        + [{"source_id": "scratch", "source_url": "scratch://"}],
        key=lambda row: row["source_id"])
    roi_bytes = {}
    for mode, encoding in (("auto", "zstd"), ("off", "raw")):
        server = serve(start_server, files, host_ip, mode=mode)
        stored = TensorFlightClient(server.location, token=TOKEN, cache_bytes=0).put_rois(
            "img", annotations()).stored
        assert len(stored) == ROIS
        before, tx = table_replies(server), sent_bytes(interface)
        done = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", PEER, server.location, TOKEN, SQL],
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        roi_bytes[mode] = sent_bytes(interface) - tx
        got = json.loads(done.stdout.strip().splitlines()[-1])
        after = table_replies(server)
        replies = {k: after[k] - before.get(k, 0) for k in after}

        assert got["biopb_catalog"] == expected_catalog, mode
        assert got["pyarrow_catalog"] == expected_catalog, mode
        want = sorted((json_format.MessageToDict(s) for s in stored), key=lambda r: r["roiId"])
        assert sorted(got["biopb_rois"], key=lambda r: r["roiId"]) == want, mode
        assert got["pyarrow_roi_ids"] == sorted(s.roi_id for s in stored), mode
        assert got["pyarrow_roi_rows"] == ROIS, mode
        other = "raw" if encoding == "zstd" else "zstd"
        for table in ("catalog", "roi"):
            assert replies[(table, encoding)] >= 2, (mode, replies)
            assert replies[(table, other)] == 0, (mode, replies)
    # The whole exchange (both clients, both tables) crossed the link in fewer bytes.
    assert roi_bytes["auto"] * 2 < roi_bytes["off"], roi_bytes
