// Graph view: an artifact's graph as SVG, nodes coloured by a per-node value (error or op
// type), grouped into the PyTorch modules they came from, legend, zoom and pan. A click on a
// node selects it (the `selected` trait goes to Python); a click on a closed module opens it
// one level (the `expanded` trait), a click on an open module's title closes it. Constants
// are folded into their consumers (Python lists them on the consumer's click).
// Plain ES module for anywidget: no build step; dagre (vendored) comes in the `_dagre` trait
// and is imported from a Blob URL once per page.

const DAGRE_MAX_NODES = 20; // items drawn with no module open; else the layered layout below (dagre
// needs 70-150 ms for 60 items and 4x that with modules as clusters: too slow to open a module)
const EAGER_LABELS = 300; // above this, labels are added for the items in view only
const SHAPE_LABELS = 400; // tensor shapes on edges up to this many items
const NODE_H = 32;
const GROUP_H = 40;
const ROW_H = 40; // the layered layout's row: the taller of the two
const CHAR_W = 7;
const SVGNS = "http://www.w3.org/2000/svg";
const FOLDED = -1000000000; // a folded constant: drawn as part of its consumer
const MINIMAP_ITEMS = 40; // a minimap from this many items drawn (or a drawing taller than the view)
const MINI_W = 160, MINI_H = 120;

let dagrePromise = null;

function loadDagre(source) {
  if (!dagrePromise) {
    const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
    dagrePromise = import(/* webpackIgnore: true */ url).then((m) => m.default || m);
  }
  return dagrePromise;
}

function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function clip(s, n) { return s.length > n ? s.slice(0, n - 1) + "\u2026" : s; }

// What each node is drawn as, with the groups in `open` expanded (same rule as Python's
// graphmodel.visible_items): the node itself (its index), a closed group g (-1 - g), or
// FOLDED. Returns {rep, items}.
function visibleItems(nodes, groups, open) {
  const closedAt = new Array(groups.length);
  groups.forEach((g, k) => {
    const up = g.parent >= 0 ? closedAt[g.parent] : -1;
    closedAt[k] = up >= 0 ? up : (open.has(g.id) ? -1 : k);
  });
  const rep = new Array(nodes.length);
  const items = [];
  const seen = new Set();
  nodes.forEach((n, i) => {
    if (n.fold >= 0) { rep[i] = FOLDED; return; }
    const r = n.g >= 0 && closedAt[n.g] >= 0 ? -1 - closedAt[n.g] : i;
    rep[i] = r;
    if (!seen.has(r)) { seen.add(r); items.push(r); }
  });
  return { rep, items };
}

// dagre with open groups as clusters (compound graph): a module's nodes stay together.
function dagreLayout(dagre, ids, edges, widths, heights, parents) {
  const g = new dagre.graphlib.Graph({ compound: parents.length > 0 });
  g.setGraph({ rankdir: "TB", nodesep: 14, ranksep: 26, marginx: 12, marginy: 12 });
  g.setDefaultEdgeLabel(() => ({}));
  ids.forEach((id, i) => g.setNode(id, { width: widths[i], height: heights[i] }));
  for (const [c, p] of parents) { if (!g.hasNode(p)) g.setNode(p, { paddingTop: 18 }); }
  for (const [c, p] of parents) g.setParent(c, p);
  edges.forEach(([a, b]) => g.setEdge(ids[a], ids[b]));
  dagre.layout(g);
  const x = ids.map((id) => g.node(id).x);
  const y = ids.map((id) => g.node(id).y);
  const paths = edges.map(([a, b]) => g.edge(ids[a], ids[b]).points.map((p) => [p.x, p.y]));
  const boxes = new Map();
  for (const [, p] of parents) {
    if (boxes.has(p)) continue;
    const n = g.node(p);
    boxes.set(p, { x0: n.x - n.width / 2, y0: n.y - n.height / 2 - 16, x1: n.x + n.width / 2, y1: n.y + n.height / 2 });
  }
  const gg = g.graph();
  return { x, y, paths, width: gg.width, height: gg.height + 16, boxes };
}

