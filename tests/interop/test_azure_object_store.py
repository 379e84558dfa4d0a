"""Sources in Azure Blob Storage (`tessera serve az://CONTAINER/PREFIX/`), against Azurite
(Microsoft's emulator, npm package `azurite`, installed under tests/interop/node by
./run-tests) on loopback, with an account and key of the test's own: the unmodified biopb
client reads `.npy` objects and an OME-Zarr 0.4 image written by zarr-python, exact, on
both routes; a missing container and a denied key are refused by name while the rest
serves; a public container is read unsigned through `AZURE_STORAGE_ENDPOINT`;
`add_source` serves an `az://` address under an allowed prefix and refuses others."""
import base64
import os
import pathlib
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import pyarrow.flight as flight
from biopb.tensor import TensorFlightClient
from prerequisites import require

from test_object_store import (assert_route, biopb_client, free_port, npy_bytes, read_all,
                               read_image, write_ome)

blob = pytest.importorskip("azure.storage.blob") if os.environ.get("CI") != "true" \
    else __import__("azure.storage.blob").storage.blob

AZURITE = pathlib.Path(__file__).resolve().parent / "node" / "node_modules" / ".bin" / "azurite-blob"
ACCOUNT = "tesseralab"
KEY = base64.b64encode(b"tessera-azurite-key-never-logged!").decode()
CONTAINER = "imaging"
PREFIX = "exp/"
GRID = ("--chunk-target", "40KiB")


class Azurite:
    """Azurite's Blob service in its own process on a loopback port, in memory, knowing
    one account (`ACCOUNT`, `KEY`)."""

    def __init__(self, tmp_path):
        require(AZURITE.exists(), f"needs Azurite at {AZURITE} (./run-tests installs it: "
                                  "npm ci --prefix tests/interop/node)")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp_path / f"azurite-{self.port}.log", "wb")
        self.proc = subprocess.Popen(
            [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
             "--inMemoryPersistence", "--disableProductStyleUrl", "--skipApiVersionCheck",
             "--disableTelemetry"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=tmp_path,
            env={**os.environ, "AZURITE_ACCOUNTS": f"{ACCOUNT}:{KEY}"},
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/{ACCOUNT}?comp=list", timeout=1)
            except urllib.error.HTTPError:
                break  # it answers (403: the listing is not signed)
            except OSError:
                assert self.proc.poll() is None, "Azurite exited"
                assert time.monotonic() < deadline, "Azurite did not start"
                time.sleep(0.1)
            else:
                break
        self.service = blob.BlobServiceClient.from_connection_string(
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={self.endpoint}/{ACCOUNT};")

    def env(self, key=KEY):
        """The emulator's variables as a user sets them (no secret on the command line)."""
        return {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": self.endpoint,
                "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": key}

    def fill(self, container, objects, public=False):
        c = self.service.create_container(container, public_access="container" if public else None)
        for key, body in objects.items():
            c.upload_blob(key, body)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture
def azurite(tmp_path, arrays):
    """The container: two `.npy` objects and an OME-Zarr 0.4 image (three levels)."""
    a = Azurite(tmp_path)
    a.expected = {name: arrays[name] for name in ("be_i2", "f32_4d")}
    objects = {f"{PREFIX}{name}.npy": npy_bytes(arr) for name, arr in a.expected.items()}
    a.base = np.random.default_rng(13).integers(0, 60000, (5, 130, 150), dtype="<u2")
    a.local = tmp_path / "local" / "cells.zarr"
    write_ome(a.local, a.base, "0.4")
    for path in sorted(a.local.rglob("*")):
        if path.is_file():
            objects[f"{PREFIX}cells.zarr/{path.relative_to(a.local).as_posix()}"] = path.read_bytes()
    a.objects = objects
    a.fill(CONTAINER, objects)
    yield a
    a.stop()


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_objects_and_an_ome_zarr_image_read_exact_and_a_missing_container_is_refused_by_name(
    mode, monkeypatch, start_server, azurite
):
    missing = "az://no-such-container/x/"
    server = start_server(f"az://{CONTAINER}/{PREFIX}", missing, extra=GRID, env=azurite.env())
    client = biopb_client(server.location, mode, monkeypatch)
    rows = client.query("SELECT source_id, source_url FROM sources").to_pylist()
    by_id = {r["source_id"]: r["source_url"] for r in rows}
    assert by_id["cells"] == f"az://{CONTAINER}/{PREFIX}cells.zarr", by_id
    assert by_id["be_i2"] == f"az://{CONTAINER}/{PREFIX}be_i2.npy", by_id
    assert {"cells.0", "cells.1", "cells.2", "f32_4d"} <= set(by_id), by_id

    read_all(client, azurite.expected)
    read_image(client, azurite.local, azurite.base)
    assert_route(client, mode)

    log = "".join(server.log)
    assert missing in log and "ContainerNotFound" in log, log[-3000:]
    assert KEY not in log


def test_a_denied_key_is_refused_by_name_and_the_rest_serves(
    start_server, azurite, fixture_dir, arrays, monkeypatch
):
    wrong = base64.b64encode(b"not the key of this account at all").decode()
    server = start_server(f"az://{CONTAINER}/{PREFIX}", fixture_dir, extra=GRID,
                          env=azurite.env(key=wrong))
    log = "".join(server.log)
    assert f"az://{CONTAINER}/{PREFIX}" in log and "denied access" in log, log[-3000:]
    assert "403" in log or "AuthorizationFailure" in log, log[-3000:]
    assert wrong not in log
    monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    client = TensorFlightClient(server.location, cache_bytes=0)
    assert client.get_tensor("be_i2").compute().tobytes() == arrays["be_i2"].tobytes()
    ids = set(client.query("SELECT source_id FROM sources").column("source_id").to_pylist())
    assert "cells" not in ids and "u16_stack" in ids


def test_a_public_container_is_read_unsigned_and_add_source_serves_under_a_store_root(
    start_server, azurite, tmp_path, arrays, monkeypatch
):
    azurite.fill("public", azurite.objects, public=True)
    local = tmp_path / "plain"
    local.mkdir()
    np.save(local / "bool.npy", arrays["bool"])
    # No key: the account's endpoint alone, requests unsigned (a public container).
    env = {"AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT, "AZURE_STORAGE_ENDPOINT": f"{azurite.endpoint}/{ACCOUNT}",
           "AZURE_ALLOW_HTTP": "true"}
    server = start_server(local, extra=GRID + ("--add-source-store-root", f"az://public/{PREFIX}"),
                          env=env)
    monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    client = TensorFlightClient(server.location, cache_bytes=0)
    result = client.register_local_path(f"az://public/{PREFIX}")
    assert {"be_i2", "f32_4d", "cells"} <= set(result.added), result
    read_all(client, azurite.expected)
    read_image(client, azurite.local, azurite.base)
    np.testing.assert_array_equal(client.get_tensor("bool").compute(), arrays["bool"])

    with pytest.raises(flight.FlightServerError, match="add_source_store_roots") as outside:
        client.register_local_path(f"az://{CONTAINER}/{PREFIX}")
    assert f"az://{CONTAINER}/{PREFIX}" in str(outside.value)
