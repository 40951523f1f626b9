// Compare view table: the HTML comes from Python (filtered and sorted there); a click on a
// sortable header sends its column back (`clicked`), and Python sorts and sends new HTML.
// The box scrolls both ways and its bottom-right corner drags it taller (resize).

function render({ model, el }) {
  el.style.resize = "vertical";
  el.style.overflow = "auto";
  el.style.minHeight = "120px";
  const box = document.createElement("div");
  box.className = "wb-compare-table-box";
  el.appendChild(box);
  const draw = () => {
    box.innerHTML = model.get("html");
    box.querySelectorAll("th[data-col]").forEach((th) => {
      th.addEventListener("click", () => {
        model.set("clicked", `${th.dataset.col}|${Date.now()}`);
        model.save_changes();
      });
    });
  };
  model.on("change:html", draw);
  draw();
}

export default { render };
