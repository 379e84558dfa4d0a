// The Tessera viewer: a tensor's pyramid drawn tile by tile on one canvas, from the
// server's HTTP API (/api/tree, /api/tile_info, /api/tile, /api/rois). Plain JavaScript,
// no dependencies. Its state lives in the URL hash (id, zoom, cx, cy, t, z, c, sel, lo,
// hi, cmap, overlay), so a view can be bookmarked and a test can open one.
"use strict";

const $ = (id) => document.getElementById(id);
const canvas = $("canvas");
const ctx = canvas.getContext("2d", { willReadFrequently: true });

const state = {
  id: null, info: null, zoom: 1, cx: 0, cy: 0, sel: {}, lo: null, hi: null,
  cmap: "gray", overlay: false, rois: [], showRois: true,
};
const tiles = new Map(); // url -> Promise<{w, h, samples, data}>
let token = sessionStorage.getItem("tessera-token") || "";
let renderGeneration = 0;

// ---- colour maps: 256-entry RGB tables from a few control points ----
function ramp(points) {
  const lut = new Uint8Array(256 * 3);
  for (let i = 0; i < 256; i++) {
    const t = i / 255;
    let k = 0;
    while (k < points.length - 2 && t > points[k + 1][0]) k++;
    const [t0, ...c0] = points[k];
    const [t1, ...c1] = points[k + 1];
    const f = t1 > t0 ? Math.min(1, Math.max(0, (t - t0) / (t1 - t0))) : 0;
    for (let j = 0; j < 3; j++) lut[i * 3 + j] = Math.round(c0[j] + (c1[j] - c0[j]) * f);
  }
  return lut;
}
const COLORMAPS = {
  gray: ramp([[0, 0, 0, 0], [1, 255, 255, 255]]),
  viridis: ramp([[0, 68, 1, 84], [0.25, 59, 82, 139], [0.5, 33, 145, 140], [0.75, 94, 201, 98], [1, 253, 231, 37]]),
  magma: ramp([[0, 0, 0, 4], [0.25, 81, 18, 124], [0.5, 183, 55, 121], [0.75, 252, 137, 97], [1, 252, 253, 191]]),
  fire: ramp([[0, 0, 0, 0], [0.33, 200, 0, 0], [0.66, 255, 200, 0], [1, 255, 255, 255]]),
  red: ramp([[0, 0, 0, 0], [1, 255, 0, 0]]),
  green: ramp([[0, 0, 0, 0], [1, 0, 255, 0]]),
  blue: ramp([[0, 0, 0, 0], [1, 0, 0, 255]]),
};
// Channel colours of an overlay, in channel order.
const OVERLAY = [[255, 0, 0], [0, 255, 0], [0, 0, 255], [0, 255, 255], [255, 0, 255], [255, 255, 0]];

// ---- the API ----
async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  if (token) headers.Authorization = "Bearer " + token;
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail; } catch (e) { /* not JSON */ }
    throw new Error(`${response.status}: ${detail}`);
  }
  return response;
}
const idPath = (id) => id.split("/").map(encodeURIComponent).join("/");

function half(h) { // IEEE 754 binary16 to a number
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
  if (e === 0) return s * f * 2 ** -24;
  if (e === 31) return f ? NaN : s * Infinity;
  return s * (1 + f / 1024) * 2 ** (e - 15);
}

