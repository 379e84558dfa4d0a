"""The biopb client's catalog and source-lifecycle calls through the unmodified
`TensorFlightClient`: catalog_children, resolve_source, residency, source metadata and
physical scale (config and sidecar), register_local_path / deregister_local_path."""
import json
import os
import socket
import time
import urllib.request

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient

from test_tls import make_cert

TOKEN = "catalog-token_0123456789abcdef"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client_of(server, **kw):
    return TensorFlightClient(server.location, cache_bytes=0, **kw)


def write_config(path, text):
    path.write_text(text)
    return ("--config", path)


# -- catalog_children -------------------------------------------------------------------


def test_catalog_children_walks_the_tree_by_path(start_server, tmp_path, arrays):
    root = tmp_path / "lab" / "screens"
    (root / "plate1").mkdir(parents=True)
    (root / "plate2" / "deep" / "er").mkdir(parents=True)
    np.save(root / "plate1" / "a.npy", arrays["u8_rgb"])
    np.save(root / "plate1" / "B.npy", arrays["be_i2"])
    np.save(root / "plate2" / "deep" / "er" / "c.npy", arrays["f64_1d"])
    np.save(root / "top.npy", arrays["bool"])
    server = start_server(root)
    client = client_of(server)

    top = client.catalog_children()
    assert top["sources"] == [] and not top["truncated"]
    [folder] = top["folders"]
    # One chain of single-child folders down to the screens directory.
    assert folder["name"] == str(root).strip("/")
    screens = client.catalog_children(folder["key"])
    assert [f["name"] for f in screens["folders"]] == ["plate1", "plate2/deep/er"]
    assert screens["sources"] == [{"name": "top.npy", "source_id": "top"}]
    plate1 = client.catalog_children(screens["folders"][0]["key"])
    assert [s["name"] for s in plate1["sources"]] == ["B.npy", "a.npy"], "byte order"
    assert [s["source_id"] for s in plate1["sources"]] == ["plate1.B", "plate1.a"]
    deep = client.catalog_children(screens["folders"][1]["key"])
    assert deep["sources"] == [{"name": "c.npy", "source_id": "plate2.deep.er.c"}]

    cut = client.catalog_children(folder["key"], limit=2)
    assert cut["truncated"] and len(cut["folders"]) + len(cut["sources"]) == 2
    with pytest.raises(ValueError):
        client.catalog_children("", limit=0)
    # Anything the client did not build is refused by the server, by name.
    raw = flight.connect(server.location)
    with pytest.raises(flight.FlightServerError, match="catalog_children takes"):
        list(raw.do_action(flight.Action("catalog_children", b'{"limit": "many"}')))


def test_catalog_children_puts_separate_roots_at_their_own_top_folders(start_server, tmp_path, arrays):
    one, two = tmp_path / "one" / "a", tmp_path / "two" / "b"
    one.mkdir(parents=True)
    two.mkdir(parents=True)
    np.save(one / "x.npy", arrays["bool"])
    np.save(two / "y.npy", arrays["bool"])
    server = start_server(one, two)
    client = client_of(server)
    [shared] = client.catalog_children()["folders"]
    level = client.catalog_children(shared["key"])
    assert [f["name"] for f in level["folders"]] == ["one/a", "two/b"]
    assert client.catalog_children(level["folders"][1]["key"])["sources"] == [
        {"name": "y.npy", "source_id": "y"}
    ]


# -- resolve ---------------------------------------------------------------------------


def test_resolve_source_returns_the_query_row(start_server, fixture_dir):
    server = start_server(fixture_dir)
    client = client_of(server)
    beats = []
    row = client.resolve_source("u16_stack", on_progress=beats.append)
    query = client.query(
        "SELECT source_id, source_url, source_type, is_resolved, tensors"
        " FROM sources WHERE source_id = 'u16_stack'",
        format="records",
    )
    assert row == query[0]
    assert row["is_resolved"] and row["tensors"][0]["shape"] == [6, 70, 90]
    assert beats and beats[0].target_name == "u16_stack.npy" and beats[0].target_bytes > 0
    with pytest.raises(ValueError, match="no_such"):
        client.resolve_source("no_such")


def test_resolve_source_of_a_refused_file_says_why(start_server, fixture_dir):
    (fixture_dir / "broken.npy").write_bytes(b"not a numpy file")
    server = start_server(fixture_dir)
    with pytest.raises(ValueError, match="broken"):
        client_of(server).resolve_source("broken")


# -- residency -------------------------------------------------------------------------


