"""The SQL catalog against the unmodified biopb 0.13.0 client and pyarrow."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient


def test_query_returns_the_sources_table(start_server, fixture_dir, arrays):
    (fixture_dir / "broken.npy").write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': '|O'}")
    server = start_server(fixture_dir)
    client = TensorFlightClient(server.location, cache_bytes=0)

    table = client.query(
        "SELECT source_id, source_url, source_type, is_resolved, tensors, unresolved_reason "
        "FROM sources ORDER BY source_id"
    )
    assert isinstance(table, pa.Table)
    assert table.schema.metadata[b"truncated"] == b"False"
    assert table.schema.metadata[b"returned_rows"] == str(len(arrays) + 1).encode()
    rows = table.to_pylist()
    assert [r["source_id"] for r in rows] == sorted([*arrays, "broken"])
    by_id = {r["source_id"]: r for r in rows}
    for name, arr in arrays.items():
        row = by_id[name]
        assert row["is_resolved"] is True
        assert row["source_type"] == "npy"
        assert row["source_url"] == (fixture_dir / f"{name}.npy").resolve().as_uri()
        assert row["unresolved_reason"] is None
        [tensor] = row["tensors"]
        assert tensor["array_id"] == name
        assert tensor["shape"] == list(arr.shape)
        assert tensor["dtype"] == arr.dtype.str
        assert len(tensor["dim_labels"]) == arr.ndim
    broken = by_id["broken"]
    assert broken["is_resolved"] is False
    assert broken["tensors"] == []
    assert "broken.npy" in broken["unresolved_reason"]

    # biopb's own listing projection: it adds unresolved_reason because
    # GetFlightInfo(path "sources") lists it, and the query then works.
    columns = client.source_row_columns()
    assert columns.endswith(", unresolved_reason")
    listing = client.query(f"SELECT {columns} FROM sources ORDER BY source_id")
    assert listing.column_names == columns.split(", ")
    records = client.query("SELECT source_id FROM sources WHERE NOT is_resolved", format="records")
    assert records == [{"source_id": "broken"}]


def test_get_source_metadata_returns_the_addressed_row(start_server, fixture_dir, arrays):
    server = start_server(fixture_dir)
    client = TensorFlightClient(server.location, cache_bytes=0)
    for name in ["f64_1d", "u16_stack", "be_i2"]:
        meta = client.get_source_metadata(name)
        assert meta["dtype"] == arrays[name].dtype.str, name
        assert meta["shape"] == list(arrays[name].shape), name
        # Where the file is, is `source_url`'s to say; the metadata names no server path.
        assert "path" not in meta, name
        assert not any(str(fixture_dir) in str(v) for v in meta.values()), name
    with pytest.raises(ValueError, match="not found"):
        client.get_source_metadata("it's not here")


def test_open_ended_slice_uses_the_catalog_and_is_bit_exact(start_server, fixture_dir, arrays):
    # Catalog queries are logged at debug (every client lookup would flood info).
    server = start_server(
        fixture_dir,
        extra=("--chunk-target", "6KiB"),
        env={"RUST_LOG": "info,tessera_server::catalog=debug"},
    )
    client = TensorFlightClient(server.location, cache_bytes=0)
    expected = arrays["u16_stack"]
    sl = (slice(2, None), slice(None), slice(10, None))
    got = client.get_tensor("u16_stack", slice_hint=sl).compute()
    assert got.dtype == expected.dtype
    assert got.tobytes() == np.ascontiguousarray(expected[sl]).tobytes()
    # The stop came from catalog query 4, answered by the SQL engine.
    log = "".join(server.log)
    assert "SELECT is_resolved, tensors FROM sources WHERE source_id = 'u16_stack'" in log, log


def test_connection_opens_with_the_token_check(start_server, fixture_dir):
    from biopb.tensor import Connection

    server = start_server(fixture_dir)
    conn = Connection()
    assert conn.connect(server.location, timeout=10), conn.last_message
    assert conn.client.query("SELECT count(*) AS n FROM tensors").to_pylist()[0]["n"] == 8
    conn.client.close()


def test_refusals_are_flight_server_errors(start_server, fixture_dir):
    server = start_server(fixture_dir)
    client = TensorFlightClient(server.location)
    for sql in [
        "CREATE TABLE t AS SELECT 1",
        "COPY sources TO '/tmp/tessera-catalog-copy.csv'",
        "SELECT * FROM read_parquet('/etc/passwd')",
        "SELECT * FROM passwords",
    ]:
        with pytest.raises(flight.FlightServerError, match="Catalog query failed"):
            client.query(sql)


def test_catalog_tables_are_flights_for_generic_tools(start_server, fixture_dir, arrays):
    server = start_server(fixture_dir)
    fc = flight.connect(server.location)
    info = fc.get_flight_info(flight.FlightDescriptor.for_path("sources"))
    assert "unresolved_reason" in info.schema.names
    table = fc.do_get(info.endpoints[0].ticket).read_all()
    assert table.num_rows == len(arrays)
    metadata = json.loads(table.column("metadata_json")[0].as_py())
    assert metadata["format"] == "npy"
    listed = [f.descriptor.path[0].decode() for f in fc.list_flights()]
    assert sorted(listed) == sorted(arrays), "ListFlights lists tensors only"
    tables = [f.descriptor.path[0].decode() for f in fc.list_flights(b"catalog")]
    assert tables == ["sources", "tensors"]
