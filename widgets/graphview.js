// Graph view: an artifact's graph as SVG, nodes coloured by a per-node value (error or op
// type), legend, zoom and pan, click a node to select it (the `selected` trait goes to Python).
// Plain ES module for anywidget: no build step; dagre (vendored) comes in the `_dagre` trait
// and is imported from a Blob URL once per page.

const DAGRE_MAX_NODES = 200; // above this, the layered layout below (see layeredLayout)
const EAGER_LABELS = 300; // above this, labels are added for the nodes in view only
const NODE_H = 26;
const CHAR_W = 7;
const SVGNS = "http://www.w3.org/2000/svg";

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

function nodeWidth(label) {
  return Math.max(44, Math.min(180, label.length * CHAR_W + 18));
}

function dagreLayout(dagre, nodes, edges, widths) {
  const g = new dagre.graphlib.Graph();
  g.setGraph({ rankdir: "TB", nodesep: 14, ranksep: 24, marginx: 10, marginy: 10 });
  g.setDefaultEdgeLabel(() => ({}));
  nodes.forEach((n, i) => g.setNode(String(i), { width: widths[i], height: NODE_H }));
  edges.forEach(([a, b]) => g.setEdge(String(a), String(b)));
  dagre.layout(g);
  const x = nodes.map((_, i) => g.node(String(i)).x);
  const y = nodes.map((_, i) => g.node(String(i)).y);
  const paths = edges.map(([a, b]) => g.edge(String(a), String(b)).points.map((p) => [p.x, p.y]));
  const gg = g.graph();
  return { x, y, paths, width: gg.width, height: gg.height };
}