function typed(buffer, dtype) {
  switch (dtype) {
    case "bool": case "uint8": return new Uint8Array(buffer);
    case "int8": return new Int8Array(buffer);
    case "uint16": return new Uint16Array(buffer);
    case "int16": return new Int16Array(buffer);
    case "uint32": return new Uint32Array(buffer);
    case "int32": return new Int32Array(buffer);
    case "float32": return new Float32Array(buffer);
    case "float64": return new Float64Array(buffer);
    case "int64": return Float64Array.from(new BigInt64Array(buffer), Number);
    case "uint64": return Float64Array.from(new BigUint64Array(buffer), Number);
    case "float16": return Float32Array.from(new Uint16Array(buffer), half);
    case "complex64": case "complex128": {
      const parts = dtype === "complex64" ? new Float32Array(buffer) : new Float64Array(buffer);
      const out = new Float64Array(parts.length / 2);
      for (let i = 0; i < out.length; i++) out[i] = Math.hypot(parts[2 * i], parts[2 * i + 1]);
      return out;
    }
    default: throw new Error("dtype " + dtype + " is not drawn");
  }
}

function tile(level, col, row, sel) {
  const params = new URLSearchParams({ level, col, row });
  const info = state.info;
  for (const [axis, index] of Object.entries(sel)) {
    const name = Object.keys(info.selectable).find((k) => info.selectable[k] === Number(axis));
    if (name) params.set(name, index); else params.append("sel", `${axis}:${index}`);
  }
  const url = `/api/tile/${idPath(info.array_id)}?${params}`;
  if (!tiles.has(url)) {
    const p = api(url).then(async (r) => {
      const shape = r.headers.get("X-Shape").split(",").map(Number);
      const data = typed(await r.arrayBuffer(), r.headers.get("X-Dtype"));
      const plane = info.plane;
      return { h: shape[plane.y], w: shape[plane.x], samples: plane.s === null ? 1 : shape[plane.s], data };
    });
    p.catch(() => tiles.delete(url));
    tiles.set(url, p);
    if (tiles.size > 600) tiles.delete(tiles.keys().next().value);
  }
  return tiles.get(url);
}

// ---- the view ----
function levelFor(zoom) {
  const levels = state.info.levels;
  const wanted = Math.floor(Math.log2(1 / zoom) + 1e-9);
  return Math.max(0, Math.min(levels.length - 1, wanted));
}

function channelAxis() {
  const c = state.info.selectable.c;
  return c === null || c === undefined ? null : c;
}

// The selections one frame draws: one, or one per channel when overlaying.
function selections() {
  const c = channelAxis();
  if (!state.overlay || c === null) return [Object.assign({}, state.sel)];
  const count = Math.min(state.info.shape[c], OVERLAY.length);
  return Array.from({ length: count }, (_, k) => Object.assign({}, state.sel, { [c]: k }));
}

function paint(parts, image) {
  const { lo, hi } = state;
  const span = hi > lo ? hi - lo : 1;
  const out = image.data;
  const n = parts[0].w * parts[0].h;
  const level = (v) => { const t = (v - lo) / span; return t <= 0 || t !== t ? 0 : t >= 1 ? 255 : Math.floor(t * 255); };
  if (parts.length > 1) {
    out.fill(0);
    parts.forEach((part, k) => {
      const [r, g, b] = OVERLAY[k];
      for (let i = 0; i < n; i++) {
        const v = level(part.data[i]);
        out[4 * i] = Math.min(255, out[4 * i] + (r * v) / 255);
        out[4 * i + 1] = Math.min(255, out[4 * i + 1] + (g * v) / 255);
        out[4 * i + 2] = Math.min(255, out[4 * i + 2] + (b * v) / 255);
      }
    });
    for (let i = 0; i < n; i++) out[4 * i + 3] = 255;
    return;
  }
  const part = parts[0];
  if (part.samples >= 3) {
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < 3; j++) out[4 * i + j] = level(part.data[i * part.samples + j]);
      out[4 * i + 3] = 255;
    }
    return;
  }
  const lut = COLORMAPS[state.cmap] || COLORMAPS.gray;
  for (let i = 0; i < n; i++) {
    const v = level(part.data[i]) * 3;
    out[4 * i] = lut[v]; out[4 * i + 1] = lut[v + 1]; out[4 * i + 2] = lut[v + 2]; out[4 * i + 3] = 255;
  }
}

