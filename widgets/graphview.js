// Entry of the graph view (anywidget's `_esm`): loads the view's ES modules and renders.
//
// How the modules are loaded, with no build step: anywidget hands the browser this one file as
// text (imported from a Blob URL), so `import "./graph/view.js"` has nothing to resolve
// against. Python ships every widgets/graph/*.js in the `_modules` trait ({files: {name:
// source}, key: hash of them}); load() imports each from a Blob URL of its own, dependencies
// first, rewriting each `from "./x.js"` to x's Blob URL. They are real ES modules (own scopes,
// each loaded once), loaded once per page and content (`key`), whatever the number of views.
// Rules for widgets/graph/: import siblings only, as `from "./name.js"`, and no import cycles
// (tests/test_graph_widget_files.py checks both).

const loaded = (globalThis.__wbGraphModules ??= new Map()); // key -> Promise of view.js

function load(files, name, urls) {
  if (urls.has(name)) return urls.get(name);
  if (!(name in files)) throw new Error(`graph view: module ${name} was not shipped`);
  const text = files[name].replace(/(\bfrom\s*)(["'])\.\/([\w.-]+\.js)\2/g,
    (_m, from, _q, dep) => `${from}"${load(files, dep, urls)}"`);
  const url = URL.createObjectURL(new Blob([`${text}\n//# sourceURL=workbench-graph/${name}\n`],
    { type: "text/javascript" }));
  urls.set(name, url);
  return url;
}

async function render({ model, el }) {
  const { files, key } = model.get("_modules");
  if (!loaded.has(key)) loaded.set(key, import(/* webpackIgnore: true */ load(files, "view.js", new Map())));
  const view = await loaded.get(key);
  return view.render({ model, el });
}

export default { render };
