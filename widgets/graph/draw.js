// Drawing: a layout computed in Python (workbench/ui/graphlayout.py, the `layout` trait) as
// SVG markup, in the colours Python chose; the legend; repainting in place on a recolour.
// Nothing here decides where an item goes: positions, sizes and labels come with the layout.

import { clip, esc, pathD } from "./util.js";

export const EAGER_LABELS = 300; // above this, labels are added for the items in view only
const SHAPE_LABELS = 400; // tensor shapes on edges up to this many items
const NODE_FILL = "#dddddd", GROUP_FILL = "#e3e9f2";

export function legendHTML(legend) {
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

export function labelSVG(lines, w, h) {
  if (lines.length === 1 || !lines[1]) return `<text x="${(w / 2).toFixed(1)}" y="${(h / 2 + 4).toFixed(1)}">${esc(lines[0])}</text>`;
  return `<text x="${(w / 2).toFixed(1)}" y="${(h / 2 - 2).toFixed(1)}">${esc(lines[0])}</text>` +
    `<text class="wb-sub" x="${(w / 2).toFixed(1)}" y="${(h / 2 + 11).toFixed(1)}">${esc(lines[1])}</text>`;
}

// each edge's polyline: its source's centre, its bends (x, y, x, y...), its target's centre
export function edgePaths(layout) {
  return layout.edges.map(([a, b], e) => {
    const pts = [[layout.x[a], layout.y[a]]];
    const bends = layout.bends[e] || [];
    for (let i = 0; i < bends.length; i += 2) pts.push([bends[i], bends[i + 1]]);
    pts.push([layout.x[b], layout.y[b]]);
    return pts;
  });
}

// the SVG markup of a drawing: open modules' boxes, edges, shapes on the edges, the items
// (a node, or a closed module drawn as one box). Returns {html, eager}: eager is false when
// the labels are left for the items in view (viewport.js adds them as the view moves).
export function drawingSVG(layout, model) {
  const graph = model.get("graph") || { nodes: [], groups: [] };
  const nodes = graph.nodes, groups = graph.groups || [];
  const colors = model.get("colors") || [], strokes = model.get("strokes") || [];
  const titles = model.get("tooltips") || [];
  const gcolors = model.get("group_colors") || [], gstrokes = model.get("group_strokes") || [];
  const gtitles = model.get("group_tooltips") || [];
  const { items, labels, x: xs, y: ys, w: widths, h: heights } = layout;
  const parts = ['<g class="wb-boxes">'];
  for (const [g, x0, y0, x1, y1] of layout.boxes) {
    parts.push(`<g class="wb-groupbox" data-module="${esc(groups[g].id)}" data-group="${g}"><rect x="${x0.toFixed(1)}" y="${y0.toFixed(1)}" width="${(x1 - x0).toFixed(1)}" height="${(y1 - y0).toFixed(1)}" rx="6"/>` +
      `<text class="wb-groupbox-title" x="${(x0 + 6).toFixed(1)}" y="${(y0 + 12).toFixed(1)}"><title>close module ${esc(groups[g].id)}</title>\u25be ${esc(clip(groups[g].label, 40))}</text></g>`);
  }
  parts.push('</g><g class="wb-edges">');
  const paths = edgePaths(layout);
  const int8 = layout.int8 || []; // an edge carrying a tensor rounded to int8: marked, its scale on hover
  paths.forEach((p, e) => parts.push(int8[e] ? `<path class="wb-int8" d="${pathD(p)}"><title>${esc(int8[e])}</title></path>` : `<path d="${pathD(p)}"/>`));
  parts.push("</g>");
  if (items.length <= SHAPE_LABELS) {
    parts.push('<g class="wb-shapes">');
    paths.forEach((p, e) => {
      const s = layout.edges[e][2];
      if (!s || p.length < 2) return;
      const m = p[Math.floor((p.length - 1) / 2)], n = p[Math.floor((p.length - 1) / 2) + 1] || m;
      parts.push(`<text class="wb-shape" x="${((m[0] + n[0]) / 2 + 4).toFixed(1)}" y="${((m[1] + n[1]) / 2 + 3).toFixed(1)}">${esc(s)}</text>`);
    });
    parts.push("</g>");
  }
  parts.push('<g class="wb-nodes">');
  const eager = items.length <= EAGER_LABELS;
  items.forEach((r, k) => {
    const w = widths[k], h = heights[k], x = xs[k] - w / 2, y = ys[k] - h / 2;
    const tr = `transform="translate(${x.toFixed(1)},${y.toFixed(1)})"`;
    const label = eager ? labelSVG(labels[k], w, h) : "";
    if (r >= 0) {
      const nd = nodes[r];
      // an op that reads or writes int8 (its Q/DQ folded into it): an orange corner says so
      const q8 = nd.q8 ? '<path class="wb-int8-tag" d="M0.5,9V4.5Q0.5,0.5 4.5,0.5H9Z"/>' : "";
      parts.push(`<g class="wb-node${strokes[r] ? " wb-flagged" : ""}${nd.q8 ? " wb-int8" : ""}" data-id="${esc(nd.id)}" data-index="${r}" data-op="${esc(nd.op)}" ${tr}>` +
        `<title>${esc(titles[r] || nd.id)}</title>` +
        `<rect width="${w}" height="${h}" rx="4" fill="${esc(colors[r] || NODE_FILL)}"/>${label}${q8}</g>`);
    } else {
      const g = -1 - r;
      parts.push(`<g class="wb-group${gstrokes[g] ? " wb-flagged" : ""}" data-module="${esc(groups[g].id)}" data-group="${g}" ${tr}>` +
        `<title>${esc(gtitles[g] || groups[g].id)}</title>` +
        `<rect width="${w}" height="${h}" rx="9" fill="${esc(gcolors[g] || GROUP_FILL)}"/>${label}</g>`);
    }
  });
  parts.push("</g>");
  return { html: parts.join(""), eager };
}

// new colours (another color_by or metric): repaint the items and the legend in place
export function recolor(s) {
  const { model, viewport, root } = s;
  const colors = model.get("colors") || [], strokes = model.get("strokes") || [];
  const titles = model.get("tooltips") || [];
  const gcolors = model.get("group_colors") || [], gstrokes = model.get("group_strokes") || [];
  const gtitles = model.get("group_tooltips") || [];
  viewport.querySelectorAll(".wb-node").forEach((g) => {
    const i = Number(g.dataset.index);
    g.querySelector("rect").setAttribute("fill", colors[i] || NODE_FILL);
    g.classList.toggle("wb-flagged", !!strokes[i]);
    g.querySelector("title").textContent = titles[i] || g.dataset.id;
  });
  viewport.querySelectorAll(".wb-group").forEach((g) => {
    const k = Number(g.dataset.group);
    g.querySelector("rect").setAttribute("fill", gcolors[k] || GROUP_FILL);
    g.classList.toggle("wb-flagged", !!gstrokes[k]);
    g.querySelector("title").textContent = gtitles[k] || g.dataset.module;
  });
  root.querySelector(".wb-legend").innerHTML = legendHTML(model.get("legend"));
}