function resize() {
  const box = $("view").getBoundingClientRect();
  canvas.width = Math.max(1, Math.floor(box.width));
  canvas.height = Math.max(1, Math.floor(box.height));
}

async function render() {
  const generation = ++renderGeneration;
  const info = state.info;
  if (!info) return;
  const L = levelFor(state.zoom);
  const lv = info.levels[L];
  const span = info.tile_size * lv.scale;
  const W = canvas.width, H = canvas.height, zoom = state.zoom;
  // The view's corner in image pixels, snapped so tiles land on whole screen pixels.
  const x0 = Math.round((state.cx - W / (2 * zoom)) * zoom) / zoom;
  const y0 = Math.round((state.cy - H / (2 * zoom)) * zoom) / zoom;
  const cols = [Math.max(0, Math.floor(x0 / span)), Math.min(lv.cols - 1, Math.floor((x0 + W / zoom) / span))];
  const rows = [Math.max(0, Math.floor(y0 / span)), Math.min(lv.rows - 1, Math.floor((y0 + H / zoom) / span))];
  const sels = selections();
  const jobs = [];
  for (let row = rows[0]; row <= rows[1]; row++) {
    for (let col = cols[0]; col <= cols[1]; col++) {
      jobs.push(Promise.all(sels.map((sel) => tile(L, col, row, sel))).then((parts) => ({ col, row, parts })));
    }
  }
  $("level").textContent = `level ${L} (scale ${lv.scale}), zoom ${zoom.toPrecision(3)}, ${jobs.length} tiles`;
  let drawn;
  try {
    drawn = await Promise.all(jobs);
  } catch (err) {
    status("tile failed: " + err.message);
    return;
  }
  if (generation !== renderGeneration) return; // a newer frame is on its way
  ctx.fillStyle = "#000";
  ctx.fillRect(0, 0, W, H);
  ctx.imageSmoothingEnabled = false;
  for (const { col, row, parts } of drawn) {
    const { w, h } = parts[0];
    const off = new OffscreenCanvas(w, h);
    const octx = off.getContext("2d");
    const image = octx.createImageData(w, h);
    paint(parts, image);
    octx.putImageData(image, 0, 0);
    ctx.drawImage(off, (col * span - x0) * zoom, (row * span - y0) * zoom, w * lv.scale * zoom, h * lv.scale * zoom);
  }
  if (state.showRois) drawRois(x0, y0, zoom);
  scaleBar();
  document.body.dataset.drawn = JSON.stringify({
    id: state.id, level: L, zoom, cx: state.cx, cy: state.cy, sel: state.sel,
    overlay: state.overlay, lo: state.lo, hi: state.hi, cmap: state.cmap, tiles: drawn.length, rois: state.rois.length,
  });
  status("");
}

function shown(roi) {
  return Object.entries(roi.plane || {}).every(([axis, index]) => (state.sel[axis] ?? 0) === Number(index));
}

function drawRois(x0, y0, zoom) {
  const X = (x) => (x - x0) * zoom, Y = (y) => (y - y0) * zoom;
  ctx.lineWidth = 2;
  ctx.strokeStyle = "#ffff00";
  ctx.fillStyle = "#ffff00";
  ctx.font = "13px sans-serif";
  for (const roi of state.rois) {
    if (!shown(roi) || !roi.roi) continue;
    const g = roi.roi;
    ctx.beginPath();
    if (g.rectangle) {
      const a = g.rectangle.topLeft || {}, b = g.rectangle.bottomRight || {};
      ctx.rect(X(a.x || 0), Y(a.y || 0), (b.x - (a.x || 0)) * zoom, (b.y - (a.y || 0)) * zoom);
    } else if (g.ellipse) {
      const c = g.ellipse.center || {}, r = g.ellipse.radius || {};
      ctx.ellipse(X(c.x || 0), Y(c.y || 0), (r.x || 0) * zoom, (r.y || 0) * zoom, g.ellipse.rotation || 0, 0, 2 * Math.PI);
    } else if (g.polygon || g.polyline) {
      const pts = (g.polygon || g.polyline).points || [];
      pts.forEach((p, i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, X(p.x || 0), Y(p.y || 0)));
      if (g.polygon) ctx.closePath();
    } else if (g.point) {
      ctx.arc(X(g.point.x || 0), Y(g.point.y || 0), 4, 0, 2 * Math.PI);
    } else if (g.text) {
      ctx.fillText(g.text.text || "", X((g.text.at || {}).x || 0), Y((g.text.at || {}).y || 0));
      continue;
    }
    ctx.stroke();
    if (roi.label) ctx.fillText(roi.label, X(bounds(g).x) + 3, Y(bounds(g).y) - 4);
  }
}

