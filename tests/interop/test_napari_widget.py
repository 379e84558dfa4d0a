"""What biopb's napari plugin (``biopb-napari-widget`` 0.2.1, the Tensor Browser) asks of a
server, without a display: its catalog listing, search, dropped-roots and annotation SQL,
``catalog_children``, the health fields its watcher polls, ``get_descriptor`` with the
pyramid and one ``get_tensor`` per advertised level (read a plane at a time, as napari
does), the colour axis it recognises, and ``register_local_path`` / ``deregister_local_path``
for a dropped folder.

The widget's modules import Qt on the way (``tensor_browser/__init__.py`` imports the
widget), so its calls are made here through the biopb client it uses, with the SQL text
it sends (0.2.1, ``tensor_browser/_sources.py`` and ``_widget.py``)."""
import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient

# The SQL the Tensor Browser sends, as its Python source builds it.
DND_ROOTS_SQL = (
    "SELECT DISTINCT regexp_extract(source_url, '^dnd://[^\\\\/]+') AS root "
    "FROM sources WHERE source_url LIKE 'dnd://%'"
)
ROI_SETS_SQL = "SELECT array_id, set_name, count(*) AS n FROM rois GROUP BY array_id, set_name"
LEVEL_LIMIT = 2000
SERVER_QUERY_LIMIT = 2000


def search_sql(query, columns="source_id"):
    escaped = query.replace("\\", "\\\\").replace("'", "''")
    escaped = escaped.replace("%", "\\%").replace("_", "\\_")
    return (
        f"SELECT {columns} FROM sources WHERE "
        f"LOWER(source_id) LIKE '%{escaped}%' ESCAPE '\\' OR "
        f"LOWER(source_url) LIKE '%{escaped}%' ESCAPE '\\' OR "
        f"LOWER(source_type) LIKE '%{escaped}%' ESCAPE '\\' "
        f"ORDER BY source_url LIMIT {SERVER_QUERY_LIMIT + 1}"
    )


# The widget's reading of the axes (``_tensor_utils._resolve_axes``): a trailing axis
# labelled s/samples of 3 or 4 is colour; the axis before Y is depth when labelled so.
AXIS_S_LABELS = {"s", "samples"}
AXIS_Z_LABELS = {"z", "depth", "plane", "planes", "slice"}


def colour_axis(desc):
    labels = [str(label).lower() for label in desc.dim_labels]
    shape = list(desc.shape)
    if len(shape) >= 3 and labels[-1] in AXIS_S_LABELS and shape[-1] in (3, 4):
        return len(shape) - 1
    return None


@pytest.fixture
def volumes(tmp_path):
    rng = np.random.default_rng(37)
    data = tmp_path / "lab" / "scans"
    data.mkdir(parents=True)
    arrays = {
        "vol": rng.integers(0, 65535, (12, 96, 128), dtype=np.uint16),
        "rgb": rng.integers(0, 255, (80, 100, 3), dtype=np.uint8),
    }
    for name, arr in arrays.items():
        np.save(data / f"{name}.npy", arr)
    inbox = tmp_path / "inbox"
    (inbox / "drop_1").mkdir(parents=True)
    arrays["drop_1.a"] = rng.integers(0, 255, (20, 30), dtype=np.uint8)
    np.save(inbox / "drop_1" / "a.npy", arrays["drop_1.a"])
    # Small planes and a small voxel budget, so these volumes advertise computed levels.
    config = tmp_path / "tessera.toml"
    config.write_text("[pyramid]\nplane_max_pixels = 2000\npixel_budget_cubic_root = 20\n")
    return data, inbox, config, arrays


def rows(client, sql):
    return client.query(sql, format="records")


