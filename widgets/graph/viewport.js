// The viewport: zoom and pan (buttons, ctrl+wheel, wheel, drag), fit to the view's width,
// a refit when a hidden tab opens or the view is resized, and labels added lazily to the
// items in view on large drawings (laying out 2,000 SVG texts is most of a first paint).
// Everything reads and writes the view's shared state `s` (view.js): s.view = {k, x, y}.

import { labelSVG } from "./draw.js";

const FAR = 0.55; // below this zoom, labels are under ~6 px: hidden, and not added

export function initViewport(s) {
  const { svg, viewport, root } = s;
  let labelPending = false;
  s.labelVisible = (all) => {
    labelPending = false;
    if (!s.lazy || (s.view.k < FAR && !all)) return;
    const b = svg.getBoundingClientRect(), { view } = s;
    const m = 200 / view.k;
    const x0 = -view.x / view.k - m, y0 = -view.y / view.k - m;
    const x1 = x0 + (b.width || 800) / view.k + 2 * m, y1 = y0 + (b.height || 520) / view.k + 2 * m;
    const { xs, ys, widths, heights, labels, done, els } = s.lazy;
    for (let i = 0; i < xs.length; i++) {
      if (done[i] || (!all && (xs[i] < x0 || xs[i] > x1 || ys[i] < y0 || ys[i] > y1))) continue;
      done[i] = 1;
      els[i].insertAdjacentHTML("beforeend", labelSVG(labels[i], widths[i], heights[i]));
    }
  };
  s.apply = () => {
    const { view } = s;
    viewport.setAttribute("transform", `translate(${view.x.toFixed(1)},${view.y.toFixed(1)}) scale(${view.k.toFixed(4)})`);
    root.dataset.zoom = view.k.toFixed(4);
    s.minimap.move();
    svg.classList.toggle("wb-far", view.k < FAR); // SVG text is most of the paint cost
    if (s.lazy && !labelPending) { labelPending = true; requestAnimationFrame(() => s.labelVisible(false)); }
  };
  s.fit = () => {
    const box = svg.getBoundingClientRect();
    if (!box.width || !box.height) { s.fitPending = true; return; } // hidden: fit when shown
    s.fitPending = false;
    const W = box.width, H = box.height, { size, view } = s;
    // fit the width, but keep labels readable on long graphs: scroll (pan) down instead
    view.k = Math.min(1.5, W / size.width, Math.max(H / size.height, 0.8));
    view.x = (W - size.width * view.k) / 2;
    view.y = 8;
    s.apply();
    s.minimap.reshow(); // drawn before the view had a size (a hidden tab)
  };
  // centre the view on a point of the drawing (at the zoom k)
  s.centerOn = (px, py, k = s.view.k) => {
    const b = svg.getBoundingClientRect();
    s.view.k = k;
    s.view.x = (b.width || 600) / 2 - px * k;
    s.view.y = (b.height || 500) / 2 - py * k;
    s.userMoved = true;
    s.apply();
  };
  // a graph drawn in a hidden tab (zero size) is fitted when its tab opens; a resize refits
  // until the user has zoomed or panned
  const ro = new ResizeObserver(() => {
    const b = svg.getBoundingClientRect();
    if (b.width && b.height && (s.fitPending || !s.userMoved)) { s.fit(); root.dataset.fittedWidth = b.width.toFixed(0); }
  });
  ro.observe(svg);
  const zoomAt = (factor, cx, cy) => {
    s.userMoved = true;
    const { view } = s;
    const k = Math.max(0.02, Math.min(8, view.k * factor));
    view.x = cx - (cx - view.x) * (k / view.k);
    view.y = cy - (cy - view.y) * (k / view.k);
    view.k = k;
    s.apply();
  };
  const center = () => { const b = svg.getBoundingClientRect(); return [b.width / 2, b.height / 2]; };
  root.querySelector(".wb-zoom-in").onclick = () => zoomAt(1.25, ...center());
  root.querySelector(".wb-zoom-out").onclick = () => zoomAt(0.8, ...center());
  root.querySelector(".wb-zoom-fit").onclick = () => { s.userMoved = false; s.fit(); };
  svg.addEventListener("wheel", (e) => {
    // ctrl/cmd + wheel (and pinch) zooms at the pointer; a plain wheel pans the graph
    e.preventDefault();
    const b = svg.getBoundingClientRect();
    if (e.ctrlKey || e.metaKey) zoomAt(Math.exp(-e.deltaY * 0.002), e.clientX - b.left, e.clientY - b.top);
    else { s.userMoved = true; s.view.x -= e.shiftKey ? e.deltaY : e.deltaX; s.view.y -= e.shiftKey ? 0 : e.deltaY; s.apply(); }
  }, { passive: false });
  let drag = null;
  svg.addEventListener("pointerdown", (e) => {
    if (e.button !== 0) return;
    drag = { x: e.clientX, y: e.clientY, vx: s.view.x, vy: s.view.y, moved: false };
  });
  window.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    if (drag.moved) { s.userMoved = true; s.view.x = drag.vx + dx; s.view.y = drag.vy + dy; s.apply(); svg.classList.add("wb-panning"); }
  });
  window.addEventListener("pointerup", () => {
    if (drag && drag.moved) svg.dataset.justPanned = "1"; // the click that ends a pan selects nothing
    drag = null; svg.classList.remove("wb-panning");
  });
}
