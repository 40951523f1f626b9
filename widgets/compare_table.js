// Compare view table: the HTML comes from Python (filtered and sorted there); a click on a
// sortable header sends its column back (`clicked`), and Python sorts and sends new HTML.

function render({ model, el }) {
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