def test_residency_is_answered_only_when_asked(start_server, fixture_dir):
    server = start_server(fixture_dir)
    client = client_of(server)
    assert client.get_descriptor("u8_rgb", with_residency=True).is_resident is True
    assert not client.get_descriptor("u8_rgb").HasField("is_resident")


# -- metadata and physical scale -------------------------------------------------------


def assert_same_metadata(client, source_id):
    """Every route reports the same metadata; returns it."""
    meta = client.get_source_metadata(source_id)
    desc = client.get_descriptor(source_id, with_metadata=True)
    assert json.loads(desc.metadata_json) == meta
    [row] = client.query(
        f"SELECT metadata_json FROM sources WHERE source_id = '{source_id}'", format="records"
    )
    assert json.loads(row["metadata_json"]) == meta
    scale = client.get_physical_scale(source_id)
    if "physical_scale" in meta:
        assert scale == (meta["physical_scale"], meta["physical_unit"])
        assert list(desc.physical_scale) == meta["physical_scale"]
    else:
        assert scale is None
    return meta


def test_config_and_sidecar_metadata_agree_everywhere(start_server, tmp_path, arrays):
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "vol.npy", arrays["u16_stack"])
    np.save(data / "side.npy", arrays["u16_stack"])
    np.save(data / "plain.npy", arrays["be_i2"])
    (data / "side.json").write_text(json.dumps({
        "physical_scale": [2, 100, 100], "physical_unit": ["s", "nm", "nm"],
        "metadata": {"stain": "gfp"},
    }))
    meta_file = tmp_path / "vol-meta.json"
    meta_file.write_text(json.dumps({"objective": "60x", "na": 1.4}))
    config = write_config(tmp_path / "t.toml", f"""
[[source]]
path = "{data / 'vol.npy'}"
physical_scale = [0.5, 0.1, 0.1]
physical_unit = "micron"
metadata_file = "{meta_file}"

[[source]]
path = "{data / 'side.npy'}"
physical_scale = [9.0, 9.0, 9.0]
physical_unit = "um"
metadata = {{ stain = "dapi", lab = "x" }}

[[source]]
path = "{data / 'plain.npy'}"
""")
    server = start_server(extra=config)
    client = client_of(server)

    vol = assert_same_metadata(client, "vol")
    assert vol["physical_scale"] == [0.5, 0.1, 0.1]
    assert vol["physical_unit"] == ["µm"] * 3
    assert vol["objective"] == "60x" and vol["na"] == 1.4
    side = assert_same_metadata(client, "side")
    assert side["physical_scale"] == [2, 0.1, 0.1]
    assert side["physical_unit"] == ["s", "µm", "µm"]
    assert side["stain"] == "gfp" and side["lab"] == "x", "the sidecar overlays the config"
    plain = assert_same_metadata(client, "plain")
    assert "physical_scale" not in plain and plain["format"] == "npy"


def test_a_malformed_sidecar_is_refused_by_name_and_the_tensor_serves(start_server, fixture_dir, arrays):
    (fixture_dir / "u8_rgb.json").write_text('{"physical_scale": [1, 2, 3], "colour": "red"}')
    server = start_server(fixture_dir)
    client = client_of(server)
    meta = assert_same_metadata(client, "u8_rgb")
    assert "u8_rgb.json" in meta["metadata_error"] and "colour" in meta["metadata_error"]
    np.testing.assert_array_equal(client.get_array("u8_rgb"), arrays["u8_rgb"])
    assert "metadata sidecar refused" in "".join(server.log)

    # Fixing the sidecar is seen without a restart.
    (fixture_dir / "u8_rgb.json").write_text('{"physical_scale": [1, 2, 3], "physical_unit": "mm"}')
    fixed = assert_same_metadata(client, "u8_rgb")
    assert "metadata_error" not in fixed
    assert fixed["physical_scale"] == [1000, 2000, 3000] and fixed["physical_unit"] == ["µm"] * 3


def test_config_metadata_errors_stop_the_server_with_the_key(tmp_path, fixture_dir):
    import subprocess

    from conftest import tessera_bin

    for text, needle in [
        ('metadata = { dtype = "x" }', "dtype"),
        ('physical_unit = "um"', "physical_unit needs physical_scale"),
        ('metadata_file = "/no/such/file.json"', "/no/such/file.json"),
    ]:
        config = tmp_path / "bad.toml"
        config.write_text(f'[[source]]\npath = "{fixture_dir}"\n{text}\n')
        proc = subprocess.run(
            [tessera_bin(), "serve", "--config", config, "--listen", "127.0.0.1:0",
             "--cache-dir", tmp_path / "cache"],
            capture_output=True, text=True, timeout=60,
        )
        assert proc.returncode != 0 and needle in proc.stderr, proc.stderr