// Layered (Sugiyama-style) layout in linear time per sweep, for large graphs: dagre took
// 1.3 s for 500 nodes and overflowed its stack at 2,000 (measured with node, dagre 3.1.3), so
// past DAGRE_MAX_NODES we rank by longest path, route long edges through virtual points,
// order each layer by a few barycentre sweeps and centre the layers. Same look, ~100x faster.
function layeredLayout(nodes, edges, widths, keys = []) {
  const n = nodes.length;
  const succ = Array.from({ length: n }, () => []);
  const pred = Array.from({ length: n }, () => []);
  for (const [a, b] of edges) { succ[a].push(b); pred[b].push(a); }
  const indeg = pred.map((p) => p.length);
  const topo = [];
  const queue = [];
  for (let i = 0; i < n; i++) if (!indeg[i]) queue.push(i);
  for (let q = 0; q < queue.length; q++) {
    const v = queue[q]; topo.push(v);
    for (const w of succ[v]) if (--indeg[w] === 0) queue.push(w);
  }
  if (topo.length < n) { // a cycle: place what is left in file order
    const seen = new Set(topo);
    for (let i = 0; i < n; i++) if (!seen.has(i)) topo.push(i);
  }
  const rank = new Array(n).fill(0);
  const pos = new Array(n);
  topo.forEach((v, k) => { pos[v] = k; });
  for (const v of topo) for (const w of succ[v]) if (pos[w] > pos[v]) rank[w] = Math.max(rank[w], rank[v] + 1);
  // as late as its readers allow: a shape chain sits by the op that uses it, not in the top row
  for (let q = topo.length - 1; q >= 0; q--) {
    const v = topo[q];
    let m = Infinity;
    for (const w of succ[v]) if (pos[w] > pos[v]) m = Math.min(m, rank[w]);
    if (m !== Infinity) rank[v] = Math.max(rank[v], m - 1);
  }
  // items: real nodes 0..n-1, then virtual points of long edges
  const itemRank = rank.slice();
  const itemW = widths.slice();
  const up = Array.from({ length: n }, () => []);
  const down = Array.from({ length: n }, () => []);
  const chainOf = {}; // virtual point -> the edge's source item
  const chains = edges.map(([a, b]) => {
    const chain = [a];
    let prev = a;
    for (let r = rank[a] + 1; r < rank[b]; r++) {
      const id = itemRank.length;
      itemRank.push(r); itemW.push(8); up.push([]); down.push([]); chainOf[id] = a;
      down[prev].push(id); up[id].push(prev); chain.push(id); prev = id;
    }
    if (rank[b] > rank[a]) { down[prev].push(b); up[b].push(prev); }
    chain.push(b);
    return chain;
  });
  const nr = Math.max(0, ...itemRank) + 1;
  const layers = Array.from({ length: nr }, () => []);
  const order = new Array(itemRank.length);
  for (const v of topo) layers[itemRank[v]].push(v);
  for (let id = n; id < itemRank.length; id++) layers[itemRank[id]].push(id);
  layers.forEach((L) => L.forEach((v, k) => { order[v] = k; }));
  const sweep = (range, nbrs) => {
    for (const r of range) {
      const L = layers[r];
      const bc = new Map();
      for (const v of L) {
        const ns = nbrs[v];
        bc.set(v, ns.length ? ns.reduce((s, u) => s + order[u], 0) / ns.length : order[v]);
      }
      L.sort((a, b) => bc.get(a) - bc.get(b) || order[a] - order[b]);
      L.forEach((v, k) => { order[v] = k; });
    }
  };
  const downRanks = [...Array(nr).keys()].slice(1);
  const upRanks = [...Array(nr).keys()].reverse().slice(1);
  for (let it = 0; it < 3; it++) { sweep(downRanks, up); sweep(upRanks, down); }
  // modules stay together: in each row, items sorted by their open modules (outermost first,
  // in the modules' own order), barycentre order within a module; a virtual point of a long
  // edge goes with the edge's source
  const key = (v) => keys[v < n ? v : chainOf[v]] || [];
  const cmp = (a, b) => {
    const ka = key(a), kb = key(b);
    for (let i = 0; i < Math.min(ka.length, kb.length); i++) if (ka[i] !== kb[i]) return ka[i] - kb[i];
    return 0;
  };
  layers.forEach((L) => { L.sort(cmp); L.forEach((v, k) => { order[v] = k; }); });
  const ranksep = keys.some((k) => k && k.length) ? 34 : 24;
  // x: top-down, each item under the mean of the items above it, pushed right of its left
  // neighbour (wider apart where module boxes meet), the row then shifted back onto its wishes
  const xs = new Array(itemRank.length).fill(0);
  const ys = new Array(itemRank.length);
  const sep = (a, b) => {
    const ka = key(a), kb = key(b);
    let c = 0;
    while (c < ka.length && c < kb.length && ka[c] === kb[c]) c++;
    return 14 + 8 * (ka.length - c + kb.length - c);
  };
  // a row placed left to right at its items' wishes (null: right of the left neighbour),
  // pushed apart where needed, then shifted back by the mean miss
  const place = (L, wish) => {
    let right = -Infinity, drift = 0, counted = 0;
    L.forEach((v, k) => {
      const w = wish(v);
      const lo = k ? right + sep(L[k - 1], v) + itemW[v] / 2 : -Infinity;
      xs[v] = Math.max(w === null ? (k ? lo : 0) : w, lo);
      right = xs[v] + itemW[v] / 2;
      if (w !== null) { drift += w - xs[v]; counted++; }
    });
    const d = counted ? drift / counted : 0;
    for (const v of L) xs[v] += d;
  };
  const mean = (ns) => ns.reduce((t, u) => t + xs[u], 0) / ns.length;
  layers.forEach((L, r) => {
    for (const v of L) ys[v] = r * (ROW_H + ranksep) + ROW_H / 2;
    place(L, (v) => (up[v].length ? mean(up[v]) : null));
  });
  // then bottom-up (a chain's start moves over its reader) and top-down again
  for (let r = nr - 2; r >= 0; r--) place(layers[r], (v) => (down[v].length ? mean(down[v]) : xs[v]));
  for (let r = 1; r < nr; r++) place(layers[r], (v) => (up[v].length ? mean(up[v]) : xs[v]));
  let x0 = Infinity, x1 = -Infinity;
  for (let i = 0; i < xs.length; i++) { x0 = Math.min(x0, xs[i] - itemW[i] / 2); x1 = Math.max(x1, xs[i] + itemW[i] / 2); }
  const margin = 12 + 8 * Math.max(0, ...keys.map((k) => (k ? k.length : 0)));
  for (let i = 0; i < xs.length; i++) { xs[i] += margin - x0; ys[i] += 10 + margin; }
  const paths = chains.map((c) => c.map((v) => [xs[v], ys[v]]));
  return { x: xs.slice(0, n), y: ys.slice(0, n), paths, width: x1 - x0 + 2 * margin, height: nr * (ROW_H + ranksep) + 20 + 2 * margin };
}

