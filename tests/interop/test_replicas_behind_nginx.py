"""Replicas behind a gRPC load balancer: two Tessera servers over the same files, each with
its own cache and state directory, behind Debian's nginx (`grpc_pass` to an upstream of
both, round robin). Read through the balancer with the unmodified biopb client, every call
lands on either replica: plans, DoGet, chunk_locate (mapped on this machine, refused for a
replica's peer elsewhere so the client falls back to DoGet), ROI tickets sealed with the key
the replicas share. Bytes are compared with numpy."""
import json
import os
import random
import shutil
import subprocess

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient, descriptor_pb2
from nginx import NGINX, Nginx
from prerequisites import require

from test_rois import ann

TOKEN = "replica-token_0123456789"
SMALL_CHUNKS = ("--chunk-target", "8KiB", "--mapped-chunk-target", "8KiB")


class Balancer(Nginx):
    """nginx `grpc_pass`ing h2c on 127.0.0.1:PORT to an upstream of `backends` (host:port),
    round robin, logging which backend answered each call."""

    def __init__(self, prefix, backends):
        require(os.path.exists(NGINX), f"needs nginx at {NGINX} (apt-get install nginx)")
        self.access_log = prefix / "access.log"
        upstream = "".join(f"        server {b};\n" for b in backends)
        super().__init__(prefix, lambda port: f"""    log_format calls '$upstream_addr|$request_uri|$status';
    access_log {self.access_log} calls;
    upstream tessera {{
{upstream}    }}
    server {{
        listen 127.0.0.1:{port} http2;
        client_max_body_size 0;
        location / {{
            grpc_pass grpc://tessera;
            grpc_read_timeout 120s;
            grpc_send_timeout 120s;
        }}
    }}
""", worker_connections=512)
        self.location = f"grpc://127.0.0.1:{self.port}"

    def calls(self):
        """(upstream that answered, method) of every call nginx passed on so far."""
        out = []
        for line in self.access_log.read_text().splitlines():
            upstreams, uri, _status = line.split("|")
            out.append((upstreams.split(", ")[-1], uri.rsplit("/", 1)[-1]))
        return out



@pytest.fixture
def balancer(tmp_path):
    started = []

    def start(backends):
        b = Balancer(tmp_path / f"nginx{len(started)}", backends)
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


@pytest.fixture
def shared_key(tmp_path):
    key = tmp_path / "seal.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    return key


@pytest.fixture
def planes(tmp_path):
    rng = np.random.default_rng(3)
    planes = rng.integers(0, 2**16, (12, 64, 80), dtype=np.uint16)
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "planes.npy", planes)
    return data, planes


def hostport(location):
    return location.split("://", 1)[1]


def raw_plan(client, array_id, options):
    opt = descriptor_pb2.TensorReadOption(array_id=array_id)
    opt.fields.paths.append("endpoints")
    req = descriptor_pb2.FlightRequest(tensor_read=opt)
    return client.get_flight_info(
        flight.FlightDescriptor.for_command(req.SerializeToString()), options
    )


def test_two_replicas_behind_nginx_serve_exact_bytes(
    start_server, balancer, shared_key, planes, monkeypatch
):
    data, expected = planes
    extra = (*SMALL_CHUNKS, "--token", TOKEN, "--seal-key-file", shared_key)
    replicas = [start_server(data, extra=extra) for _ in range(2)]
    lb = balancer([hostport(r.location) for r in replicas])
    client = TensorFlightClient(lb.location, token=TOKEN, cache_bytes=0)

    # The client is on this machine: it maps the segment each replica locates in its own
    # cache directory, whichever replica answers.
    whole = client.get_tensor("planes").compute()
    assert whole.dtype == expected.dtype and whole.tobytes() == expected.tobytes()
    region = client.get_array("planes", (slice(3, 9), slice(10, 50), slice(5, 70)))
    assert region.tobytes() == expected[3:9, 10:50, 5:70].tobytes()
    # The socket route (DoGet only), through the same balancer.
    monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    again = client.get_tensor("planes").compute()
    assert again.tobytes() == expected.tobytes()

    calls = lb.calls()
    backends = {hostport(r.location) for r in replicas}
    for method in ("GetFlightInfo", "DoAction", "DoGet"):
        served_by = {upstream for upstream, m in calls if m == method}
        assert served_by == backends, (method, calls)

    # A plan made on one replica is redeemed on the other: the same chunk ids, the same bytes.
    pb = TensorFlightClient(replicas[0].location, token=TOKEN, cache_bytes=0).get_tensor(
        "planes", output="pb"
    )
    pb.location = replicas[1].location
    moved = TensorFlightClient.tensor_from_pb(pb, cache_bytes=0).compute()
    assert moved.tobytes() == expected.tobytes()