# -- runtime sources -------------------------------------------------------------------


@pytest.fixture
def inbox(tmp_path, arrays):
    """An allowed root holding a drop folder of two tensors, and a secret outside it."""
    root = tmp_path / "inbox"
    (root / "exp" / "sub").mkdir(parents=True)
    np.save(root / "exp" / "a.npy", arrays["u16_stack"])
    np.save(root / "exp" / "sub" / "b.npy", arrays["f32_4d"])
    outside = tmp_path / "outside"
    outside.mkdir()
    np.save(outside / "secret.npy", arrays["bool"])
    return root


def test_runtime_sources_are_refused_unless_roots_are_configured(start_server, fixture_dir, inbox):
    server = start_server(fixture_dir)
    client = client_of(server)
    with pytest.raises(flight.FlightServerError, match="add_source_roots"):
        client.register_local_path(str(inbox / "exp"))
    with pytest.raises(flight.FlightServerError, match="add_source_roots"):
        client.deregister_local_path("dnd://exp")


def test_register_local_path_serves_a_folder_with_progress(start_server, fixture_dir, inbox, arrays):
    metrics_addr = f"127.0.0.1:{free_port()}"
    server = start_server(
        fixture_dir, extra=("--add-source-root", inbox, "--metrics-listen", metrics_addr)
    )
    client = client_of(server)
    seen = []
    result = client.register_local_path(str(inbox / "exp"), on_progress=seen.append)
    assert sorted(result.added) == ["exp.a", "exp.sub.b"]
    assert [p.added_count for p in seen] == [1, 2]
    assert seen[-1].current_path.endswith("b.npy")
    np.testing.assert_array_equal(client.get_array("exp.sub.b"), arrays["f32_4d"])
    rows = client.query(
        "SELECT source_id, source_url FROM sources WHERE source_url LIKE 'dnd://%' ORDER BY 1",
        format="records",
    )
    assert rows == [
        {"source_id": "exp.a", "source_url": "dnd://exp/a.npy"},
        {"source_id": "exp.sub.b", "source_url": "dnd://exp/sub/b.npy"},
    ]
    top = client.catalog_children()
    assert {"name": "exp", "key": "exp"} in top["folders"]
    assert client.catalog_children("exp")["sources"] == [{"name": "a.npy", "source_id": "exp.a"}]
    assert client.health_check()["source_count"] == len(os.listdir(fixture_dir)) + 2
    listed = [f.descriptor.path[0].decode() for f in flight.connect(server.location).list_flights()]
    assert {"exp.a", "exp.sub.b"} <= set(listed)
    metrics = urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=10).read().decode()
    assert f"tessera_sources {len(os.listdir(fixture_dir)) + 2}" in metrics

    # Again: rebuilt against the files as they are now; a file gone is removed.
    np.save(inbox / "exp" / "a.npy", arrays["u8_rgb"])
    (inbox / "exp" / "sub" / "b.npy").unlink()
    again = client.register_local_path(str(inbox / "exp"))
    assert list(again.already_present) == ["exp.a"] and list(again.refreshed) == ["exp.a"]
    assert list(again.removed) == ["exp.sub.b"] and not again.added
    np.testing.assert_array_equal(client.get_array("exp.a"), arrays["u8_rgb"])

    removed = client.deregister_local_path("dnd://exp")
    assert list(removed.removed) == ["exp.a"]
    with pytest.raises(ValueError):
        client.get_array("exp.a")
    with pytest.raises(flight.FlightServerError, match="dnd://"):
        client.deregister_local_path(f"file://{fixture_dir}")
    np.testing.assert_array_equal(client.get_array("bool"), arrays["bool"])