function legendHTML(legend) {
  if (!legend) return "";
  let h = `<div class="wb-legend-title">${esc(legend.title || "")}</div>`;
  if (legend.kind === "scale") {
    const stops = legend.stops.map((c, i) => `${c} ${(100 * i / (legend.stops.length - 1)).toFixed(0)}%`).join(",");
    h += `<div class="wb-legend-scale"><span class="wb-legend-min">${esc(legend.min_label)}</span>` +
      `<span class="wb-legend-bar" style="background:linear-gradient(to right,${stops})"></span>` +
      `<span class="wb-legend-max">${esc(legend.max_label)}</span></div>`;
    if (legend.mid_label) h += `<div class="wb-legend-mid">${esc(legend.mid_label)} = tolerance (yellow)</div>`;
  }
  for (const [label, color, count] of legend.items || []) {
    h += `<div class="wb-legend-item"><span class="wb-swatch" style="background:${esc(color)}"></span>` +
      `${esc(label)}${count !== null && count !== undefined ? ` <span class="wb-legend-count">${esc(count)}</span>` : ""}</div>`;
  }
  return h;
}

function nodeBox(lines, big) {
  const w = Math.max(...lines.map((t, k) => t.length * (k === 0 && big ? 8 : CHAR_W))) + 20;
  return Math.max(48, Math.min(220, w));
}

function labelSVG(lines, w, h) {
  if (lines.length === 1 || !lines[1]) return `<text x="${(w / 2).toFixed(1)}" y="${(h / 2 + 4).toFixed(1)}">${esc(lines[0])}</text>`;
  return `<text x="${(w / 2).toFixed(1)}" y="${(h / 2 - 2).toFixed(1)}">${esc(lines[0])}</text>` +
    `<text class="wb-sub" x="${(w / 2).toFixed(1)}" y="${(h / 2 + 11).toFixed(1)}">${esc(lines[1])}</text>`;
}

function pathD(points) {
  return "M" + points.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join("L");
}

// the drawing as a standalone SVG file: the same elements, styles inlined, legend at the right
const EXPORT_CSS = `text{font:11px sans-serif;text-anchor:middle;fill:#111}.wb-sub{font-size:9.5px;fill:#333}
.wb-group text{font-size:13px;font-weight:600}.wb-edges path{fill:none;stroke:#9a9a9a;stroke-width:1.2}
.wb-node rect,.wb-group rect{stroke:rgba(0,0,0,.35);stroke-width:1}.wb-group rect{stroke:#50607a;stroke-width:1.5}
.wb-flagged rect{stroke:#7f0000;stroke-width:2.5}.wb-groupbox rect{fill:rgba(80,96,122,.06);stroke:#50607a;stroke-dasharray:4 3}
.wb-groupbox text{text-anchor:start;font-size:11px;font-weight:600;fill:#50607a}.wb-shape{font-size:9px;fill:#666;text-anchor:start}
.wb-legend-svg text{text-anchor:start;font-size:11px}`;

function exportSVG(root, viewport, size, legend, title) {
  const lw = 200;
  const parts = [`<svg xmlns="${SVGNS}" width="${(size.width + lw).toFixed(0)}" height="${(size.height + 30).toFixed(0)}" viewBox="0 -30 ${(size.width + lw).toFixed(0)} ${(size.height + 30).toFixed(0)}">`,
    `<style>${EXPORT_CSS}</style><rect x="0" y="-30" width="100%" height="100%" fill="#fff"/>`,
    `<text x="8" y="-10" style="text-anchor:start;font-weight:600;font-size:13px">${esc(title)}</text>`,
    viewport.innerHTML.replace(/<title>[\s\S]*?<\/title>/g, ""),
    `<g class="wb-legend-svg" transform="translate(${(size.width + 10).toFixed(0)},0)"><text y="0" style="font-weight:600">${esc(legend.title || "")}</text>`];
  let y = 18;
  if (legend.kind === "scale") {
    parts.push(`<defs><linearGradient id="wbramp">${legend.stops.map((c, i) => `<stop offset="${i / (legend.stops.length - 1)}" stop-color="${c}"/>`).join("")}</linearGradient></defs>` +
      `<text y="${y + 9}">${esc(legend.min_label)}</text><rect x="42" y="${y}" width="100" height="10" fill="url(#wbramp)"/><text x="148" y="${y + 9}">${esc(legend.max_label)}</text>`);
    y += 24;
  }
  for (const [label, color, count] of legend.items || []) {
    parts.push(`<rect y="${y}" width="12" height="12" fill="${esc(color)}" stroke="#777"/><text x="18" y="${y + 10}">${esc(label)} ${count ?? ""}</text>`);
    y += 17;
  }
  parts.push("</g></svg>");
  return parts.join("");
}

function download(name, blob) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.appendChild(a);
  a.click();
  setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
}

