"""The HTTP API (`--http-listen`) with a plain HTTP client (urllib): tiles and slices
compared with numpy, the sidecar's headers, ETag/304 and Cache-Control, Content-Encoding,
the token, the probes, the tree and the annotations, against the real server on loopback."""
import gzip
import json
import re
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

TOKEN = "http-token_0123456789"
HTTP_LINE = re.compile(r"viewer and HTTP API on (https?://[0-9.:]+)/")


def pattern(shape=(2, 3, 1100, 1300)):
    """uint16, constant on 4x4 blocks of the plane (so a 2x or 4x reduction is the same
    by nearest and by area) and different on every block, channel and plane."""
    c, z, y, x = np.indices(shape, dtype=np.int64)
    return ((y // 4) * 331 + (x // 4) + c * 5000 + z * 20000) % 65536


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    np.save(d / "pat.npy", pattern().astype("<u2"))
    rng = np.random.default_rng(3)
    np.save(d / "be.npy", rng.integers(-30000, 30000, (70, 90)).astype(">i2"))
    np.save(d / "fine.npy", fine())
    return d


def http_base(server):
    """The HTTP address the server logged."""
    deadline = time.time() + 10
    while time.time() < deadline:
        for line in server.log:
            m = HTTP_LINE.search(line)
            if m:
                return m.group(1)
        time.sleep(0.05)
    raise AssertionError("no HTTP address logged:\n" + "".join(server.log[-20:]))


def call(url, token=None, data=None, headers=None):
    """(status, headers, body) of one request; HTTP errors are answers too."""
    request = urllib.request.Request(url, data=data, headers=dict(headers or {}))
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def as_array(headers, body):
    dtype = np.dtype(headers["X-Dtype"]).newbyteorder("<")
    shape = tuple(int(s) for s in headers["X-Shape"].split(","))
    return np.frombuffer(body, dtype=dtype).reshape(shape)


@pytest.fixture
def served(start_server, data):
    server = start_server(data, extra=["--http-listen", "127.0.0.1:0"])
    return http_base(server)


def test_probes_answer_without_a_token(start_server, data):
    server = start_server(data, extra=["--http-listen", "127.0.0.1:0", "--token", TOKEN])
    base = http_base(server)
    status, _, body = call(base + "/livez")
    assert status == 200 and json.loads(body)["status"] == "ok"
    for probe in ("/readyz", "/healthz"):
        status, _, body = call(base + probe)
        ready = json.loads(body)
        assert status == 200 and ready["ready"] is True and ready["source_count"] == 3


def test_the_token_is_required_on_the_api(start_server, data):
    server = start_server(data, extra=["--http-listen", "127.0.0.1:0", "--token", TOKEN])
    base = http_base(server)
    url = base + "/api/tile_info/pat"
    status, headers, body = call(url)
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    assert "Authorization: Bearer TOKEN" in json.loads(body)["detail"]
    assert call(url, token="wrong-token_0123456789")[0] == 401
    assert call(url, token=TOKEN)[0] == 200
    assert call(url, headers={"X-Biopb-Token": TOKEN})[0] == 200
    status, _, body = call(base + "/api/tile/pat?level=0&col=0&row=0")
    assert status == 401 and body.find(b"\x00\x00") < 0


def test_tile_info_describes_the_grid(served):
    status, _, body = call(served + "/api/tile_info/pat")
    assert status == 200
    info = json.loads(body)
    assert info["array_id"].startswith("pat@") and len(info["array_id"]) == len("pat@") + 8
    assert info["shape"] == [2, 3, 1100, 1300]
    assert info["dim_labels"] == ["c", "z", "y", "x"]
    assert info["dtype"] == "<u2"
    assert info["tile_size"] == 512
    assert info["plane"] == {"y": 2, "x": 3, "s": None}
    assert info["selectable"] == {"t": None, "z": 1, "c": 0}
    assert info["sel_axes"] == []
    assert [(l["level"], l["width"], l["height"], l["cols"], l["rows"]) for l in info["levels"]] == [
        (0, 1300, 1100, 3, 3),
        (1, 650, 550, 2, 2),
        (2, 325, 275, 1, 1),
    ]
    assert info["pyramid"][0]["scale_hint"] == [1, 1, 1, 1]


@pytest.mark.parametrize(
    "level,col,row,c,z",
    [(0, 0, 0, 0, 0), (0, 2, 2, 1, 2), (0, 1, 2, 0, 1), (1, 1, 0, 1, 0), (1, 1, 1, 0, 2), (2, 0, 0, 1, 1)],
)
def test_tiles_are_the_pattern(served, level, col, row, c, z):
    whole = pattern()
    url = f"{served}/api/tile/pat?level={level}&col={col}&row={row}&c={c}&z={z}"
    status, headers, body = call(url)
    assert status == 200, body
    s, edge = 2**level, 512
    y0, x0 = row * edge * s, col * edge * s
    want = whole[c : c + 1, z : z + 1, y0 : y0 + edge * s : s, x0 : x0 + edge * s : s]
    got = as_array(headers, body)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want.astype(np.uint16))
    assert headers["X-Dtype"] == "uint16"
    assert headers["X-Dim-Labels"] == "c,z,y,x"
    assert headers["Content-Type"] == "application/octet-stream"
    assert (headers["X-Tile-Size"], headers["X-Tile-Level"]) == ("512", str(level))
    assert (headers["X-Tile-Col"], headers["X-Tile-Row"]) == (str(col), str(row))


def fine():
    return (np.arange(600 * 700, dtype=np.int64) * 7919 % 251).reshape(600, 700).astype("|u1")


def test_a_level_off_the_advertised_ladder_is_decimated_by_nearest(served):
    info = json.loads(call(f"{served}/api/tile_info/fine")[2])
    advertised = [p["scale_hint"] for p in info["pyramid"]]
    assert [2, 2] not in advertised  # 600x700 u1 is below the policy's first level
    want = fine()
    for level, col in ((0, 1), (1, 0)):
        status, headers, body = call(f"{served}/api/tile/fine?level={level}&col={col}&row=0")
        assert status == 200, body
        s = 2**level
        np.testing.assert_array_equal(
            as_array(headers, body), want[0 : 512 * s : s, col * 512 * s : (col + 1) * 512 * s : s]
        )


def test_big_endian_sources_are_served_little_endian(served, data):
    want = np.load(data / "be.npy")
    status, headers, body = call(f"{served}/api/tile/be?level=0&col=0&row=0")
    assert status == 200 and headers["X-Dtype"] == "int16"
    np.testing.assert_array_equal(np.frombuffer(body, "<i2").reshape(70, 90), want)


def test_etag_revalidates_and_versioned_ids_are_immutable(served):
    info = json.loads(call(served + "/api/tile_info/pat")[2])
    versioned = info["array_id"]
    bare = f"{served}/api/tile/pat?level=1&col=0&row=0&z=1"
    status, headers, body = call(bare)
    etag = headers["ETag"]
    assert status == 200 and re.fullmatch(r'"[0-9a-f]{32}"', etag)
    assert headers["Cache-Control"] == "private, no-cache"
    status, headers2, body2 = call(bare, headers={"If-None-Match": etag})
    assert status == 304 and body2 == b"" and headers2["ETag"] == etag
    status, headers3, body3 = call(f"{served}/api/tile/{versioned}?level=1&col=0&row=0&z=1")
    assert status == 200 and body3 == body and headers3["ETag"] == etag
    assert headers3["Cache-Control"] == "private, max-age=31536000, immutable"
    # Another plane is another tile: no 304 for it.
    other = call(f"{served}/api/tile/pat?level=1&col=0&row=0&z=2", headers={"If-None-Match": etag})
    assert other[0] == 200
    # A tile that does not exist is a 404 whatever ETag is held.
    assert call(f"{served}/api/tile/pat?level=1&col=5&row=0", headers={"If-None-Match": etag})[0] == 404
    # A superseded version token is a 404 naming the current id.
    status, _, body = call(f"{served}/api/tile/pat@00000000?level=0&col=0&row=0")
    assert status == 404 and versioned in json.loads(body)["detail"]


def test_tiles_are_encoded_when_the_client_accepts_it(served):
    url = f"{served}/api/tile/pat?level=0&col=0&row=0"
    plain = call(url)[2]
    status, headers, body = call(url, headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert len(body) < len(plain) and gzip.decompress(body) == plain
    assert headers["ETag"].endswith('-gzip"')
    status, headers, body = call(url, headers={"Accept-Encoding": "zstd, gzip"})
    assert status == 200 and headers["Content-Encoding"] == "zstd"
    numcodecs = pytest.importorskip("numcodecs")
    assert bytes(numcodecs.Zstd().decode(body)) == plain
    # A 304 answers the encoded representation the client holds.
    assert call(url, headers={"Accept-Encoding": "zstd", "If-None-Match": headers["ETag"]})[0] == 304


def test_slices_at_full_resolution_and_scaled(served, data):
    whole = pattern()
    body = json.dumps({"array_id": "pat", "slice_start": [1, 0, 100, 250], "slice_stop": [2, 3, 903, 1297]})
    status, headers, raw = call(served + "/api/slice", data=body.encode())
    assert status == 200, raw
    np.testing.assert_array_equal(as_array(headers, raw), whole[1:2, 0:3, 100:903, 250:1297])
    assert headers["X-Scale-Hint"] == "1,1,1,1"
    body = json.dumps(
        {
            "array_id": "pat",
            "slice_start": [0, 1, 0, 0],
            "slice_stop": [2, 2, 1100, 1300],
            "scale_hint": [1, 1, 4, 4],
            "reduction_method": "nearest",
        }
    )
    status, headers, raw = call(served + "/api/slice", data=body.encode())
    assert status == 200, raw
    np.testing.assert_array_equal(as_array(headers, raw), whole[0:2, 1:2, ::4, ::4])
    assert headers["X-Scale-Hint"] == "1,1,4,4"
    be = np.load(data / "be.npy")
    status, headers, raw = call(
        served + "/api/slice", data=json.dumps({"array_id": "be", "slice_start": [3, 5], "slice_stop": [60, 88]}).encode()
    )
    assert status == 200
    np.testing.assert_array_equal(as_array(headers, raw), be[3:60, 5:88])


def test_refusals_name_what_was_refused(served):
    cases = [
        ("/api/tile/pat?level=3&col=0&row=0", 404, "level 3 does not exist"),
        ("/api/tile/pat?level=0&col=3&row=0", 404, "outside level 0"),
        ("/api/tile/pat?level=0&col=0&row=0&z=3", 422, "outside its 3 elements"),
        ("/api/tile/pat?level=0&col=0&row=0&t=1", 422, "has no t axis"),
        ("/api/tile/pat?level=0&col=0&row=0&fmt=png", 410, "raw only"),
        ("/api/tile/pat?level=x", 422, "not a non-negative integer"),
        ("/api/tile_info/nosuch", 404, "nosuch"),
        ("/api/nothing", 404, "no such endpoint"),
    ]
    for path, code, words in cases:
        status, _, body = call(served + path)
        assert status == code, (path, status, body)
        assert words in json.loads(body)["detail"], (path, body)
    bad = [
        ({"array_id": "pat", "slice_start": [0, 0, 0, 0], "slice_stop": [1, 1, 1200, 10]}, 422, "axis 2"),
        ({"slice_start": [0], "slice_stop": [1]}, 422, "array_id"),
        ({"array_id": "pat", "scale_policy": "volume"}, 422, "scale_policy"),
        ({"array_id": "pat", "slice_start": [0, 0, 0, 0], "slice_stop": [2, 3, 1100, 1300], "scale_hint": [1, 1, 0, 1]}, 422, "pat"),
    ]
    for request, code, words in bad:
        status, _, body = call(served + "/api/slice", data=json.dumps(request).encode())
        assert status == code, (request, status, body)
        assert words in json.loads(body)["detail"], (request, body)
    status, _, body = call(served + "/api/slice", data=b"{not json")
    assert status == 422 and "not valid JSON" in json.loads(body)["detail"]


def test_the_tree_lists_the_sources_under_an_etag(served):
    status, headers, body = call(served + "/api/tree")
    assert status == 200
    level = json.loads(body)

    def leaves(level):
        found = {s["name"]: s for s in level["sources"]}
        for folder in level["folders"]:
            found.update(leaves(json.loads(call(served + "/api/tree?key=" + urllib.request.quote(folder["key"]))[2])))
        return found

    found = leaves(level)
    assert {"pat.npy", "be.npy", "fine.npy"} <= set(found)
    tensor = found["pat.npy"]["descriptor"]["tensors"][0]
    assert tensor["shape"] == [2, 3, 1100, 1300] and tensor["array_id"].startswith("pat@")
    assert call(served + "/api/tree", headers={"If-None-Match": headers["ETag"]})[0] == 304


def test_rois_are_listed_as_proto3_json(start_server, data):
    from biopb.tensor import TensorFlightClient
    from test_rois import ann

    server = start_server(data, extra=["--http-listen", "127.0.0.1:0", "--writable"])
    base = http_base(server)
    status, _, body = call(base + "/api/rois/pat")
    assert status == 200 and json.loads(body)["rois"] == []
    client = TensorFlightClient(server.location, cache_bytes=0)
    rect = {"rectangle": {"topLeft": {"x": 10, "y": 20}, "bottomRight": {"x": 300, "y": 200}}}
    client.put_rois("pat", [ann(rect, label="cell")])
    status, _, body = call(base + "/api/rois/pat")
    listing = json.loads(body)
    assert status == 200 and len(listing["rois"]) == 1
    roi = listing["rois"][0]
    assert roi["label"] == "cell" and roi["roi"] == rect and roi["arrayId"] == "pat"
    info = json.loads(call(base + "/api/tile_info/pat")[2])
    status, _, body = call(base + "/api/rois/" + info["array_id"])
    assert status == 200 and json.loads(body)["rois"][0]["arrayId"] == info["array_id"]


def test_a_configured_address_that_is_taken_fails_the_start(start_server, data, served):
    port = served.rsplit(":", 1)[1]
    with pytest.raises(RuntimeError, match="did not start"):
        start_server(data, extra=["--http-listen", f"127.0.0.1:{port}"])


def test_an_exposed_address_needs_a_token(start_server, data):
    with pytest.raises(RuntimeError, match="refusing to serve the HTTP API on 0.0.0.0:0 without a token"):
        start_server(data, extra=["--http-listen", "0.0.0.0:0"])


APP = "http://app.example:8080"


def test_cors_is_off_unless_origins_are_configured(served):
    status, headers, _ = call(served + "/api/tile_info/pat", headers={"Origin": APP})
    assert status == 200 and headers["Access-Control-Allow-Origin"] is None
    request = urllib.request.Request(
        served + "/api/tile/pat?level=0&col=0&row=0", method="OPTIONS",
        headers={"Origin": APP, "Access-Control-Request-Method": "GET"})
    try:
        urllib.request.urlopen(request, timeout=30)
        raise AssertionError("a preflight was answered with CORS off")
    except urllib.error.HTTPError as e:
        assert e.code == 405 and e.headers["Access-Control-Allow-Origin"] is None


def preflight(url, origin, headers="authorization"):
    request = urllib.request.Request(url, method="OPTIONS", headers={
        "Origin": origin, "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_configured_origins_may_call_the_api(start_server, data):
    server = start_server(data, extra=["--http-listen", "127.0.0.1:0", "--token", TOKEN,
                                       "--http-cors-origin", APP],
                          env={"TESSERA_HTTP_CORS_ORIGINS": "https://ignored.example"})
    base = http_base(server)
    url = base + "/api/tile/pat?level=0&col=0&row=0&z=1"
    # The preflight carries no token and is answered before the token check.
    status, headers, _ = preflight(url, APP)
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == APP
    assert "authorization" in headers["Access-Control-Allow-Headers"]
    assert set(headers["Access-Control-Allow-Methods"].replace(" ", "").split(",")) == {"GET", "POST"}
    assert "origin" in headers["Vary"].lower()
    # The request itself: the token is still required, and the page may read the headers.
    status, headers, _ = call(url, headers={"Origin": APP})
    assert status == 401 and headers["Access-Control-Allow-Origin"] == APP
    status, headers, body = call(url, token=TOKEN, headers={"Origin": APP})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == APP
    exposed = headers["Access-Control-Expose-Headers"].lower()
    assert all(h in exposed for h in ("x-shape", "x-dtype", "x-dim-labels", "x-tile-size", "etag"))
    assert np.array_equal(as_array(headers, body)[0, 0], pattern()[0, 1, :512, :512])
    # Another origin (the flag wins over the variable): no CORS headers, its preflight refused.
    for other in ("https://ignored.example", "http://app.example:8081"):
        status, headers, body = preflight(url, other)
        assert status == 403 and headers["Access-Control-Allow-Origin"] is None
        assert "--http-cors-origin" in json.loads(body)["detail"]
        status, headers, _ = call(url, token=TOKEN, headers={"Origin": other})
        assert status == 200 and headers["Access-Control-Allow-Origin"] is None


def test_cors_origins_from_the_environment_and_the_file(start_server, data, tmp_path):
    server = start_server(data, extra=["--http-listen", "127.0.0.1:0"],
                          env={"TESSERA_HTTP_CORS_ORIGINS": f"https://a.example,{APP}"})
    base = http_base(server)
    for origin in ("https://a.example", APP):
        status, headers, _ = call(base + "/api/tile_info/pat", headers={"Origin": origin})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == origin
    config = tmp_path / "tessera.toml"
    config.write_text('http_cors_origins = ["*"]\n')
    server = start_server(data, extra=["--http-listen", "127.0.0.1:0", "--config", config])
    status, headers, _ = preflight(http_base(server) + "/api/slice", "https://anywhere.example")
    assert status == 204 and headers["Access-Control-Allow-Origin"] == "*"


def test_an_origin_with_a_path_is_refused_at_start(start_server, data):
    with pytest.raises(RuntimeError, match=r"http_cors_origins entry \"https://app.example/\" is not an origin"):
        start_server(data, extra=["--http-listen", "127.0.0.1:0", "--http-cors-origin", "https://app.example/"])


def test_readyz_answers_503_once_a_stop_is_requested(start_server, tmp_path):
    """A Flight read the client does not take keeps the server draining (up to its grace);
    meanwhile the HTTP side still answers, and its readiness probe says no."""
    import signal

    import pyarrow.flight as flight

    d = tmp_path / "big"
    d.mkdir()
    np.save(d / "big.npy", np.zeros((4096, 8192), "<u2"))  # 64 MiB, one chunk
    server = start_server(d, extra=["--http-listen", "127.0.0.1:0", "--chunk-target", "64MiB"])
    base = http_base(server)
    assert call(base + "/readyz")[0] == 200
    client = flight.connect(server.location)
    info = client.get_flight_info(flight.FlightDescriptor.for_path("big"))
    assert len(info.endpoints) == 1
    reader = client.do_get(info.endpoints[0].ticket)  # its 64 MiB fill the windows, unread
    try:
        time.sleep(0.5)
        server.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 5
        while time.time() < deadline:
            status, _, body = call(base + "/readyz")
            if status == 503:
                break
            time.sleep(0.05)
        assert status == 503, body
        ready = json.loads(body)
        assert ready["ready"] is False and ready["status"] == "stopping"
        assert server.proc.poll() is None, "the server stopped before the read finished"
    finally:
        del reader
        client.close()