def test_register_local_path_refuses_paths_outside_the_roots(start_server, fixture_dir, inbox, tmp_path, arrays):
    server = start_server(fixture_dir, extra=("--add-source-root", inbox, "--add-source-max-files", "3"))
    client = client_of(server)
    with pytest.raises(flight.FlightServerError, match="outside"):
        client.register_local_path(str(tmp_path / "outside" / "secret.npy"))
    with pytest.raises(flight.FlightServerError, match="outside"):
        client.register_local_path(str(inbox / ".." / "outside"))
    os.symlink(tmp_path / "outside", inbox / "door")
    with pytest.raises(flight.FlightServerError, match="outside"):
        client.register_local_path(str(inbox / "door"))
    with pytest.raises(flight.FlightServerError, match="does not exist"):
        client.register_local_path(str(inbox / "missing"))
    with pytest.raises(flight.FlightServerError, match="absolute"):
        client.register_local_path("relative/exp")

    # A link inside a root that leads out of it: refused by name, the rest is added.
    os.symlink(tmp_path / "outside" / "secret.npy", inbox / "exp" / "sub" / "link.npy")
    with pytest.raises(flight.FlightServerError, match="outside"):
        client.register_local_path(str(inbox / "exp" / "sub" / "link.npy"))
    walked = client.register_local_path(str(inbox / "exp"))
    assert sorted(walked.added) == ["exp.a", "exp.sub.b"]
    [failure] = walked.failed
    assert failure.path.endswith("link.npy") and "outside add_source_roots" in failure.reason

    # A directory over the large-scan threshold is one failed entry, nothing added.
    for i in range(2):
        np.save(inbox / f"many{i}.npy", arrays["bool"])
        np.save(inbox / "exp" / f"more{i}.npy", arrays["bool"])
    big = client.register_local_path(str(inbox))
    assert not big.added and not big.already_present
    assert "add_source_max_files" in big.failed[0].reason, big


def test_register_local_path_stops_when_the_client_cancels(start_server, fixture_dir, inbox, arrays):
    many = inbox / "many"
    many.mkdir()
    tiny = np.arange(4, dtype=np.uint8)
    for i in range(FILES := 3000):
        np.save(many / f"t{i:05}.npy", tiny)
    server = start_server(fixture_dir, extra=("--add-source-root", inbox))
    client = client_of(server)
    seen = []
    result = client.register_local_path(
        str(many), on_progress=seen.append, should_cancel=lambda: len(seen) >= 1
    )
    assert not result.added, "a cancelled call reports an empty tally"
    count = "SELECT count(*) AS n FROM sources WHERE source_url LIKE 'dnd://many/%'"
    time.sleep(0.5)
    kept = client.query(count).to_pylist()[0]["n"]
    assert 1 <= kept < FILES, kept
    assert "add_source cancelled by the client" in "".join(server.log)
    # What was registered stays registered and readable; nothing more arrives later.
    time.sleep(0.5)
    assert client.query(count).to_pylist()[0]["n"] == kept
    np.testing.assert_array_equal(client.get_array("many.t00000"), tiny)


def test_runtime_sources_survive_rescans(start_server, fixture_dir, inbox, arrays):
    server = start_server(
        fixture_dir, extra=("--add-source-root", inbox, "--watch", "--watch-interval", "100ms")
    )
    client = client_of(server)
    assert len(client.register_local_path(str(inbox / "exp")).added) == 2
    np.save(fixture_dir / "new.npy", arrays["bool"])  # a rescan rebuilds the registry

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ids = {r["source_id"] for r in client.query("SELECT source_id FROM sources", format="records")}
        if "new" in ids:
            break
        time.sleep(0.2)
    assert {"new", "exp.a", "exp.sub.b"} <= ids
    np.testing.assert_array_equal(client.get_array("exp.a"), arrays["u16_stack"])


def test_the_calls_work_over_tls_with_a_token(start_server, fixture_dir, inbox, arrays, tmp_path):
    cert, key, pem = make_cert(tmp_path, "server")
    server = start_server(
        fixture_dir,
        extra=("--tls-cert", cert, "--tls-key", key, "--token", TOKEN, "--add-source-root", inbox),
    )
    client = client_of(server, tls_ca_pem=pem, token=TOKEN)
    assert client.catalog_children()["folders"]
    assert client.resolve_source("u8_rgb")["source_id"] == "u8_rgb"
    assert client.get_descriptor("u8_rgb", with_residency=True).is_resident
    assert sorted(client.register_local_path(str(inbox / "exp")).added) == ["exp.a", "exp.sub.b"]
    np.testing.assert_array_equal(client.get_array("exp.a"), arrays["u16_stack"])
    assert list(client.deregister_local_path("dnd://exp/sub").removed) == ["exp.sub.b"]
    port = server.location.rsplit(":", 1)[1]
    anonymous = flight.connect(f"grpc+tls://127.0.0.1:{port}", tls_root_certs=pem)
    with pytest.raises(flight.FlightUnauthenticatedError):
        list(anonymous.do_action(flight.Action("add_source", b"")))