async function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "wb-graphview";
  root.innerHTML =
    `<div class="wb-graphview-bar"><span class="wb-graphview-title"></span>` +
    `<button class="wb-zoom-in" title="Zoom in">+</button><button class="wb-zoom-out" title="Zoom out">\u2212</button>` +
    `<button class="wb-zoom-fit" title="Fit">fit</button>` +
    `<button class="wb-expand-all" title="Open every module">open all</button>` +
    `<button class="wb-collapse-all" title="Close every module">close all</button>` +
    `<button class="wb-save-svg" title="Save the graph as drawn (SVG)">SVG</button>` +
    `<button class="wb-save-png" title="Save the graph as drawn (PNG, 2x)">PNG</button>` +
    `<input class="wb-find" type="search" data-lm-suppress-shortcuts="true" placeholder="find node" title="a node name or op type; Enter selects the next match">` +
    `</div>` +
    `<div class="wb-graphview-body"><span class="wb-graphview-status"></span><svg class="wb-graph" xmlns="${SVGNS}"><g class="wb-viewport"></g></svg>` +
    `<div class="wb-minimap" title="overview: click or drag to move the view"><canvas></canvas><div class="wb-minimap-view"></div></div>` +
    `<div class="wb-legend"></div></div>`;
  el.appendChild(root);
  const svg = root.querySelector("svg.wb-graph");
  const viewport = root.querySelector("g.wb-viewport");
  const status = root.querySelector(".wb-graphview-status");
  let view = { k: 1, x: 0, y: 0 };
  let size = { width: 1, height: 1 };
  let fitPending = true; // fit again once the view has a size (drawn in a hidden tab)
  let userMoved = false;
  // Large drawings get their labels lazily, for the items in view: laying out 2,000 SVG
  // texts is most of the first paint. `lazy` holds what is needed to add them as the view moves.
  let lazy = null;
  let positions = null; // item centres of the last layout, and the item of each node
  let labelPending = false;
  let open = new Set(model.get("expanded") || []);
  const labelVisible = (all) => {
    labelPending = false;
    if (!lazy || (view.k < 0.55 && !all)) return;
    const b = svg.getBoundingClientRect();
    const m = 200 / view.k;
    const x0 = -view.x / view.k - m, y0 = -view.y / view.k - m;
    const x1 = x0 + (b.width || 800) / view.k + 2 * m, y1 = y0 + (b.height || 520) / view.k + 2 * m;
    const { xs, ys, widths, heights, labels, done, els } = lazy;
    for (let i = 0; i < xs.length; i++) {
      if (done[i] || (!all && (xs[i] < x0 || xs[i] > x1 || ys[i] < y0 || ys[i] > y1))) continue;
      done[i] = 1;
      els[i].insertAdjacentHTML("beforeend", labelSVG(labels[i], widths[i], heights[i]));
    }
  };
  // the minimap: every item drawn as a small box, the part in view as a rectangle; a click or
  // a drag there moves the view. x and y are scaled apart (up to 6x): a long chain of ops
  // still fills the overview instead of being a one-pixel line
  const mini = root.querySelector(".wb-minimap");
  const miniView = mini.querySelector(".wb-minimap-view");
  let miniData = null; // {items, x, y, widths, heights, s, ox, oy} of the last drawing
  const paintMini = () => {
    if (!miniData) return;
    const c = mini.querySelector("canvas");
    const dpr = window.devicePixelRatio || 1;
    c.width = MINI_W * dpr; c.height = MINI_H * dpr;
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, MINI_W, MINI_H);
    const colors = model.get("colors") || [], gcolors = model.get("group_colors") || [];
    const { items, x, y, widths: w, heights: h, sx, sy, ox, oy } = miniData;
    items.forEach((r, k) => {
      ctx.fillStyle = r >= 0 ? colors[r] || "#dddddd" : gcolors[-1 - r] || "#e3e9f2";
      ctx.fillRect(ox + (x[k] - w[k] / 2) * sx, oy + (y[k] - h[k] / 2) * sy, Math.max(1, w[k] * sx), Math.max(1, h[k] * sy));
    });
    moveMini();
  };
  const moveMini = () => {
    if (!miniData) return;
    const b = svg.getBoundingClientRect();
    const { sx, sy, ox, oy } = miniData;
    const left = ox + (-view.x / view.k) * sx, top = oy + (-view.y / view.k) * sy;
    Object.assign(miniView.style, { left: `${left.toFixed(1)}px`, top: `${top.toFixed(1)}px`,
      width: `${Math.max(4, (b.width || 600) / view.k * sx).toFixed(1)}px`,
      height: `${Math.max(4, (b.height || 500) / view.k * sy).toFixed(1)}px` });
  };
  let miniArgs = null; // the last drawing's, to decide again once the view has its size
  const showMini = (items, layout, widths, heights) => {
    miniArgs = [items, layout, widths, heights];
    const b = svg.getBoundingClientRect();
    const show = items.length >= MINIMAP_ITEMS || (b.height > 0 && size.height * view.k > b.height * 1.2);
    mini.style.display = show ? "block" : "none";
    root.dataset.minimap = show ? "1" : "0";
    if (!show) { miniData = null; return; }
    const s = Math.min(MINI_W / size.width, MINI_H / size.height);
    const sx = Math.min(MINI_W / size.width, 6 * s), sy = Math.min(MINI_H / size.height, 6 * s);
    miniData = { items, x: layout.x, y: layout.y, widths, heights, sx, sy,
      ox: (MINI_W - size.width * sx) / 2, oy: (MINI_H - size.height * sy) / 2 };
    paintMini();
  };
  let miniDrag = false;
  const miniGo = (e) => {
    const mb = mini.getBoundingClientRect(), b = svg.getBoundingClientRect();
    const { sx, sy, ox, oy } = miniData;
    const clamp = (v, hi) => Math.max(0, Math.min(hi, v)); // a point of the drawing
    const px = clamp((e.clientX - mb.left - ox) / sx, size.width);
    const py = clamp((e.clientY - mb.top - oy) / sy, size.height);
    view.x = (b.width || 600) / 2 - px * view.k;
    view.y = (b.height || 500) / 2 - py * view.k;
    userMoved = true;
    apply();
  };
  mini.addEventListener("pointerdown", (e) => {
    if (!miniData || e.button !== 0) return;
    e.stopPropagation(); e.preventDefault();
    miniDrag = true;
    if (mini.setPointerCapture) mini.setPointerCapture(e.pointerId);
    miniGo(e);
  });
  mini.addEventListener("pointermove", (e) => { if (miniDrag && miniData) miniGo(e); });
  mini.addEventListener("pointerup", () => { miniDrag = false; });
  mini.addEventListener("wheel", (e) => e.stopPropagation());

  const apply = () => {
    viewport.setAttribute("transform", `translate(${view.x.toFixed(1)},${view.y.toFixed(1)}) scale(${view.k.toFixed(4)})`);
    root.dataset.zoom = view.k.toFixed(4);
    moveMini();
    // labels below ~6 px are unreadable: hide them (SVG text is most of the paint cost)
    svg.classList.toggle("wb-far", view.k < 0.55);
    if (lazy && !labelPending) { labelPending = true; requestAnimationFrame(() => labelVisible(false)); }
  };
  const fit = () => {
    const box = svg.getBoundingClientRect();
    if (!box.width || !box.height) { fitPending = true; return; } // hidden: fit when shown
    fitPending = false;
    const W = box.width, H = box.height;
    // fit the width, but keep labels readable on long graphs: scroll (pan) down instead
    view.k = Math.min(1.5, W / size.width, Math.max(H / size.height, 0.8));
    view.x = (W - size.width * view.k) / 2;
    view.y = 8;
    apply();
    if (miniArgs) showMini(...miniArgs); // drawn before the view had a size (a hidden tab)
  };
  // a graph drawn in a hidden tab (zero size) is fitted when its tab opens; a resize refits
  // until the user has zoomed or panned
  const ro = new ResizeObserver(() => {
    const b = svg.getBoundingClientRect();
    if (b.width && b.height && (fitPending || !userMoved)) { fit(); root.dataset.fittedWidth = b.width.toFixed(0); }
  });
  ro.observe(svg);
  const zoomAt = (factor, cx, cy) => {
    userMoved = true;
    const k = Math.max(0.02, Math.min(8, view.k * factor));
    view.x = cx - (cx - view.x) * (k / view.k);
    view.y = cy - (cy - view.y) * (k / view.k);
    view.k = k;
    apply();
  };
  const center = () => { const b = svg.getBoundingClientRect(); return [b.width / 2, b.height / 2]; };
  root.querySelector(".wb-zoom-in").onclick = () => zoomAt(1.25, ...center());
  root.querySelector(".wb-zoom-out").onclick = () => zoomAt(0.8, ...center());
  root.querySelector(".wb-zoom-fit").onclick = () => { userMoved = false; fit(); };
  svg.addEventListener("wheel", (e) => {
    // ctrl/cmd + wheel (and pinch) zooms at the pointer; a plain wheel pans the graph
    e.preventDefault();
    const b = svg.getBoundingClientRect();
    if (e.ctrlKey || e.metaKey) zoomAt(Math.exp(-e.deltaY * 0.002), e.clientX - b.left, e.clientY - b.top);
    else { userMoved = true; view.x -= e.shiftKey ? e.deltaY : e.deltaX; view.y -= e.shiftKey ? 0 : e.deltaY; apply(); }
  }, { passive: false });
  let drag = null;
  svg.addEventListener("pointerdown", (e) => {
    if (e.button !== 0) return;
    drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y, moved: false };
  });
  window.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    if (drag.moved) { userMoved = true; view.x = drag.vx + dx; view.y = drag.vy + dy; apply(); svg.classList.add("wb-panning"); }
  });
  window.addEventListener("pointerup", () => {
    if (drag && drag.moved) svg.dataset.justPanned = "1";
    drag = null; svg.classList.remove("wb-panning");
  });
  const setOpen = (next, focus) => {
    open = next;
    const groups = (model.get("graph") || {}).groups || [];
    model.set("expanded", groups.filter((g) => open.has(g.id)).map((g) => g.id));
    model.save_changes();
    draw("expand", focus);
  };
  svg.addEventListener("click", (e) => {
    if (svg.dataset.justPanned) { delete svg.dataset.justPanned; return; }
    const box = e.target.closest(".wb-groupbox-title");
    if (box) { const next = new Set(open); next.delete(box.parentNode.dataset.module); setOpen(next, null); return; }
    const grp = e.target.closest(".wb-group");
    if (grp) {
      model.set("clicked_group", `${grp.dataset.module}|${Date.now()}`); // a LinkedView selects it
      const next = new Set(open); next.add(grp.dataset.module); setOpen(next, grp.dataset.module); return;
    }
    const g = e.target.closest(".wb-node");
    if (!g) return;
    model.set("selected", g.dataset.id);
    model.save_changes();
  });
  root.querySelector(".wb-expand-all").onclick = () => setOpen(new Set(((model.get("graph") || {}).groups || []).map((g) => g.id)), null);
  root.querySelector(".wb-collapse-all").onclick = () => setOpen(new Set(), null);
  const saveName = (ext) => (model.get("title") || "graph").split(" ")[0].replace(/[^\w.-]+/g, "_") + "." + ext;
  const svgText = () => { labelVisible(true); return exportSVG(root, viewport, size, model.get("legend") || {}, model.get("title") || ""); };
  root.querySelector(".wb-save-svg").onclick = () => download(saveName("svg"), new Blob([svgText()], { type: "image/svg+xml" }));
  root.querySelector(".wb-save-png").onclick = () => {
    const text = svgText();
    const img = new Image();
    img.onload = () => {
      const c = document.createElement("canvas");
      c.width = img.width * 2; c.height = img.height * 2;
      const ctx = c.getContext("2d"); ctx.scale(2, 2); ctx.drawImage(img, 0, 0);
      c.toBlob((b) => download(saveName("png"), b), "image/png");
    };
    img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(text);
  };

  const highlight = () => {
    const sel = model.get("selected");
    viewport.querySelectorAll(".wb-node.wb-selected").forEach((g) => g.classList.remove("wb-selected"));
    if (sel) {
      const g = viewport.querySelector(`.wb-node[data-id="${CSS.escape(sel)}"]`);
      if (g) g.classList.add("wb-selected");
    }
  };

  // lit nodes (`highlighted`, a module selected in a LinkedView): outlined, a closed module
  // holding one lit too, an open module's box lit when all of it is. Returns the lit items.
  const paintLit = () => {
    viewport.querySelectorAll(".wb-lit").forEach((e) => e.classList.remove("wb-lit"));
    const lit = new Set(model.get("highlighted") || []);
    root.dataset.lit = "0";
    if (!lit.size || !positions) return [];
    const graph = model.get("graph") || { nodes: [] };
    const nodes = graph.nodes, groups = graph.groups || [];
    const total = new Array(groups.length).fill(0), hit = new Array(groups.length).fill(0);
    const slots = new Set();
    nodes.forEach((n, i) => {
      if (n.fold >= 0) return;
      const on = lit.has(n.id);
      for (let g = n.g; g >= 0; g = groups[g].parent) { total[g]++; if (on) hit[g]++; }
      if (on) slots.add(positions.slot.get(positions.rep[i]));
    });
    let count = 0;
    viewport.querySelectorAll(".wb-node, .wb-group, .wb-groupbox").forEach((e) => {
      const k = Number(e.dataset.group);
      const on = e.classList.contains("wb-node") ? lit.has(e.dataset.id)
        : e.classList.contains("wb-group") ? hit[k] > 0 : hit[k] > 0 && hit[k] === total[k];
      if (on) { e.classList.add("wb-lit"); count++; }
    });
    root.dataset.lit = String(count);
    return [...slots];
  };
  // pan (and zoom out if they do not fit) so the lit items are in view
  const focusLit = (slots) => {
    const b = svg.getBoundingClientRect();
    if (!slots.length || !b.width || !b.height) return;
    let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
    for (const s of slots) {
      const { x, y, widths: w, heights: h } = positions;
      x0 = Math.min(x0, x[s] - w[s] / 2); x1 = Math.max(x1, x[s] + w[s] / 2);
      y0 = Math.min(y0, y[s] - h[s] / 2); y1 = Math.max(y1, y[s] + h[s] / 2);
    }
    const fits = Math.min((b.width - 40) / (x1 - x0), (b.height - 40) / (y1 - y0));
    if (fits < view.k) view.k = Math.max(0.1, fits);
    view.x = b.width / 2 - ((x0 + x1) / 2) * view.k;
    view.y = b.height / 2 - ((y0 + y1) / 2) * view.k;
    userMoved = true; fitPending = false;
    apply();
  };

  let drawing = Promise.resolve();
  const draw = (why = "draw", focus = null) => {
    drawing = drawing.then(() => drawNow(why, focus)).catch((e) => console.error("graph view:", e));
    return drawing;
  };
  const drawNow = async (why = "draw", focus = null) => {
    miniArgs = null; // a fit during this draw must not repaint the last drawing's minimap
    const t0 = performance.now();
    const graph = model.get("graph") || { nodes: [], edges: [] };
    const colors = model.get("colors") || [];
    const strokes = model.get("strokes") || [];
    const titles = model.get("tooltips") || [];
    const gcolors = model.get("group_colors") || [];
    const gstrokes = model.get("group_strokes") || [];
    const gtitles = model.get("group_tooltips") || [];
    root.querySelector(".wb-graphview-title").textContent = model.get("title") || "";
    root.querySelector(".wb-legend").innerHTML = legendHTML(model.get("legend"));
    const nodes = graph.nodes, groups = graph.groups || [], shapes = graph.shapes || [];
    const { rep, items } = visibleItems(nodes, groups, open);
    const slot = new Map(items.map((r, k) => [r, k]));
    // edges between drawn items, once each, with the shape of the first tensor they carry
    const seen = new Map();
    graph.edges.forEach(([a, b], e) => {
      const ra = rep[a], rb = rep[b];
      if (ra === FOLDED || rb === FOLDED || ra === rb) return;
      const key = slot.get(ra) * 1048576 + slot.get(rb);
      if (!seen.has(key)) seen.set(key, [slot.get(ra), slot.get(rb), shapes[e] || ""]);
    });
    const edges = [...seen.values()];
    const labels = items.map((r) => r >= 0 ? [nodes[r].op, nodes[r].label || ""]
      : [clip(groups[-1 - r].label, 28), `${groups[-1 - r].size} nodes`]);
    const widths = items.map((r, k) => nodeBox(labels[k], r < 0));
    const heights = items.map((r) => r < 0 ? GROUP_H : NODE_H);
    // the innermost open group around each item (and around each open group): clusters
    const innerOpen = (g) => { while (g >= 0 && !open.has(groups[g].id)) g = groups[g].parent; return g; };
    const parents = [];
    const ids = items.map((r) => r >= 0 ? "n" + r : "c" + (-1 - r));
    items.forEach((r, k) => {
      const g = r >= 0 ? innerOpen(nodes[r].g) : innerOpen(groups[-1 - r].parent);
      if (g >= 0) parents.push([ids[k], "g" + g]);
    });
    const openUsed = new Set(parents.map(([, p]) => p));
    for (const p of [...openUsed]) {
      let g = Number(p.slice(1));
      while (g >= 0) {
        const up = innerOpen(groups[g].parent);
        if (up >= 0) parents.push(["g" + g, "g" + up]);
        openUsed.add("g" + g);
        g = up;
      }
    }
    let layout, engine;
    // each item's open modules, outermost first (group indices: parents first, file order)
    const keys = items.map((r) => {
      const chain = [];
      for (let g = r >= 0 ? innerOpen(nodes[r].g) : innerOpen(groups[-1 - r].parent); g >= 0; g = innerOpen(groups[g].parent)) chain.push(g);
      return chain.reverse();
    });
    if (items.length <= DAGRE_MAX_NODES && !parents.length) {
      const dagre = await loadDagre(model.get("_dagre"));
      layout = dagreLayout(dagre, ids, edges, widths, heights, []); engine = "dagre";
    } else {
      layout = layeredLayout(ids, edges, widths, keys); engine = "layered";
      // open groups as boxes around their items (innermost first, so outer ones hold inner)
      const boxes = new Map();
      items.forEach((r, k) => {
        let pad = 6;
        for (let j = keys[k].length - 1; j >= 0; j--, pad += 8) {
          const p = "g" + keys[k][j];
          const b = boxes.get(p) || { x0: Infinity, y0: Infinity, x1: -Infinity, y1: -Infinity };
          boxes.set(p, { x0: Math.min(b.x0, layout.x[k] - widths[k] / 2 - pad), y0: Math.min(b.y0, layout.y[k] - heights[k] / 2 - pad - 14),
            x1: Math.max(b.x1, layout.x[k] + widths[k] / 2 + pad), y1: Math.max(b.y1, layout.y[k] + heights[k] / 2 + pad) });
        }
      });
      layout.boxes = boxes;
    }
    const t1 = performance.now();
    const parts = ['<g class="wb-boxes">'];
    const boxList = [...layout.boxes.entries()].map(([p, b]) => [Number(p.slice(1)), b]).sort((a, b) => a[0] - b[0]);
    for (const [g, b] of boxList) {
      parts.push(`<g class="wb-groupbox" data-module="${esc(groups[g].id)}" data-group="${g}"><rect x="${b.x0.toFixed(1)}" y="${b.y0.toFixed(1)}" width="${(b.x1 - b.x0).toFixed(1)}" height="${(b.y1 - b.y0).toFixed(1)}" rx="6"/>` +
        `<text class="wb-groupbox-title" x="${(b.x0 + 6).toFixed(1)}" y="${(b.y0 + 12).toFixed(1)}"><title>close module ${esc(groups[g].id)}</title>\u25be ${esc(clip(groups[g].label, 40))}</text></g>`);
    }
    parts.push('</g><g class="wb-edges">');
    for (const p of layout.paths) parts.push(`<path d="${pathD(p)}"/>`);
    parts.push("</g>");
    if (items.length <= SHAPE_LABELS) {
      parts.push('<g class="wb-shapes">');
      layout.paths.forEach((p, e) => {
        const s = edges[e][2];
        if (!s || p.length < 2) return;
        const m = p[Math.floor((p.length - 1) / 2)], n = p[Math.floor((p.length - 1) / 2) + 1] || m;
        parts.push(`<text class="wb-shape" x="${((m[0] + n[0]) / 2 + 4).toFixed(1)}" y="${((m[1] + n[1]) / 2 + 3).toFixed(1)}">${esc(s)}</text>`);
      });
      parts.push("</g>");
    }
    parts.push('<g class="wb-nodes">');
    const eager = items.length <= EAGER_LABELS;
    items.forEach((r, k) => {
      const w = widths[k], h = heights[k], x = layout.x[k] - w / 2, y = layout.y[k] - h / 2;
      const tr = `transform="translate(${x.toFixed(1)},${y.toFixed(1)})"`;
      if (r >= 0) {
        const nd = nodes[r];
        parts.push(`<g class="wb-node${strokes[r] ? " wb-flagged" : ""}" data-id="${esc(nd.id)}" data-index="${r}" data-op="${esc(nd.op)}" ${tr}>` +
          `<title>${esc(titles[r] || nd.id)}</title>` +
          `<rect width="${w}" height="${h}" rx="4" fill="${esc(colors[r] || "#dddddd")}"/>` +
          (eager ? labelSVG(labels[k], w, h) : "") + "</g>");
      } else {
        const g = -1 - r;
        parts.push(`<g class="wb-group${gstrokes[g] ? " wb-flagged" : ""}" data-module="${esc(groups[g].id)}" data-group="${g}" ${tr}>` +
          `<title>${esc(gtitles[g] || groups[g].id)}</title>` +
          `<rect width="${w}" height="${h}" rx="9" fill="${esc(gcolors[g] || "#e3e9f2")}"/>` +
          (eager ? labelSVG(labels[k], w, h) : "") + "</g>");
      }
    });
    parts.push("</g>");
    viewport.innerHTML = parts.join("");
    const els = viewport.querySelectorAll(".wb-nodes > g");
    positions = { x: layout.x, y: layout.y, slot, rep, widths, heights };
    lazy = eager ? null : { xs: layout.x, ys: layout.y, widths, heights, labels, done: new Uint8Array(items.length), els };
    size = { width: layout.width, height: layout.height };
    const fb = focus !== null ? layout.boxes.get("g" + groups.findIndex((g) => g.id === focus)) : null;
    if (fb && !fitPending) { // keep the zoom; show the opened module from its top
      const b = svg.getBoundingClientRect();
      view.x = b.width / 2 - ((fb.x0 + fb.x1) / 2) * view.k;
      view.y = 24 - fb.y0 * view.k;
      if ((fb.x1 - fb.x0) * view.k > b.width) view.x = 8 - fb.x0 * view.k;
      apply();
    } else if (why !== "expand" || fitPending) { userMoved = false; fit(); } else apply();
    labelVisible(false);
    highlight();
    showMini(items, layout, widths, heights);
    const litSlots = paintLit();
    if (why === "first" && litSlots.length) focusLit(litSlots); // lit before it was shown
    void svg.getBoundingClientRect(); // force style and layout now, so the time includes them
    const t2 = performance.now();
    await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
    const t3 = performance.now();
    const ms = { layout: t1 - t0, dom: t2 - t1, paint: t3 - t2, total: t3 - t0 };
    root.dataset.engine = engine;
    root.dataset.renderMs = ms.total.toFixed(1);
    root.dataset.layoutMs = ms.layout.toFixed(1);
    root.dataset.domMs = ms.dom.toFixed(1);
    root.dataset.paintMs = ms.paint.toFixed(1);
    root.dataset.nodes = String(nodes.length);
    root.dataset.items = String(items.length);
    root.dataset.lastDraw = why;
    if (why === "expand") root.dataset.expandMs = ms.total.toFixed(1);
    else root.dataset.firstMs = root.dataset.firstMs || ms.total.toFixed(1);
    root.dataset.draws = String(Number(root.dataset.draws || 0) + 1);
    root.classList.add("wb-drawn");
    const closed = items.filter((r) => r < 0).length;
    const folded = nodes.filter((n) => n.fold >= 0).length;
    status.textContent = `${nodes.length - folded} nodes${folded ? ` (+${folded} folded constants)` : ""} \u00b7 ${items.length} drawn${closed ? ` (${closed} modules closed)` : ""} \u00b7 ${engine} \u00b7 ${ms.total.toFixed(0)} ms`;
    model.set("render_ms", { ...ms, items: items.length, why });
    model.save_changes();
  };
  // new colours (another color_by or metric): repaint the items and the legend, keep layout and view
  const recolor = () => {
    const colors = model.get("colors") || [];
    const strokes = model.get("strokes") || [];
    const titles = model.get("tooltips") || [];
    const gcolors = model.get("group_colors") || [];
    const gstrokes = model.get("group_strokes") || [];
    const gtitles = model.get("group_tooltips") || [];
    viewport.querySelectorAll(".wb-node").forEach((g) => {
      const i = Number(g.dataset.index);
      g.querySelector("rect").setAttribute("fill", colors[i] || "#dddddd");
      g.classList.toggle("wb-flagged", !!strokes[i]);
      g.querySelector("title").textContent = titles[i] || g.dataset.id;
    });
    viewport.querySelectorAll(".wb-group").forEach((g) => {
      const k = Number(g.dataset.group);
      g.querySelector("rect").setAttribute("fill", gcolors[k] || "#e3e9f2");
      g.classList.toggle("wb-flagged", !!gstrokes[k]);
      g.querySelector("title").textContent = gtitles[k] || g.dataset.module;
    });
    root.querySelector(".wb-legend").innerHTML = legendHTML(model.get("legend"));
    paintMini();
  };
  // find: the next node whose name or op type contains the text; open its modules, centre on it
  const find = root.querySelector(".wb-find");
  let lastFind = -1;
  find.addEventListener("keydown", async (e) => {
    if (e.key !== "Enter" || !positions) return;
    e.stopPropagation();
    const q = find.value.trim().toLowerCase();
    const graph = model.get("graph") || { nodes: [] };
    const nodes = graph.nodes, groups = graph.groups || [];
    if (!q) return;
    for (let k = 1; k <= nodes.length; k++) {
      const i = (lastFind + k) % nodes.length;
      if (nodes[i].fold < 0 && (nodes[i].id.toLowerCase().includes(q) || nodes[i].op.toLowerCase().includes(q))) {
        lastFind = i;
        if (positions.rep[i] !== i) { // inside a closed module: open the modules around it
          const next = new Set(open);
          for (let g = nodes[i].g; g >= 0; g = groups[g].parent) next.add(groups[g].id);
          open = next;
          model.set("expanded", groups.filter((g) => open.has(g.id)).map((g) => g.id));
          await draw("expand", null);
        }
        const s = positions.slot.get(i);
        const b = svg.getBoundingClientRect();
        view.k = Math.max(view.k, 0.8);
        view.x = (b.width || 600) / 2 - positions.x[s] * view.k;
        view.y = (b.height || 500) / 2 - positions.y[s] * view.k;
        userMoved = true;
        apply();
        model.set("selected", nodes[i].id);
        model.save_changes();
        find.classList.remove("wb-not-found");
        return;
      }
    }
    find.classList.add("wb-not-found");
  });
  find.addEventListener("keyup", (e) => e.stopPropagation()); // keep JupyterLab shortcuts out
  model.on("change:graph", () => draw("draw"));
  model.on("change:expanded", () => {
    const next = new Set(model.get("expanded") || []);
    if (next.size === open.size && [...next].every((g) => open.has(g))) return; // our own change
    open = next;
    draw("expand", null);
  });
  model.on("change:colors", recolor);
  model.on("change:group_colors", recolor);
  model.on("change:selected", highlight);
  // after any redraw the same change queued (the modules opened to reveal them)
  model.on("change:highlighted", () => setTimeout(async () => { await drawing; focusLit(paintLit()); }, 0));
  await draw("first");
}

export default { render };
