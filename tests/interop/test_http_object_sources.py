"""Sources on a plain web server (`tessera serve http://HOST/PATH/STORE.zarr`, `…/KEY.npy`),
against Debian's nginx on loopback serving a folder (Range requests, ETags): the unmodified
biopb client reads OME-Zarr 0.4 and 0.5 images written by zarr-python (native levels by
scale_hint and by their own ids), a Zarr v3 array and a `.npy` object, exact, on both
routes; a store the server does not have is refused by name while the rest serves; an
address naming a folder (a web server cannot be listed) and plain HTTP off loopback are
refused at start, by name; with nginx stopped, cached cells keep serving."""
import os
import subprocess

import numpy as np
import pytest
from conftest import tessera_bin
from nginx import NGINX, Nginx
from prerequisites import require

from test_object_store import biopb_client, npy_bytes, write_ome

zarr = pytest.importorskip("zarr") if os.environ.get("CI") != "true" else __import__("zarr")

GRID = ("--chunk-target", "40KiB")


class WebServer(Nginx):
    """nginx serving `root` as static files on 127.0.0.1:PORT (its defaults: byte ranges,
    ETag and Last-Modified)."""

    def __init__(self, prefix, root):
        super().__init__(prefix, lambda port: f"""    access_log {prefix}/access.log;
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root {root};
    }}
""")
        self.base = f"http://127.0.0.1:{self.port}"


@pytest.fixture
def web(tmp_path):
    """nginx serving `data/`: OME-Zarr 0.4 and 0.5 images, a Zarr v3 array and a `.npy`."""
    require(os.path.exists(NGINX), f"needs nginx at {NGINX} (apt-get install nginx)")
    data = tmp_path / "www" / "data"
    data.mkdir(parents=True)
    rng = np.random.default_rng(11)
    base = rng.integers(0, 60000, (4, 130, 150), dtype="<u2")
    write_ome(data / "img.zarr", base, "0.4")
    base5 = rng.integers(0, 250, (3, 70, 90), dtype="|u1")
    write_ome(data / "img5.zarr", base5, "0.5")
    v3 = rng.standard_normal((64, 48)).astype("<f4")
    z = zarr.create_array(store=str(data / "v3.zarr"), shape=v3.shape, chunks=(16, 16),
                          dtype=v3.dtype, zarr_format=3)
    z[...] = v3
    a = rng.integers(-30000, 30000, (33, 47, 5), dtype="<i2")
    (data / "a.npy").write_bytes(npy_bytes(a))
    server = WebServer(tmp_path / "nginx", tmp_path / "www")
    server.data = data
    server.expected = {"img": base, "img5": base5, "v3": v3, "a": a}
    yield server
    server.stop()


def read_exact(client, name, arr):
    whole = client.get_tensor(name).compute()
    assert whole.dtype == arr.dtype and whole.tobytes() == np.ascontiguousarray(arr).tobytes(), name
    sl = tuple(slice(d // 3, max(d // 3 + 1, (2 * d) // 3)) for d in arr.shape)
    got = client.get_tensor(name, slice_hint=sl).compute()
    assert got.tobytes() == np.ascontiguousarray(arr[sl]).tobytes(), (name, sl)


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_a_web_servers_stores_and_objects_read_exact_and_a_missing_one_is_refused_by_name(
    mode, monkeypatch, start_server, web
):
    missing = f"{web.base}/data/gone.zarr"
    server = start_server(f"{web.base}/data/img.zarr", f"{web.base}/data/img5.zarr",
                          f"{web.base}/data/v3.zarr",
                          f"{web.base}/data/a.npy", missing, extra=GRID)
    client = biopb_client(server.location, mode, monkeypatch)
    rows = client.query("SELECT source_id, source_url FROM sources").to_pylist()
    by_id = {r["source_id"]: r["source_url"] for r in rows}
    assert by_id["img"] == f"{web.base}/data/img.zarr", by_id
    assert by_id["v3"] == f"{web.base}/data/v3.zarr", by_id
    assert by_id["a"] == f"{web.base}/data/a.npy", by_id
    assert {"img.0", "img.1", "img.2", "img5.0", "img5.1", "img5.2"} <= set(by_id), by_id

    for name, arr in web.expected.items():
        read_exact(client, name, arr)
    # The images' native levels (NGFF 0.4 and 0.5), by scale_hint and by their own ids, as
    # zarr-python reads them.
    for image in ("img", "img5"):
        for i in range(3):
            want = zarr.open_array(str(web.data / f"{image}.zarr" / str(i)), mode="r")[...]
            got = client.get_tensor(image, scale_hint=[1, 2 ** i, 2 ** i],
                                    reduction_method="precompute").compute()
            assert got.dtype == want.dtype and np.array_equal(got, want), (image, i)
            assert np.array_equal(client.get_tensor(f"{image}.{i}").compute(), want), (image, i)
    stats = client.cache_stats()
    if mode == "mmap":
        assert stats["locates"] > 0 and stats["do_gets"] == 0, stats
    else:
        assert stats["do_gets"] > 0 and stats["locates"] == 0, stats

    log = "".join(server.log)
    assert missing in log and "none of .zarray" in log, log[-3000:]
    assert "gone" not in by_id

    # With nginx stopped, what is cached keeps serving.
    web.stop()
    again = biopb_client(server.location, mode, monkeypatch)
    for name, arr in web.expected.items():
        assert again.get_tensor(name).compute().tobytes() == np.ascontiguousarray(arr).tobytes()


@pytest.mark.parametrize("address, why", [
    ("http://127.0.0.1:9/data/", "cannot be listed"),
    ("https://127.0.0.1:9/data/x.tif", "cannot be listed"),
    ("http://192.0.2.7:8080/data/img.zarr", "loopback"),
])
def test_a_folder_and_plain_http_off_loopback_are_refused_at_start_by_name(
    address, why, tmp_path
):
    done = subprocess.run(
        [tessera_bin(), "serve", address, "--listen", "127.0.0.1:0",
         "--cache-dir", str(tmp_path / "cache")],
        env={**os.environ, "TESSERA_STATE_DIR": str(tmp_path / "state")},
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0, done
    said = done.stdout + done.stderr
    assert address in said and why in said, said
