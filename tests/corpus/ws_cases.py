"""Corrupted workspaces and hostile names and paths.

Workspace damage (manifest.json, artifact.json, .lock damaged or replaced by folders, symlinks
out, staging leftovers): reopening must keep every artifact, a new artifact must be addable and
an old one must run; where it cannot open, a hinted error is right. Hostile paths: external
data whose location leaves the model's folder (``..``, absolute, symlinks) must be refused
before anything is copied; hostile file names (quotes, ``<script>``, newlines, long, unicode)
must import, run and reach the Netron page escaped.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .actions import Action, Context, close, first, run_onnx_entry
from .harness import Case

SIDE = "0001-export/artifact.json"


def _outside(ctx: Context) -> Path:
    """A folder in the sandbox but outside the case folder (writes there are caught)."""
    d = ctx.cd.parent / "outside"
    d.mkdir(exist_ok=True)
    return d


def _replace(p: Path, text: str | bytes | None = None, folder: bool = False,
             link: Path | None = None) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()
    if folder:
        p.mkdir()
        (p / "junk.txt").write_text("x")
    elif link is not None:
        os.symlink(link, p)
    elif text is not None:
        p.write_bytes(text.encode() if isinstance(text, str) else text)


def _manifest(ctx: Context) -> dict[str, Any]:
    return json.loads((ctx.ws_path / "manifest.json").read_text())


def _damage(ctx: Context, how: str) -> None:
    ws, m = ctx.ws_path, ctx.ws_path / "manifest.json"
    doc = _manifest(ctx)
    good = m.read_text()
    side = ws / SIDE
    out = _outside(ctx) if "outside" in how or "symlink" in how else None
    edits: dict[str, Callable[[], None]] = {
        "manifest-truncated": lambda: _replace(m, good[: len(good) // 2]),
        "manifest-empty": lambda: _replace(m, ""),
        "manifest-null": lambda: _replace(m, "null"),
        "manifest-list": lambda: _replace(m, "[]"),
        "manifest-no-artifacts": lambda: _replace(m, '{"version": 1}'),
        "manifest-artifacts-not-list": lambda: _replace(m, json.dumps({**doc, "artifacts": 7})),
        "manifest-entries-strings": lambda: _replace(
            m, json.dumps({**doc, "artifacts": ["0001-export"]})),
        "manifest-version-99": lambda: _replace(m, json.dumps({**doc, "version": 99})),
        "manifest-garbage": lambda: _replace(m, bytes(range(256)) * 8),
        "manifest-folder": lambda: _replace(m, folder=True),
        "manifest-symlink-outside": lambda: (
            (out / "m.json").write_text(good), _replace(m, link=out / "m.json")),
        "manifest-symlink-dangling": lambda: _replace(m, link=ws / "nowhere.json"),
        "manifest-record-traversal": lambda: _replace(m, json.dumps(
            {**doc, "artifacts": [*doc["artifacts"], {**doc["artifacts"][0],
                                                      "id": "../../outside"}]})),
        "manifest-record-absolute": lambda: _replace(m, json.dumps(
            {**doc, "artifacts": [*doc["artifacts"], {**doc["artifacts"][0],
                                                      "id": str(ctx.cd / "in")}]})),
        "manifest-record-duplicate": lambda: _replace(m, json.dumps(
            {**doc, "artifacts": [*doc["artifacts"], doc["artifacts"][0]]})),
        "manifest-record-id-only": lambda: _replace(m, json.dumps(
            {**doc, "artifacts": [{"id": a["id"]} for a in doc["artifacts"]]})),
        "manifest-huge-whitespace": lambda: _replace(m, good + " " * (8 << 20)),
        "sidecar-truncated": lambda: _replace(side, side.read_text()[:40]),
        "sidecar-missing": lambda: side.unlink(),
        "sidecar-folder": lambda: _replace(side, folder=True),
        "sidecar-wrong-id": lambda: _replace(
            side, json.dumps({**json.loads(side.read_text()), "id": "0003-ncnn"})),
        "sidecar-null": lambda: _replace(side, "null"),
        "sidecar-garbage": lambda: _replace(side, b"\xff\xfe\x00" * 50),
        "sidecar-symlink-outside": lambda: (
            (out / "a.json").write_text(side.read_text()), _replace(side, link=out / "a.json")),
        "sidecar-and-manifest-truncated": lambda: (
            _replace(side, side.read_text()[:40]), _replace(m, good[:50])),
        "lock-folder": lambda: _replace(ws / ".lock", folder=True),
        "lock-symlink-outside": lambda: (
            (out / "lock").write_text(""), _replace(ws / ".lock", link=out / "lock")),
        "lock-fifo": lambda: (_replace(ws / ".lock"), os.mkfifo(ws / ".lock")),
        "staging-leftover": lambda: (
            (ws / ".staging-deadbeef").mkdir(), (ws / ".staging-deadbeef" / "m.onnx").write_text("x")),
        "pnnx-leftover-old": lambda: (
            (ws / "wb-pnnx-old").mkdir(), os.utime(ws / "wb-pnnx-old", (1e9, 1e9))),
        "junk-artifact-folder": lambda: ((ws / "0009-junk").mkdir(),
                                         (ws / "0009-junk" / "x.bin").write_text("x")),
        "main-file-deleted": lambda: (ws / "0001-export" / "model.onnx").unlink(),
        "main-file-folder": lambda: _replace(ws / "0001-export" / "model.onnx", folder=True),
        "artifact-folder-is-file": lambda: _replace(ws / "0002-pnnx", "not a folder"),
        "workspace-is-file": lambda: (shutil.rmtree(ws), ws.write_text("file")),
    }
    edits[how]()


WS_EXPECT = {"manifest-version-99": "error", "lock-folder": "error",
             "main-file-deleted": "error", "main-file-folder": "error",
             "workspace-is-file": "error", "lock-fifo": "either"}
WS_DAMAGES = {"main-file-deleted": ["0001-export"], "main-file-folder": ["0001-export"],
              "artifact-folder-is-file": ["0002-pnnx"], "lock-folder": ["*open"],
              "workspace-is-file": ["0001-export", "0002-pnnx", "0003-ncnn", "*open"],
              "manifest-version-99": ["*open"], "lock-fifo": ["*open"],
              # both records of 0001 unreadable: nothing vouches for it any more
              "sidecar-and-manifest-truncated": ["0001-export"]}


def _ws_damage(ctx: Context) -> Action:
    _damage(ctx, ctx.p["how"])

    def act() -> tuple[str, str]:
        import workbench as wb
        from workbench.runtime import OrtRunner

        ws = wb.Workspace(ctx.ws_path)
        ids = {a.id for a in ws.artifacts}
        want = [i for i in ctx.index["artifacts"] if i not in WS_DAMAGES.get(ctx.p["how"], ())]
        missing = [i for i in want if i not in ids]
        if missing:
            return "wrong", f"reopened without {missing}; problems: {ws.problems[:2]}"
        new = ws.import_file(ctx.model("mlp.onnx"))
        xm, ym = ctx.ref("mlp")
        verdict, detail = close(first(OrtRunner(new).run({"x": xm})), ym, what="new artifact")
        if verdict != "ok":
            return verdict, detail
        x, y = ctx.ref("tiny")
        if ctx.index["onnx_id"] in WS_DAMAGES.get(ctx.p["how"], ()):
            return "ok", f"{len(ids)} artifacts kept; the new one runs"
        out = OrtRunner(ws.get(ctx.index["onnx_id"])).run({"input": x})
        return close(first(out), y, what="old artifact after reopen")
    return act


# -- external data ----------------------------------------------------------------------------
def _ext_model(ctx: Context, location: str, offset: int | None = None,
               length: int | None = None) -> Path:
    from onnx import TensorProto

    from .base import mlp_model

    m = mlp_model(ctx.index["seed"])
    w = next(i for i in m.graph.initializer if i.name == "W")
    raw = w.raw_data
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", offset), ("length", length)):
        if v is not None:
            e = w.external_data.add()
            e.key, e.value = k, str(v)
    path = ctx.inp / "mlp.onnx"
    path.write_bytes(m.SerializeToString())
    ctx.raw_w = raw  # type: ignore[attr-defined]
    return path


def _ext(ctx: Context) -> Action:
    where, out = ctx.p["where"], _outside(ctx)
    sub = ctx.inp / "sub"
    placed: dict[str, tuple[str, Path | None]] = {
        "plain": ("w.data", ctx.inp / "w.data"),
        "dot-slash": ("./w.data", ctx.inp / "w.data"),
        "subfolder": ("sub/w.data", sub / "w.data"),
        "parent": ("../w.data", ctx.cd / "w.data"),
        "parent-3": ("../../../w.data", ctx.cd.parent.parent / "w.data"),
        "sub-up-up": ("sub/../../w.data", ctx.cd / "w.data"),
        "absolute": (str(out / "w.data"), out / "w.data"),
        "symlink-file-out": ("link.data", None),
        "symlink-dir-out": ("ldir/w.data", None),
        "dev-zero": ("/dev/zero", None),
        "empty": ("", None),
        "model-itself": ("mlp.onnx", None),
        "a-folder": ("sub", None),
        "tilde": ("~/w.data", None),
        "nul-byte": ("w\x00.data", ctx.inp / "w.data"),
        "missing": ("absent.data", None),
        "offset-past-end": ("w.data", ctx.inp / "w.data"),
        "length-too-long": ("w.data", ctx.inp / "w.data"),
        "negative-offset": ("w.data", ctx.inp / "w.data"),
    }
    loc, target = placed[where]
    sub.mkdir(exist_ok=True)
    path = _ext_model(ctx, loc, offset={"offset-past-end": 10 ** 6, "negative-offset": -8}.get(
        where), length={"length-too-long": 10 ** 6}.get(where))
    raw = ctx.raw_w  # type: ignore[attr-defined]
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(raw)
    if where == "symlink-file-out":
        (out / "w.data").write_bytes(raw)
        os.symlink(out / "w.data", ctx.inp / "link.data")
    if where == "symlink-dir-out":
        (out / "w.data").write_bytes(raw)
        os.symlink(out, ctx.inp / "ldir")
    return lambda: run_onnx_entry(ctx.p["entry"], path, "mlp", ctx, _ext_truth(path, ctx))


def _ext_truth(path: Path, ctx: Context) -> np.ndarray:
    """What the model computes with its external data as onnx itself reads it (for a
    location inside the model's folder); the original output where onnx cannot read it."""
    try:
        import onnx
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(onnx.load(str(path))).run(None, {"x": ctx.ref("mlp")[0]})[0]
    except Exception:  # noqa: BLE001 - unreadable: only a refusal or the original is right
        return ctx.ref("mlp")[1]


EXT_OK = {"plain", "dot-slash", "subfolder"}


# -- hostile file names -----------------------------------------------------------------------
NAMES = {
    "quotes": "q\"uote's.onnx", "script": "<script>alert(1)<!--.onnx",
    "attr-break": "x\"><img src=x onerror=alert(1)>.onnx", "newline": "new\nline.onnx",
    "long": "L" * 240 + ".onnx", "unicode-space": "模型 空格.onnx", "dash": "-rf.onnx",
    "dots": "..onnx", "percent": "%2e%2e%2fx.onnx", "backslash": "back\\slash.onnx",
    "shell": "semi;colon$(id)`x`.onnx", "tab": "tab\tname.onnx", "emoji": "emoji😀.onnx",
    "ampersand": "&amp;&lt;.onnx",
}


def _netron_check(name: str) -> tuple[str, str]:
    from html.parser import HTMLParser

    from workbench.ui.netron_server import _netron_dir, index_html

    page = index_html(name, _netron_dir()).decode()
    benign = index_html("model.onnx", _netron_dir()).decode()

    class Tags(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[str] = []
            self.ident: str | None = None

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.tags.append(tag)
            d = dict(attrs)
            if tag == "meta" and d.get("name") == "identifier":
                self.ident = d.get("content")

    a, b = Tags(), Tags()
    a.feed(page)
    b.feed(benign)
    if a.tags != b.tags:
        return "wrong", f"the name changed the page's tags: {sorted(set(a.tags) ^ set(b.tags))}"
    if a.ident != name:
        return "wrong", f"identifier reads {a.ident!r}, not the file name"
    return "ok", "escaped"


def _name(ctx: Context) -> Action:
    name = NAMES[ctx.p["name"]]
    path = ctx.copy_in("tiny.onnx", name)
    entry = ctx.p["entry"]
    if entry == "netron":
        return lambda: _netron_check(name)
    if entry == "workspace":
        def act() -> tuple[str, str]:
            import workbench as wb
            from workbench.runtime import OrtRunner

            ws = wb.Workspace(ctx.ws_path / name.replace(".onnx", "-ws"))
            art = ws.import_file(ctx.model("tiny.onnx"))
            x, y = ctx.ref("tiny")
            return close(first(OrtRunner(art).run({"input": x})), y, what="output")
        return act
    return lambda: run_onnx_entry(entry, path, "tiny", ctx)


KINDS = {"ws_damage": _ws_damage, "ext_data": _ext, "hostile_name": _name}


def cases(rng: np.random.Generator) -> list[Case]:
    del rng  # every case here is enumerated, none sampled
    out: list[Case] = []
    hows = ["manifest-truncated", "manifest-empty", "manifest-null", "manifest-list",
            "manifest-no-artifacts", "manifest-artifacts-not-list", "manifest-entries-strings",
            "manifest-version-99", "manifest-garbage", "manifest-folder",
            "manifest-symlink-outside", "manifest-symlink-dangling", "manifest-record-traversal",
            "manifest-record-absolute", "manifest-record-duplicate", "manifest-record-id-only",
            "manifest-huge-whitespace", "sidecar-truncated", "sidecar-missing", "sidecar-folder",
            "sidecar-wrong-id", "sidecar-null", "sidecar-garbage", "sidecar-symlink-outside",
            "sidecar-and-manifest-truncated", "lock-folder", "lock-symlink-outside", "lock-fifo",
            "staging-leftover", "pnnx-leftover-old", "junk-artifact-folder", "main-file-deleted",
            "main-file-folder", "artifact-folder-is-file", "workspace-is-file"]
    for how in hows:
        out.append(Case(f"ws-{how}", "workspace", "ws_damage", {"how": how},
                        expect=WS_EXPECT.get(how, "ok"), damages=WS_DAMAGES.get(how, []),
                        timeout=40))
    for where in ("plain", "dot-slash", "subfolder", "parent", "parent-3", "sub-up-up",
                  "absolute", "symlink-file-out", "symlink-dir-out", "dev-zero", "empty",
                  "model-itself", "a-folder", "tilde", "nul-byte", "missing", "offset-past-end",
                  "length-too-long", "negative-offset"):
        for entry in ("import", "ort", "simplify"):
            out.append(Case(f"ext_data-{where}-{entry}", "hostile_path", "ext_data",
                            {"where": where, "entry": entry},
                            expect="ok" if where in EXT_OK else "error"))
    for key in NAMES:
        for entry in ("import", "ort", "netron", "workspace"):
            if entry == "workspace" and key in ("long",):
                continue
            out.append(Case(f"name-{key}-{entry}", "hostile_name", "hostile_name",
                            {"name": key, "entry": entry}, expect="ok"))
    for key in ("quotes", "script", "newline", "unicode-space", "shell"):
        out.append(Case(f"name-{key}-to_ncnn", "hostile_name", "hostile_name",
                        {"name": key, "entry": "to_ncnn"}, expect="ok", timeout=120))
    return out
