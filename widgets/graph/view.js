// Graph view: an artifact's graph as SVG, nodes coloured by a per-node value (error or op
// type), grouped into the PyTorch modules they came from, legend, zoom and pan, minimap.
// The layout comes from Python (the `layout` trait, workbench/ui/graphlayout.py): this side
// only draws it. Opening or closing a module sets `expanded`; Python answers with the new
// layout, drawn on arrival. Constants are folded into their consumers (Python lists them on
// the consumer's click).
//
// The modules: draw.js (SVG markup, legend, recolour), viewport.js (zoom, pan, fit, lazy
// labels), minimap.js, select.js (clicks, find, lit nodes), export.js (SVG/PNG buttons).
// They share one state object `s`, made here.

import { drawingSVG, legendHTML, recolor } from "./draw.js";
import { initExport } from "./export.js";
import { initMinimap } from "./minimap.js";
import { focusLit, initClicks, initFind, markSelected, paintLit } from "./select.js";
import { SVGNS } from "./util.js";
import { initViewport } from "./viewport.js";

const ENGINE = "layered";

function skeleton() {
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
    `<div class="wb-side"><div class="wb-legend"></div>` + // beside the drawing, never over a node
    `<div class="wb-minimap" title="overview: click or drag to move the view"><canvas></canvas><div class="wb-minimap-view"></div></div></div></div>`;
  return root;
}

function sameList(a, b) { return a.length === b.length && a.every((v, i) => v === b[i]); }

