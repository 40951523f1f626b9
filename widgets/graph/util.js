// Small helpers the graph view's modules share: escaping, clipping, SVG path text.

export const SVGNS = "http://www.w3.org/2000/svg";

export function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

export function clip(s, n) { return s.length > n ? s.slice(0, n - 1) + "\u2026" : s; }

export function pathD(points) {
  return "M" + points.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join("L");
}
