// Selection: a click on a node selects it (the `selected` trait goes to Python); a click on a
// closed module opens it one level (and tells a LinkedView through `clicked_group`), a click
// on an open module's title closes it; the find box selects the next matching node. Lit nodes
// (`highlighted`, a module selected in a LinkedView) are outlined and brought into view.

export function markSelected(s) {
  const sel = s.model.get("selected");
  s.viewport.querySelectorAll(".wb-node.wb-selected").forEach((g) => g.classList.remove("wb-selected"));
  if (sel) {
    const g = s.viewport.querySelector(`.wb-node[data-id="${CSS.escape(sel)}"]`);
    if (g) g.classList.add("wb-selected");
  }
}

// lit nodes: outlined, a closed module holding one lit too, an open module's box lit when
// all of it is. Returns the slots of the lit items.
export function paintLit(s) {
  const { viewport, root, model, positions } = s;
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
}

// pan (and zoom out if they do not fit) so the lit items are in view
export function focusLit(s, slots) {
  const b = s.svg.getBoundingClientRect();
  if (!slots.length || !b.width || !b.height) return;
  let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
  const { x, y, widths: w, heights: h } = s.positions;
  for (const k of slots) {
    x0 = Math.min(x0, x[k] - w[k] / 2); x1 = Math.max(x1, x[k] + w[k] / 2);
    y0 = Math.min(y0, y[k] - h[k] / 2); y1 = Math.max(y1, y[k] + h[k] / 2);
  }
  const { view } = s;
  const fits = Math.min((b.width - 40) / (x1 - x0), (b.height - 40) / (y1 - y0));
  if (fits < view.k) view.k = Math.max(0.1, fits);
  view.x = b.width / 2 - ((x0 + x1) / 2) * view.k;
  view.y = b.height / 2 - ((y0 + y1) / 2) * view.k;
  s.userMoved = true; s.fitPending = false;
  s.apply();
}

export function initClicks(s) {
  const { svg, model, root } = s;
  const groupIds = () => ((model.get("graph") || {}).groups || []).map((g) => g.id);
  svg.addEventListener("click", (e) => {
    if (svg.dataset.justPanned) { delete svg.dataset.justPanned; return; }
    const box = e.target.closest(".wb-groupbox-title");
    if (box) { const next = new Set(s.open); next.delete(box.parentNode.dataset.module); s.requestOpen(next, null); return; }
    const grp = e.target.closest(".wb-group");
    if (grp) {
      model.set("clicked_group", `${grp.dataset.module}|${Date.now()}`); // a LinkedView selects it
      const next = new Set(s.open); next.add(grp.dataset.module); s.requestOpen(next, grp.dataset.module); return;
    }
    const g = e.target.closest(".wb-node");
    if (!g) return;
    model.set("selected", g.dataset.id);
    model.save_changes();
  });
  root.querySelector(".wb-expand-all").onclick = () => s.requestOpen(new Set(groupIds()), null);
  root.querySelector(".wb-collapse-all").onclick = () => s.requestOpen(new Set(), null);
}

// find: the next node whose name or op type contains the text; open its modules, centre on it
export function initFind(s) {
  const { root, model } = s;
  const find = root.querySelector(".wb-find");
  let lastFind = -1;
  find.addEventListener("keydown", async (e) => {
    if (e.key !== "Enter" || !s.positions) return;
    e.stopPropagation();
    const q = find.value.trim().toLowerCase();
    const graph = model.get("graph") || { nodes: [] };
    const nodes = graph.nodes, groups = graph.groups || [];
    if (!q) return;
    for (let k = 1; k <= nodes.length; k++) {
      const i = (lastFind + k) % nodes.length;
      if (nodes[i].fold < 0 && (nodes[i].id.toLowerCase().includes(q) || nodes[i].op.toLowerCase().includes(q))) {
        lastFind = i;
        if (s.positions.rep[i] !== i) { // inside a closed module: open the modules around it
          const next = new Set(s.open);
          for (let g = nodes[i].g; g >= 0; g = groups[g].parent) next.add(groups[g].id);
          await s.requestOpen(next, null);
        }
        const at = s.positions.slot.get(i);
        if (at === undefined) return; // another opening came first: not drawn now
        s.centerOn(s.positions.x[at], s.positions.y[at], Math.max(s.view.k, 0.8));
        model.set("selected", nodes[i].id);
        model.save_changes();
        find.classList.remove("wb-not-found");
        return;
      }
    }
    find.classList.add("wb-not-found");
  });
  find.addEventListener("keyup", (e) => e.stopPropagation()); // keep JupyterLab shortcuts out
}
