// The SVG and PNG buttons: the drawing as it is (the same elements, styles inlined, the
// legend at the right) saved as a file. Python's view.save() draws the same layout headless.

import { SVGNS, esc } from "./util.js";

const EXPORT_CSS = `text{font:11px sans-serif;text-anchor:middle;fill:#111}.wb-sub{font-size:9.5px;fill:#333}
.wb-group text{font-size:13px;font-weight:600}.wb-edges path{fill:none;stroke:#9a9a9a;stroke-width:1.2}
.wb-node rect,.wb-group rect{stroke:rgba(0,0,0,.35);stroke-width:1}.wb-group rect{stroke:#50607a;stroke-width:1.5}
.wb-flagged rect{stroke:#7f0000;stroke-width:2.5}.wb-groupbox rect{fill:rgba(80,96,122,.06);stroke:#50607a;stroke-dasharray:4 3}
.wb-groupbox text{text-anchor:start;font-size:11px;font-weight:600;fill:#50607a}.wb-shape{font-size:9px;fill:#666;text-anchor:start}
.wb-legend-svg text{text-anchor:start;font-size:11px}.wb-edges path.wb-int8{stroke:#e65100;stroke-width:1.6;stroke-dasharray:5 3}
.wb-int8-tag{fill:#e65100;stroke:none}`;

export function exportSVG(viewport, size, legend, title) {
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

export function initExport(s) {
  const { root, model, viewport } = s;
  const saveName = (ext) => (model.get("title") || "graph").split(" ")[0].replace(/[^\w.-]+/g, "_") + "." + ext;
  const svgText = () => { s.labelVisible(true); return exportSVG(viewport, s.size, model.get("legend") || {}, model.get("title") || ""); };
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
}