export async function render({ model, el }) {
  const root = skeleton();
  el.appendChild(root);
  const s = {
    model, root,
    svg: root.querySelector("svg.wb-graph"),
    viewport: root.querySelector("g.wb-viewport"),
    view: { k: 1, x: 0, y: 0 },
    size: { width: 1, height: 1 },
    fitPending: true, // fit again once the view has a size (drawn in a hidden tab)
    userMoved: false,
    lazy: null, // what is needed to add labels as the view moves (large drawings)
    positions: null, // item centres and sizes of the last drawing, and the item of each node
    open: new Set(model.get("expanded") || []),
  };
  const status = root.querySelector(".wb-graphview-status");
  initMinimap(s);
  initViewport(s);
  initExport(s);
  initClicks(s);
  initFind(s);

  let drawn = null; // the layout and graph drawn last
  let drawing = Promise.resolve();
  const draw = (layout, why, focus = null, t0 = null) => {
    drawing = drawing.then(() => drawNow(layout, why, focus, t0)).catch((e) => console.error("graph view:", e));
    return drawing;
  };
  // a module opened or closed here: ask Python for the layout (`expanded`); it is drawn when
  // it comes (change:layout). Resolves once drawn. The same modules again: drawn again as is.
  let pending = null;
  s.requestOpen = (next, focus) => new Promise((resolve) => {
    const groups = (model.get("graph") || {}).groups || [];
    const list = groups.filter((g) => next.has(g.id)).map((g) => g.id);
    s.open = next;
    const t0 = performance.now();
    const layout = model.get("layout");
    if (layout && sameList(layout.opened, list)) { draw(layout, "expand", focus, t0).then(resolve); return; }
    if (pending) pending.resolve(); // superseded
    pending = { list, focus, t0, resolve };
    status.textContent = "laying out in the kernel\u2026"; // a busy kernel answers when free
    model.set("expanded", list);
    model.save_changes();
  });

  const drawNow = async (layout, why, focus, t0) => {
    s.minimap.forget();
    const start = t0 ?? performance.now();
    const graph = model.get("graph") || { nodes: [], edges: [] };
    const nodes = graph.nodes, groups = graph.groups || [];
    root.querySelector(".wb-graphview-title").textContent = model.get("title") || "";
    root.querySelector(".wb-legend").innerHTML = legendHTML(model.get("legend"));
    const t1 = performance.now();
    const { html, eager } = drawingSVG(layout, model);
    s.viewport.innerHTML = html;
    const { items } = layout;
    const slot = new Map(items.map((r, k) => [r, k]));
    s.positions = { x: layout.x, y: layout.y, slot, rep: layout.rep, widths: layout.w, heights: layout.h };
    s.lazy = eager ? null : { xs: layout.x, ys: layout.y, widths: layout.w, heights: layout.h, labels: layout.labels,
      done: new Uint8Array(items.length), els: s.viewport.querySelectorAll(".wb-nodes > g") };
    s.size = { width: layout.width, height: layout.height };
    const k = focus !== null ? groups.findIndex((g) => g.id === focus) : -1;
    const fb = layout.boxes.find((b) => b[0] === k);
    if (fb && !s.fitPending) { // keep the zoom; show the opened module from its top
      const [, x0, y0, x1] = fb, b = s.svg.getBoundingClientRect(), { view } = s;
      view.x = b.width / 2 - ((x0 + x1) / 2) * view.k;
      view.y = 24 - y0 * view.k;
      if ((x1 - x0) * view.k > b.width) view.x = 8 - x0 * view.k;
      s.apply();
    } else if (why !== "expand" || s.fitPending) { s.userMoved = false; s.fit(); } else s.apply();
    s.labelVisible(false);
    markSelected(s);
    s.minimap.show(layout);
    const litSlots = paintLit(s);
    if (why === "first" && litSlots.length) focusLit(s, litSlots); // lit before it was shown
    void s.svg.getBoundingClientRect(); // force style and layout now, so the time includes them
    const t2 = performance.now();
    await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
    const t3 = performance.now();
    // layout: Python's (the kernel's clock); a draw asked for here counts from the click,
    // the round trip to the kernel included
    const ms = { layout: layout.ms || 0, dom: t2 - t1, paint: t3 - t2 };
    ms.total = t0 !== null ? t3 - start : ms.layout + (t3 - t1);
    drawn = { layout, graph };
    stamp(ms, why, nodes, items);
  };
  const stamp = (ms, why, nodes, items) => {
    const d = root.dataset;
    d.engine = ENGINE;
    d.renderMs = ms.total.toFixed(1);
    d.layoutMs = ms.layout.toFixed(1);
    d.domMs = ms.dom.toFixed(1);
    d.paintMs = ms.paint.toFixed(1);
    d.nodes = String(nodes.length);
    d.items = String(items.length);
    d.lastDraw = why;
    if (why === "expand") d.expandMs = ms.total.toFixed(1);
    else d.firstMs = d.firstMs || ms.total.toFixed(1);
    d.draws = String(Number(d.draws || 0) + 1);
    root.classList.add("wb-drawn");
    const closed = items.filter((r) => r < 0).length;
    const folded = nodes.filter((n) => n.fold >= 0 && !n.qdq).length;
    const qdq = nodes.filter((n) => n.fold >= 0 && n.qdq).length;
    const extra = [folded ? `+${folded} folded constants` : "", qdq ? `+${qdq} Q/DQ folded` : ""].filter(Boolean).join(", ");
    status.textContent = `${nodes.length - folded - qdq} nodes${extra ? ` (${extra})` : ""} \u00b7 ${items.length} drawn${closed ? ` (${closed} modules closed)` : ""} \u00b7 ${ENGINE} \u00b7 ${ms.total.toFixed(0)} ms`;
    model.set("render_ms", { ...ms, items: items.length, why });
    model.save_changes();
  };

  model.on("change:layout", () => {
    const layout = model.get("layout");
    const p = pending && sameList(layout.opened, pending.list) ? pending : null;
    if (p) pending = null;
    const why = drawn && drawn.graph !== model.get("graph") ? "draw" : "expand";
    draw(layout, why, p ? p.focus : null, p ? p.t0 : null).then(() => p && p.resolve());
  });
  model.on("change:expanded", () => { s.open = new Set(model.get("expanded") || []); });
  const repaint = () => { recolor(s); s.minimap.paint(); };
  model.on("change:colors", repaint);
  model.on("change:group_colors", repaint);
  model.on("change:selected", () => markSelected(s));
  // after any redraw the same change queued (the modules opened to reveal them)
  model.on("change:highlighted", () => setTimeout(async () => { await drawing; focusLit(s, paintLit(s)); }, 0));
  const first = model.get("layout");
  if (first && first.items) await draw(first, "first"); // else drawn when it comes
}