function bounds(g) { // the top-left corner a label is written at
  if (g.rectangle) return g.rectangle.topLeft || { x: 0, y: 0 };
  if (g.ellipse) { const c = g.ellipse.center || {}, r = g.ellipse.radius || {}; return { x: (c.x || 0) - (r.x || 0), y: (c.y || 0) - (r.y || 0) }; }
  const pts = ((g.polygon || g.polyline || {}).points) || [g.point || { x: 0, y: 0 }];
  return { x: Math.min(...pts.map((p) => p.x || 0)), y: Math.min(...pts.map((p) => p.y || 0)) };
}

function scaleBar() {
  const info = state.info;
  const size = (info.physical_scale || [])[info.plane.x];
  const bar = $("scalebar");
  if (!size) { bar.hidden = true; return; }
  const units = info.physical_unit || [];
  const unit = units[info.plane.x] || units[0] || "";
  const perPixel = size / state.zoom; // physical size of one screen pixel
  const target = 120 * perPixel;
  const power = 10 ** Math.floor(Math.log10(target));
  const nice = [5, 2, 1].map((m) => m * power).find((v) => v <= target) || power;
  $("scalebar-bar").style.width = `${Math.round(nice / perPixel)}px`;
  $("scalebar-text").textContent = `${Number(nice.toPrecision(3))} ${unit}`.trim();
  bar.hidden = false;
}

function status(text) { $("status").textContent = text; }

// ---- state in the hash ----
function readHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  if (p.has("token")) {
    token = p.get("token");
    sessionStorage.setItem("tessera-token", token);
    p.delete("token");
    history.replaceState(null, "", "#" + p);
  }
  $("token").value = token;
  const num = (k) => (p.has(k) && p.get(k) !== "" && !Number.isNaN(Number(p.get(k))) ? Number(p.get(k)) : null);
  return {
    id: p.get("id"), zoom: num("zoom"), cx: num("cx"), cy: num("cy"), lo: num("lo"), hi: num("hi"),
    cmap: p.get("cmap"), overlay: p.get("overlay") === "1", t: num("t"), z: num("z"), c: num("c"), sel: p.getAll("sel"),
  };
}

function writeHash() {
  const p = new URLSearchParams();
  p.set("id", state.id);
  p.set("zoom", String(Number(state.zoom.toPrecision(6))));
  p.set("cx", String(Math.round(state.cx)));
  p.set("cy", String(Math.round(state.cy)));
  const sel = state.info ? state.info.selectable : {};
  for (const [axis, index] of Object.entries(state.sel)) {
    const name = Object.keys(sel).find((k) => sel[k] === Number(axis));
    if (name) p.set(name, index); else p.append("sel", `${axis}:${index}`);
  }
  if (state.lo !== null) p.set("lo", String(state.lo));
  if (state.hi !== null) p.set("hi", String(state.hi));
  p.set("cmap", state.cmap);
  if (state.overlay) p.set("overlay", "1");
  const hash = "#" + p;
  if (hash !== location.hash) history.replaceState(null, "", hash);
}

