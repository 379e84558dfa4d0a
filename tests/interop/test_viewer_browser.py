"""The viewer page in a real browser: headless Chromium (Debian's package; .ci/run installs
it) driven over the DevTools protocol opens the page on a served pattern tensor, goes to a
plane and a zoom level through the URL hash, and the canvas pixels are checked against the
pattern; the channel overlay, an annotation and the scale bar too. A screenshot of each view
is kept under target/test-artifacts/. Without a browser the test skips, and fails under
CI=true."""
import json
import math
import os
import pathlib
import sys

import numpy as np
import pytest

from test_http_api import http_base

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support" / "python"))
from cdp import Browser, find_browser  # noqa: E402

ARTIFACTS = ROOT / "target" / "test-artifacts"
SHAPE = (2, 3, 1000, 1200)


def pattern():
    """uint16, one value per 2x2 block of the plane, different per channel and plane."""
    c, z, y, x = np.indices(SHAPE, dtype=np.int64)
    return ((y // 2) * 97 + (x // 2) * 13 + c * 7000 + z * 23000) % 65536


@pytest.fixture
def browser(tmp_path):
    binary = find_browser()
    if binary is None:
        message = "no Chromium found (apt-get install chromium, or set TESSERA_CHROMIUM)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    b = Browser(binary, str(tmp_path / "profile"), width=1100, height=700)
    yield b
    b.close()


@pytest.fixture
def viewer(start_server, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    np.save(d / "pat.npy", pattern().astype("<u2"))
    (d / "pat.json").write_text(json.dumps({"physical_scale": [1, 1, 0.25, 0.25], "physical_unit": "um"}))
    server = start_server(d, extra=["--http-listen", "127.0.0.1:0", "--writable"])
    return server, http_base(server)


def drawn(browser, **expected):
    """The state of the last complete frame, once it is the one expected."""
    checks = " && ".join(f"d.{k} === {json.dumps(v)}" for k, v in expected.items())
    return json.loads(
        browser.wait_for(
            "(() => { const s = document.body && document.body.dataset.drawn; if (!s) return null; "
            f"const d = JSON.parse(s); return ({checks}) ? s : null; }})()"
        )
    )


def pixels(browser, points):
    """RGB of the canvas at (x, y) screen points."""
    return browser.evaluate(
        "(() => { const c = document.getElementById('canvas').getContext('2d');"
        f" return {json.dumps(points)}.map(([x, y]) => Array.from(c.getImageData(x, y, 1, 1).data.slice(0, 3))); }})()"
    )


def sample_points(browser, state, step):
    """Screen points well inside one pixel of the level drawn, with the image pixel
    (full-resolution coordinates of the level pixel's first element) each shows."""
    w, h = browser.evaluate("[document.getElementById('canvas').width, document.getElementById('canvas').height]")
    zoom, scale = state["zoom"], 2 ** state["level"]
    # The page's corner, snapped to whole screen pixels as it draws.
    x0 = math.floor((state["cx"] - w / (2 * zoom)) * zoom + 0.5) / zoom  # JS Math.round
    y0 = math.floor((state["cy"] - h / (2 * zoom)) * zoom + 0.5) / zoom
    points = []
    for sy in range(5, h - 5, 37):
        for sx in range(5, w - 5, 41):
            fx, fy = x0 + (sx + 0.5) / zoom, y0 + (sy + 0.5) / zoom
            lx, ly = fx / scale, fy / scale  # in level pixels
            inside = 0 <= fx < SHAPE[3] and 0 <= fy < SHAPE[2]
            if inside and 0.2 < lx % 1 < 0.8 and 0.2 < ly % 1 < 0.8:
                points.append(((sx, sy), (int(lx) * scale, int(ly) * scale)))
    assert len(points) > 20, (json.dumps(state), w, h)
    return points[::step]


def gray(value, lo, hi):
    t = (value - lo) / (hi - lo)
    return 0 if t <= 0 else 255 if t >= 1 else int(np.floor(t * 255))


def test_the_page_draws_a_plane_of_the_pyramid_at_a_zoom_level(viewer, browser):
    _, base = viewer
    whole = pattern()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    # Level 1 (zoom 1/2: one level pixel per screen pixel), plane z=2 of channel 1.
    browser.goto(f"{base}/#id=pat&zoom=0.5&cx=600&cy=500&z=2&c=1&lo=0&hi=65535&cmap=gray")
    state = drawn(browser, level=1)
    assert state["sel"] == {"0": 1, "1": 2} and state["tiles"] >= 1
    points = sample_points(browser, state, 3)
    got = pixels(browser, [p for p, _ in points])
    for (screen, (x, y)), rgb in zip(points, got):
        want = gray(whole[1, 2, y, x], 0, 65535)
        assert rgb == [want] * 3, (screen, (x, y), rgb, want)
    browser.screenshot(ARTIFACTS / "viewer-level1-z2-c1.png")

    # Zoomed in past full resolution: level 0, each image pixel 3x3 screen pixels, z=0, c=0.
    browser.goto(f"{base}/#id=pat&zoom=3&cx=317&cy=201&z=0&c=0&lo=1000&hi=30000&cmap=gray")
    state = drawn(browser, level=0, zoom=3)
    points = sample_points(browser, state, 5)
    got = pixels(browser, [p for p, _ in points])
    for (screen, (x, y)), rgb in zip(points, got):
        want = gray(whole[0, 0, y, x], 1000, 30000)
        assert rgb == [want] * 3, (screen, (x, y), rgb, want)
    # The sliders show the plane.
    assert browser.evaluate("document.getElementById('slider-z').max") == "2"
    browser.screenshot(ARTIFACTS / "viewer-level0-zoom3.png")


def test_channel_overlay_annotations_and_scale_bar(viewer, browser):
    from biopb.tensor import TensorFlightClient
    from test_rois import ann

    server, base = viewer
    whole = pattern()
    rect = {"rectangle": {"topLeft": {"x": 100, "y": 100}, "bottomRight": {"x": 500, "y": 400}}}
    TensorFlightClient(server.location, cache_bytes=0).put_rois("pat", [ann(rect, label="cell")])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.goto(f"{base}/#id=pat&zoom=1&cx=550&cy=350&z=1&lo=0&hi=65535&overlay=1")
    state = drawn(browser, level=0, overlay=True, rois=1)
    points = sample_points(browser, state, 7)
    # Away from the annotation's outline, red is channel 0 and green channel 1.
    points = [p for p in points if not (95 <= p[1][0] <= 505 and 80 <= p[1][1] <= 405)]
    got = pixels(browser, [p for p, _ in points])
    for (screen, (x, y)), rgb in zip(points, got):
        assert rgb == [gray(whole[0, 1, y, x], 0, 65535), gray(whole[1, 1, y, x], 0, 65535), 0], (screen, (x, y), rgb)
    # The rectangle's top edge (image y=100) is drawn in yellow.
    w, h = browser.evaluate("[document.getElementById('canvas').width, document.getElementById('canvas').height]")
    x0, y0 = math.floor(550 - w / 2 + 0.5), math.floor(350 - h / 2 + 0.5)
    edge = pixels(browser, [[int(300 - x0), int(100 - y0)]])[0]
    assert edge[0] > 200 and edge[1] > 200 and edge[2] < 80, edge
    # One screen pixel is 0.25 um at zoom 1: the bar is a round length under 120 px.
    text = browser.evaluate("document.getElementById('scalebar-text').textContent")
    width = browser.evaluate("document.getElementById('scalebar-bar').style.width")
    assert text == "20 µm" and width == "80px", (text, width)
    browser.screenshot(ARTIFACTS / "viewer-overlay-roi.png")


def test_the_catalog_tree_opens_a_tensor(viewer, browser):
    _, base = viewer
    browser.goto(f"{base}/")
    browser.wait_for("!!document.querySelector('#tree .folder, #tree .source')")
    browser.evaluate(
        "(() => { const folders = [...document.querySelectorAll('#tree .folder')];"
        " folders.forEach(f => f.click()); return true; })()"
    )
    browser.wait_for("[...document.querySelectorAll('#tree .source')].some(s => s.textContent === 'pat.npy')")
    browser.evaluate("[...document.querySelectorAll('#tree .source')].find(s => s.textContent === 'pat.npy').click()")
    state = drawn(browser, id="pat")
    assert state["tiles"] >= 1
    assert "id=pat" in browser.evaluate("location.hash")