def test_roi_tickets_sealed_on_one_replica_open_on_the_other(
    start_server, balancer, shared_key, planes
):
    data, _ = planes
    extra = ("--token", TOKEN, "--seal-key-file", shared_key)
    replicas = [start_server(data, extra=extra) for _ in range(2)]
    # Annotations live in each replica's own state directory: both are given the set.
    for r in replicas:
        TensorFlightClient(r.location, token=TOKEN, cache_bytes=0).put_rois(
            "planes", [ann(label="nucleus", set_name="s")]
        )
    pb = TensorFlightClient(replicas[0].location, token=TOKEN, cache_bytes=0).get_tensor(
        "planes", output="pb"
    )
    ticket = TensorFlightClient.roi_ticket_from_pb(pb)
    assert ticket
    other = TensorFlightClient(replicas[1].location, cache_bytes=0)
    assert [r.label for r in other.list_rois("planes", roi_ticket=ticket).rois] == ["nucleus"]

    # Through the balancer, with no token: whichever replica answers opens the seal.
    lb = balancer([hostport(r.location) for r in replicas])
    pb.location, pb.auth_token = lb.location, ""
    for _ in range(4):
        assert [r.label for r in TensorFlightClient.list_rois_from_pb(pb).rois] == ["nucleus"]
    assert {u for u, m in lb.calls() if m == "DoGet"} == {
        hostport(r.location) for r in replicas
    }

    # A server with a key of its own refuses the ticket: the shared key is what opens it.
    alone = start_server(data, extra=("--token", TOKEN))
    with pytest.raises(flight.FlightUnauthenticatedError, match="not sealed by this server"):
        TensorFlightClient(alone.location, cache_bytes=0).list_rois("planes", roi_ticket=ticket)


@pytest.fixture
def local_non_loopback_address():
    """An address of this machine outside 127.0.0.0/8, added to `lo` by the test: a replica
    listening there sees nginx's calls come from it, as from another machine."""
    require(os.geteuid() == 0, "needs root to add an address to an interface")
    require(shutil.which("ip") is not None, "needs iproute2's `ip`")
    address = f"10.{random.randrange(200, 250)}.{random.randrange(256)}.{random.randrange(1, 255)}"
    subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    try:
        yield address
    finally:
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], capture_output=True)


def test_chunk_locate_of_a_replica_elsewhere_sends_the_client_to_do_get(
    start_server, balancer, shared_key, planes, local_non_loopback_address
):
    data, expected = planes
    extra = (*SMALL_CHUNKS, "--token", TOKEN, "--seal-key-file", shared_key)
    replicas = [
        start_server(data, extra=extra, listen=f"{local_non_loopback_address}:0")
        for _ in range(2)
    ]
    lb = balancer([hostport(r.location) for r in replicas])

    # The client dials the balancer on loopback, so it asks chunk_locate; the replicas see
    # the call come from outside loopback and answer "use DoGet" rather than a path.
    raw = flight.connect(lb.location)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    info = raw_plan(raw, "planes", options)
    for ep in info.endpoints[:4]:
        body = next(raw.do_action(flight.Action("chunk_locate", ep.ticket.ticket), options))
        reply = json.loads(body.body.to_pybytes())
        assert reply["available"] is False and "DoGet" in reply["reason"], reply
        assert "segment_path" not in reply

    client = TensorFlightClient(lb.location, token=TOKEN, cache_bytes=0)
    whole = client.get_tensor("planes").compute()
    assert whole.tobytes() == expected.tobytes()
    served = [m for _, m in lb.calls()]
    assert served.count("DoGet") >= len(info.endpoints), served