async function open(wanted) {
  status("opening " + wanted.id + " …");
  let info;
  try {
    info = await (await api(`/api/tile_info/${idPath(wanted.id)}`)).json();
  } catch (err) {
    status(err.message);
    return;
  }
  tiles.clear();
  state.info = info;
  state.id = wanted.id;
  resize();
  const height = info.shape[info.plane.y], width = info.shape[info.plane.x];
  const fit = Math.min(canvas.width / width, canvas.height / height);
  state.zoom = wanted.zoom || fit;
  state.cx = wanted.cx ?? width / 2;
  state.cy = wanted.cy ?? height / 2;
  state.sel = {};
  for (const name of ["t", "z", "c"]) {
    const axis = info.selectable[name];
    if (axis !== null && axis !== undefined) state.sel[axis] = Math.min(wanted[name] ?? 0, info.shape[axis] - 1);
  }
  for (const a of info.sel_axes) state.sel[a.axis] = 0;
  for (const s of wanted.sel || []) { const [a, i] = s.split(":").map(Number); state.sel[a] = i; }
  state.cmap = wanted.cmap || state.cmap;
  state.overlay = wanted.overlay && channelAxis() !== null;
  state.lo = wanted.lo; state.hi = wanted.hi;
  if (state.lo === null || state.hi === null) await autoContrast();
  try {
    state.rois = (await (await api(`/api/rois/${idPath(info.array_id)}`)).json()).rois || [];
  } catch (err) {
    state.rois = []; // a server without annotations answers 501
  }
  controls();
  writeHash();
  await render();
}

async function autoContrast() {
  const info = state.info;
  const L = info.levels.length - 1;
  let lo = Infinity, hi = -Infinity;
  for (const sel of selections()) {
    const t = await tile(L, 0, 0, sel);
    for (const v of t.data) { if (v < lo) lo = v; if (v > hi) hi = v; }
  }
  if (!Number.isFinite(lo)) { lo = 0; hi = 1; }
  state.lo = lo; state.hi = hi > lo ? hi : lo + 1;
}

function controls() {
  const info = state.info;
  $("controls").hidden = false;
  $("title").textContent = state.id;
  $("shape").textContent = `${info.dim_labels.join(" ")} · ${info.shape.join(" × ")} · ${info.dtype}`;
  const sliders = $("sliders");
  sliders.textContent = "";
  const axes = [];
  for (const name of ["t", "z", "c"]) {
    const axis = info.selectable[name];
    if (axis !== null && axis !== undefined && info.shape[axis] > 1) axes.push([axis, name]);
  }
  for (const a of info.sel_axes) axes.push([a.axis, a.label || `axis ${a.axis}`]);
  for (const [axis, name] of axes) {
    const div = document.createElement("div");
    div.className = "slider";
    const label = document.createElement("label");
    const input = document.createElement("input");
    input.type = "range"; input.min = 0; input.max = info.shape[axis] - 1; input.value = state.sel[axis] || 0;
    input.id = "slider-" + name;
    label.textContent = `${name} ${input.value} / ${input.max}`;
    input.addEventListener("input", () => {
      state.sel[axis] = Number(input.value);
      label.textContent = `${name} ${input.value} / ${input.max}`;
      writeHash(); render();
    });
    div.append(label, input);
    sliders.append(div);
  }
  $("lo").value = state.lo; $("hi").value = state.hi;
  $("cmap").value = state.cmap;
  $("overlay").checked = state.overlay;
  $("overlay-row").hidden = channelAxis() === null;
}