// Layered (Sugiyama-style) layout in linear time per sweep, for large graphs: dagre took
// 1.3 s for 500 nodes and overflowed its stack at 2,000 (measured with node, dagre 3.1.3), so
// past DAGRE_MAX_NODES we rank by longest path, route long edges through virtual points,
// order each layer by a few barycentre sweeps and centre the layers. Same look, ~100x faster.
function layeredLayout(nodes, edges, widths) {
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
  // items: real nodes 0..n-1, then virtual points of long edges
  const itemRank = rank.slice();
  const itemW = widths.slice();
  const up = Array.from({ length: n }, () => []);
  const down = Array.from({ length: n }, () => []);
  const chains = edges.map(([a, b]) => {
    const chain = [a];
    let prev = a;
    for (let r = rank[a] + 1; r < rank[b]; r++) {
      const id = itemRank.length;
      itemRank.push(r); itemW.push(8); up.push([]); down.push([]);
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
  const gap = 14, ranksep = 24;
  const xs = new Array(itemRank.length);
  const ys = new Array(itemRank.length);
  let width = 0;
  layers.forEach((L, r) => {
    const total = L.reduce((s, v) => s + itemW[v], 0) + gap * Math.max(0, L.length - 1);
    width = Math.max(width, total);
    let cx = -total / 2;
    for (const v of L) { xs[v] = cx + itemW[v] / 2; cx += itemW[v] + gap; ys[v] = r * (NODE_H + ranksep) + NODE_H / 2; }
  });
  const shift = width / 2 + 10;
  for (let i = 0; i < xs.length; i++) { xs[i] += shift; ys[i] += 10; }
  const paths = chains.map((c) => c.map((v) => [xs[v], ys[v]]));
  return { x: xs.slice(0, n), y: ys.slice(0, n), paths, width: width + 20, height: nr * (NODE_H + ranksep) + 20 };
}

function labelSVG(label, w) {
  const text = label.length > 24 ? label.slice(0, 23) + "\u2026" : label;
  return `<text x="${(w / 2).toFixed(1)}" y="17">${esc(text)}</text>`;
}

function pathD(points) {
  return "M" + points.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join("L");
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

async function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "wb-graphview";
  root.innerHTML =
    `<div class="wb-graphview-bar"><span class="wb-graphview-title"></span>` +
    `<button class="wb-zoom-in" title="Zoom in">+</button><button class="wb-zoom-out" title="Zoom out">\u2212</button>` +
    `<button class="wb-zoom-fit" title="Fit">fit</button>` +
    `<input class="wb-find" type="search" data-lm-suppress-shortcuts="true" placeholder="find node" title="a node name or op type; Enter selects the next match">` +
    `</div>` +
    `<div class="wb-graphview-body"><span class="wb-graphview-status"></span><svg class="wb-graph" xmlns="${SVGNS}"><g class="wb-viewport"></g></svg>` +
    `<div class="wb-legend"></div></div>`;
  el.appendChild(root);
  const svg = root.querySelector("svg.wb-graph");
  const viewport = root.querySelector("g.wb-viewport");
  const status = root.querySelector(".wb-graphview-status");
  let view = { k: 1, x: 0, y: 0 };
  let size = { width: 1, height: 1 };
  // Large graphs get their labels lazily, for the nodes in view: laying out 2,000 SVG texts
  // is most of the first paint. `lazy` holds what is needed to add them as the view moves.
  let lazy = null;
  let positions = null; // node centres of the last layout (find centres on them)
  let labelPending = false;
  const labelVisible = () => {
    labelPending = false;
    if (!lazy || view.k < 0.55) return;
    const b = svg.getBoundingClientRect();
    const m = 200 / view.k;
    const x0 = -view.x / view.k - m, y0 = -view.y / view.k - m;
    const x1 = x0 + (b.width || 800) / view.k + 2 * m, y1 = y0 + (b.height || 520) / view.k + 2 * m;
    const { xs, ys, widths, labels, done, els } = lazy;
    for (let i = 0; i < xs.length; i++) {
      if (done[i] || xs[i] < x0 || xs[i] > x1 || ys[i] < y0 || ys[i] > y1) continue;
      done[i] = 1;
      els[i].insertAdjacentHTML("beforeend", labelSVG(labels[i], widths[i]));
    }
  };
  const apply = () => {
    viewport.setAttribute("transform", `translate(${view.x.toFixed(1)},${view.y.toFixed(1)}) scale(${view.k.toFixed(4)})`);
    root.dataset.zoom = view.k.toFixed(4);
    // labels below ~6 px are unreadable: hide them (SVG text is most of the paint cost)
    svg.classList.toggle("wb-far", view.k < 0.55);
    if (lazy && !labelPending) { labelPending = true; requestAnimationFrame(labelVisible); }
  };
  const fit = () => {
    const box = svg.getBoundingClientRect();
    const W = box.width || 600, H = box.height || 500;
    // fit the width, but keep labels readable on long graphs: scroll (pan) down instead
    view.k = Math.min(1.5, W / size.width, Math.max(H / size.height, 0.6));
    view.x = (W - size.width * view.k) / 2;
    view.y = 8;
    apply();
  };
  const zoomAt = (factor, cx, cy) => {
    const k = Math.max(0.02, Math.min(8, view.k * factor));
    view.x = cx - (cx - view.x) * (k / view.k);
    view.y = cy - (cy - view.y) * (k / view.k);
    view.k = k;
    apply();
  };
  const center = () => { const b = svg.getBoundingClientRect(); return [b.width / 2, b.height / 2]; };
  root.querySelector(".wb-zoom-in").onclick = () => zoomAt(1.25, ...center());
  root.querySelector(".wb-zoom-out").onclick = () => zoomAt(0.8, ...center());
  root.querySelector(".wb-zoom-fit").onclick = fit;
  svg.addEventListener("wheel", (e) => {
    // ctrl/cmd + wheel (and pinch) zooms at the pointer; a plain wheel pans the graph
    e.preventDefault();
    const b = svg.getBoundingClientRect();
    if (e.ctrlKey || e.metaKey) zoomAt(Math.exp(-e.deltaY * 0.002), e.clientX - b.left, e.clientY - b.top);
    else { view.x -= e.shiftKey ? e.deltaY : e.deltaX; view.y -= e.shiftKey ? 0 : e.deltaY; apply(); }
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
    if (drag.moved) { view.x = drag.vx + dx; view.y = drag.vy + dy; apply(); svg.classList.add("wb-panning"); }
  });
  window.addEventListener("pointerup", () => {
    if (drag && drag.moved) svg.dataset.justPanned = "1";
    drag = null; svg.classList.remove("wb-panning");
  });
  svg.addEventListener("click", (e) => {
    if (svg.dataset.justPanned) { delete svg.dataset.justPanned; return; }
    const g = e.target.closest(".wb-node");
    if (!g) return;
    model.set("selected", g.dataset.id);
    model.save_changes();
  });

  const highlight = () => {
    const sel = model.get("selected");
    viewport.querySelectorAll(".wb-node.wb-selected").forEach((g) => g.classList.remove("wb-selected"));
    if (sel) {
      const g = viewport.querySelector(`.wb-node[data-id="${CSS.escape(sel)}"]`);
      if (g) g.classList.add("wb-selected");
    }
  };

  const draw = async () => {
    const t0 = performance.now();
    const graph = model.get("graph") || { nodes: [], edges: [] };
    const colors = model.get("colors") || [];
    const strokes = model.get("strokes") || [];
    const titles = model.get("tooltips") || [];
    root.querySelector(".wb-graphview-title").textContent = model.get("title") || "";
    root.querySelector(".wb-legend").innerHTML = legendHTML(model.get("legend"));
    const nodes = graph.nodes, edges = graph.edges;
    const labels = nodes.map((nd) => nd.op);
    const widths = labels.map(nodeWidth);
    let layout, engine;
    if (nodes.length <= DAGRE_MAX_NODES) {
      const dagre = await loadDagre(model.get("_dagre"));
      layout = dagreLayout(dagre, nodes, edges, widths); engine = "dagre";
    } else {
      layout = layeredLayout(nodes, edges, widths); engine = "layered";
    }
    const t1 = performance.now();
    const parts = ['<g class="wb-edges">'];
    for (const p of layout.paths) parts.push(`<path d="${pathD(p)}"/>`);
    parts.push('</g><g class="wb-nodes">');
    const eager = nodes.length <= EAGER_LABELS;
    nodes.forEach((nd, i) => {
      const w = widths[i], x = layout.x[i] - w / 2, y = layout.y[i] - NODE_H / 2;
      const stroke = strokes[i] ? ` wb-flagged` : "";
      parts.push(`<g class="wb-node${stroke}" data-id="${esc(nd.id)}" data-index="${i}" data-op="${esc(nd.op)}" transform="translate(${x.toFixed(1)},${y.toFixed(1)})">` +
        `<title>${esc(titles[i] || nd.id)}</title>` +
        `<rect width="${w}" height="${NODE_H}" rx="4" fill="${esc(colors[i] || "#dddddd")}"/>` +
        (eager ? labelSVG(labels[i], w) : "") + "</g>");
    });
    parts.push("</g>");
    viewport.innerHTML = parts.join("");
    positions = { x: layout.x, y: layout.y };
    lazy = eager ? null : { xs: layout.x, ys: layout.y, widths, labels, done: new Uint8Array(nodes.length),
      els: viewport.querySelectorAll(".wb-node") };
    size = { width: layout.width, height: layout.height };
    fit();
    labelVisible();
    highlight();
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
    root.classList.add("wb-drawn");
    status.textContent = `${nodes.length} nodes \u00b7 ${engine} \u00b7 ${ms.total.toFixed(0)} ms`;
    model.set("render_ms", ms);
    model.save_changes();
  };
  // new colours (another color_by): repaint the nodes and the legend, keep layout and view
  const recolor = () => {
    const colors = model.get("colors") || [];
    const strokes = model.get("strokes") || [];
    const titles = model.get("tooltips") || [];
    viewport.querySelectorAll(".wb-node").forEach((g) => {
      const i = Number(g.dataset.index);
      g.querySelector("rect").setAttribute("fill", colors[i] || "#dddddd");
      g.classList.toggle("wb-flagged", !!strokes[i]);
      g.querySelector("title").textContent = titles[i] || g.dataset.id;
    });
    root.querySelector(".wb-legend").innerHTML = legendHTML(model.get("legend"));
  };
  // find: the next node whose name or op type contains the text; centre on it and select it
  const find = root.querySelector(".wb-find");
  let lastFind = -1;
  find.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" || !positions) return;
    e.stopPropagation();
    const q = find.value.trim().toLowerCase();
    const nodes = (model.get("graph") || { nodes: [] }).nodes;
    if (!q) return;
    for (let k = 1; k <= nodes.length; k++) {
      const i = (lastFind + k) % nodes.length;
      if (nodes[i].id.toLowerCase().includes(q) || nodes[i].op.toLowerCase().includes(q)) {
        lastFind = i;
        const b = svg.getBoundingClientRect();
        view.k = Math.max(view.k, 0.8);
        view.x = (b.width || 600) / 2 - positions.x[i] * view.k;
        view.y = (b.height || 500) / 2 - positions.y[i] * view.k;
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
  model.on("change:graph", draw);
  model.on("change:colors", recolor);
  model.on("change:selected", highlight);
  await draw();
}

export default { render };