def test_the_browsers_catalog_calls_and_a_drop(start_server, volumes):
    data, inbox, config, arrays = volumes
    server = start_server(data, extra=("--config", str(config), "--add-source-root", str(inbox)))
    client = TensorFlightClient(server.location, cache_bytes=0)

    health = client.health_check()
    assert health["status"] == "SERVING"
    assert health["metadata_db_enabled"] is True
    assert health["registration_pending"] == 0
    generation = health["catalog_generation"]
    assert isinstance(generation, str) and generation
    assert client.health_check()["catalog_generation"] == generation, "no change, same value"

    # The listing and the descriptors of a folder's sources.
    columns = client.source_row_columns()
    listing = rows(client, f"SELECT {columns} FROM sources ORDER BY source_id")
    assert [r["source_id"] for r in listing] == ["rgb", "vol"]
    ids = ", ".join(f"'{i}'" for i in ["vol", "rgb"])
    described = rows(client, f"SELECT {columns} FROM sources WHERE source_id IN ({ids})")
    assert {r["source_id"]: list(r["tensors"][0]["shape"]) for r in described} == {
        "vol": [12, 96, 128],
        "rgb": [80, 100, 3],
    }

    # The tree, a folder at a time: a chain of single-child folders is one folder.
    top = client.catalog_children("", LEVEL_LIMIT)
    [folder] = top["folders"]
    level = client.catalog_children(folder["key"], LEVEL_LIMIT)
    assert sorted(s["source_id"] for s in level["sources"]) == ["rgb", "vol"]

    # Search (LIKE … ESCAPE), annotations (none yet), dropped roots (none yet).
    assert [r["source_id"] for r in rows(client, search_sql("vol"))] == ["vol"]
    assert rows(client, search_sql("50%_off")) == []
    assert rows(client, ROI_SETS_SQL) == []
    assert rows(client, DND_ROOTS_SQL) == []

    # A drop: registered, listed under its dnd:// root, then removed with its [x].
    result = client.register_local_path(str(inbox / "drop_1"))
    assert list(result.added) == ["drop_1.a"]
    np.testing.assert_array_equal(client.get_array("drop_1.a"), arrays["drop_1.a"])
    assert rows(client, DND_ROOTS_SQL) == [{"root": "dnd://drop_1"}]
    after = client.health_check()
    assert after["catalog_generation"] != generation and after["registration_pending"] == 0
    # The metadata names no server path beyond what source_url says.
    meta = client.get_source_metadata("drop_1.a")
    assert "path" not in meta
    assert str(inbox) not in str(meta), meta
    removed = client.deregister_local_path("dnd://drop_1")
    assert list(removed.removed) == ["drop_1.a"]
    assert rows(client, DND_ROOTS_SQL) == []
    assert client.health_check()["catalog_generation"] not in (generation, after["catalog_generation"])


def test_each_advertised_level_reads_a_plane_at_a_time(start_server, volumes):
    data, _, config, arrays = volumes
    server = start_server(data, extra=("--config", str(config)))
    client = TensorFlightClient(server.location, cache_bytes=0)
    want = arrays["vol"]
    desc = client.get_descriptor("vol", with_pyramid=True)
    assert list(desc.dim_labels) == ["z", "y", "x"] and colour_axis(desc) is None
    levels = list(desc.pyramid)
    assert len(levels) >= 2, "the volume advertises computed levels"
    for lv in levels:
        scale = list(lv.scale_hint)
        assert lv.reduction_method == "nearest"
        got = client.get_tensor("vol", scale_hint=scale, reduction_method=lv.reduction_method or None)
        expected = want[tuple(slice(None, None, s) for s in scale)]
        assert list(got.shape) == list(lv.shape) == list(expected.shape)
        # napari computes the plane it shows, then jumps.
        for z in (0, got.shape[0] - 1, got.shape[0] // 2):
            np.testing.assert_array_equal(np.asarray(got[z].compute()), expected[z])


def test_rgb_is_read_as_colour(start_server, volumes):
    data, _, config, arrays = volumes
    server = start_server(data, extra=("--config", str(config)))
    client = TensorFlightClient(server.location, cache_bytes=0)
    desc = client.get_descriptor("rgb", with_pyramid=True)
    assert list(desc.dim_labels) == ["y", "x", "s"]
    assert colour_axis(desc) == 2
    for lv in desc.pyramid:
        scale = list(lv.scale_hint)
        assert scale[-1] == 1, "the colour axis is never scaled"
        got = client.get_tensor("rgb", scale_hint=scale, reduction_method=lv.reduction_method or None)
        want = arrays["rgb"][tuple(slice(None, None, s) for s in scale)]
        np.testing.assert_array_equal(np.asarray(got.compute()), want)


def test_a_refused_drop_says_what_to_pass(start_server, volumes):
    data, inbox, _, _ = volumes
    server = start_server(data)
    client = TensorFlightClient(server.location, cache_bytes=0)
    with pytest.raises(flight.FlightServerError) as refused:
        client.register_local_path(str(inbox / "drop_1"))
    message = str(refused.value)
    for needed in ("register_local_path", "--add-source-root", "TESSERA_ADD_SOURCE_ROOTS"):
        assert needed in message, message

    other = start_server(data, extra=("--add-source-root", str(data)))
    client = TensorFlightClient(other.location, cache_bytes=0)
    with pytest.raises(flight.FlightServerError) as outside:
        client.register_local_path(str(inbox / "drop_1"))
    assert "--add-source-root" in str(outside.value) and "outside" in str(outside.value)