// ---- the catalog tree ----
async function listLevel(key, into) {
  let level;
  try {
    level = await (await api(`/api/tree?key=${encodeURIComponent(key)}`)).json();
  } catch (err) {
    status(err.message);
    return;
  }
  into.textContent = "";
  for (const folder of level.folders) {
    const li = document.createElement("li");
    const span = document.createElement("span");
    span.className = "folder";
    span.textContent = folder.name;
    const ul = document.createElement("ul");
    span.addEventListener("click", () => {
      if (span.classList.toggle("open")) listLevel(folder.key, ul); else ul.textContent = "";
    });
    li.append(span, ul);
    into.append(li);
  }
  for (const source of level.sources) {
    const tensor = ((source.descriptor || {}).tensors || [])[0];
    const li = document.createElement("li");
    const span = document.createElement("span");
    span.className = "source";
    span.textContent = source.name;
    if (tensor) {
      span.title = `${tensor.array_id}: ${tensor.shape.join("×")} ${tensor.dtype}`;
      span.dataset.arrayId = tensor.array_id.replace(/@[0-9a-f]+/, "");
      span.addEventListener("click", () => open({ id: span.dataset.arrayId, sel: [] }));
    }
    li.append(span);
    into.append(li);
  }
  if (level.truncated) { const li = document.createElement("li"); li.textContent = "…"; into.append(li); }
}

// ---- interaction ----
function zoomAt(factor, sx, sy) {
  const W = canvas.width, H = canvas.height;
  const ix = state.cx + (sx - W / 2) / state.zoom, iy = state.cy + (sy - H / 2) / state.zoom;
  state.zoom = Math.min(64, Math.max(1e-4, state.zoom * factor));
  state.cx = ix - (sx - W / 2) / state.zoom;
  state.cy = iy - (sy - H / 2) / state.zoom;
  writeHash(); render();
}

let drag = null;
canvas.addEventListener("pointerdown", (e) => { drag = { x: e.clientX, y: e.clientY }; canvas.setPointerCapture(e.pointerId); });
canvas.addEventListener("pointermove", (e) => {
  if (!drag || !state.info) return;
  state.cx -= (e.clientX - drag.x) / state.zoom;
  state.cy -= (e.clientY - drag.y) / state.zoom;
  drag = { x: e.clientX, y: e.clientY };
  render();
});
canvas.addEventListener("pointerup", () => { drag = null; if (state.info) writeHash(); });
canvas.addEventListener("wheel", (e) => {
  if (!state.info) return;
  e.preventDefault();
  const box = canvas.getBoundingClientRect();
  zoomAt(e.deltaY < 0 ? 1.25 : 0.8, e.clientX - box.left, e.clientY - box.top);
}, { passive: false });
$("zoom-in").addEventListener("click", () => zoomAt(2, canvas.width / 2, canvas.height / 2));
$("zoom-out").addEventListener("click", () => zoomAt(0.5, canvas.width / 2, canvas.height / 2));
$("fit").addEventListener("click", () => open({ id: state.id, lo: state.lo, hi: state.hi, cmap: state.cmap, sel: [] }));
$("lo").addEventListener("change", () => { state.lo = Number($("lo").value); writeHash(); render(); });
$("hi").addEventListener("change", () => { state.hi = Number($("hi").value); writeHash(); render(); });
$("auto").addEventListener("click", async () => { await autoContrast(); controls(); writeHash(); render(); });
$("cmap").addEventListener("change", () => { state.cmap = $("cmap").value; writeHash(); render(); });
$("overlay").addEventListener("change", () => { state.overlay = $("overlay").checked; writeHash(); render(); });
$("show-rois").addEventListener("change", () => { state.showRois = $("show-rois").checked; render(); });
$("token").addEventListener("change", () => {
  token = $("token").value.trim();
  sessionStorage.setItem("tessera-token", token);
  tiles.clear();
  listLevel("", $("tree"));
  if (state.id) open(Object.assign(readHash(), { id: state.id }));
});
window.addEventListener("resize", () => { if (state.info) { resize(); render(); } });
window.addEventListener("hashchange", () => { const wanted = readHash(); if (wanted.id) open(wanted); });

// The page's handle for tests and the console.
window.tesseraViewer = { state, render, open };

const first = readHash();
listLevel("", $("tree"));
if (first.id) open(first); else resize();
