// The minimap: every item drawn as a small box, the part in view as a rectangle; a click or
// a drag there moves the view. x and y are scaled apart (up to 6x): a long chain of ops
// still fills the overview instead of being a one-pixel line. It sits in the side column
// under the legend, beside the drawing: it never covers a node. Its size is its element's
// (CSS: smaller in a linked view's narrow column).

const MINIMAP_ITEMS = 40; // a minimap from this many items drawn (or a drawing taller than the view)
let MINI_W = 160, MINI_H = 120; // the element's size, read when the minimap is shown

export function initMinimap(s) {
  const { root, svg, model } = s;
  const mini = root.querySelector(".wb-minimap");
  const frame = mini.querySelector(".wb-minimap-view");
  let data = null; // {items, x, y, widths, heights, sx, sy, ox, oy} of the last drawing
  let last = null; // the last drawing's layout, to decide again once the view has its size
  const paint = () => {
    if (!data) return;
    const c = mini.querySelector("canvas");
    const dpr = window.devicePixelRatio || 1;
    c.width = MINI_W * dpr; c.height = MINI_H * dpr;
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, MINI_W, MINI_H);
    const colors = model.get("colors") || [], gcolors = model.get("group_colors") || [];
    const { items, x, y, widths: w, heights: h, sx, sy, ox, oy } = data;
    items.forEach((r, k) => {
      ctx.fillStyle = r >= 0 ? colors[r] || "#dddddd" : gcolors[-1 - r] || "#e3e9f2";
      ctx.fillRect(ox + (x[k] - w[k] / 2) * sx, oy + (y[k] - h[k] / 2) * sy, Math.max(1, w[k] * sx), Math.max(1, h[k] * sy));
    });
    move();
  };
  const move = () => {
    if (!data) return;
    const b = svg.getBoundingClientRect(), { view } = s;
    const { sx, sy, ox, oy } = data;
    const left = ox + (-view.x / view.k) * sx, top = oy + (-view.y / view.k) * sy;
    Object.assign(frame.style, { left: `${left.toFixed(1)}px`, top: `${top.toFixed(1)}px`,
      width: `${Math.max(4, (b.width || 600) / view.k * sx).toFixed(1)}px`,
      height: `${Math.max(4, (b.height || 500) / view.k * sy).toFixed(1)}px` });
  };
  const show = (layout) => {
    last = layout;
    const b = svg.getBoundingClientRect(), { size, view } = s;
    const on = layout.items.length >= MINIMAP_ITEMS || (b.height > 0 && size.height * view.k > b.height * 1.2);
    mini.style.display = on ? "block" : "none";
    root.dataset.minimap = on ? "1" : "0";
    if (!on) { data = null; return; }
    if (mini.clientWidth && mini.clientHeight) { MINI_W = mini.clientWidth; MINI_H = mini.clientHeight; }
    const k = Math.min(MINI_W / size.width, MINI_H / size.height);
    const sx = Math.min(MINI_W / size.width, 6 * k), sy = Math.min(MINI_H / size.height, 6 * k);
    data = { items: layout.items, x: layout.x, y: layout.y, widths: layout.w, heights: layout.h, sx, sy,
      ox: (MINI_W - size.width * sx) / 2, oy: (MINI_H - size.height * sy) / 2 };
    paint();
  };
  let dragging = false;
  const go = (e) => {
    const mb = mini.getBoundingClientRect();
    const { sx, sy, ox, oy } = data;
    const clamp = (v, hi) => Math.max(0, Math.min(hi, v)); // a point of the drawing
    s.centerOn(clamp((e.clientX - mb.left - ox) / sx, s.size.width), clamp((e.clientY - mb.top - oy) / sy, s.size.height));
  };
  mini.addEventListener("pointerdown", (e) => {
    if (!data || e.button !== 0) return;
    e.stopPropagation(); e.preventDefault();
    dragging = true;
    if (mini.setPointerCapture) mini.setPointerCapture(e.pointerId);
    go(e);
  });
  mini.addEventListener("pointermove", (e) => { if (dragging && data) go(e); });
  mini.addEventListener("pointerup", () => { dragging = false; });
  mini.addEventListener("wheel", (e) => e.stopPropagation());
  s.minimap = {
    paint, move, show,
    forget: () => { last = null; }, // a fit during a draw must not repaint the last drawing's minimap
    reshow: () => { if (last) show(last); },
  };
}
