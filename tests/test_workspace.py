"""Workspace, Artifact and Diagnostic: folders, manifest, sidecars, lineage, atomic writes."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import workbench.artifact as artifact_mod
from workbench.artifact import SIDECAR, Artifact, Diagnostic, Workspace, as_workspace
from workbench.errors import InputError, ManifestError, ModelFileError, WorkspaceError

# -- helpers -------------------------------------------------------------------------------


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _commit(ws: Workspace, stage: str = "export", content: bytes = b"model bytes",
            main: str = "model.onnx", parent: Artifact | None = None, **kw) -> Artifact:
    """Commit one artifact whose main file holds ``content`` (plus a small extra file)."""
    with ws.staging() as d:
        (d / main).write_bytes(content)
        (d / "notes").mkdir()
        (d / "notes" / "log.txt").write_text(f"log of {stage}\n")
        return ws.commit(d, stage=stage, format="onnx", main=main, parent=parent, **kw)


def _manifest(ws: Workspace) -> dict:
    return json.loads(ws.manifest_path.read_text(encoding="utf-8"))


def _open_quietly(path: Path) -> Workspace:
    """Open a workspace and fail if it warns about anything."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ws = Workspace(path)
    assert ws.problems == []
    return ws


def _tiny_onnx(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


# -- commit, manifest, sidecar -------------------------------------------------------------


def test_commit_creates_folder_with_files_and_sidecar(tmp_path):
    ws = Workspace(tmp_path / "ws")
    art = _commit(ws, content=b"\x08\x07 onnx-ish bytes", params={"opset": 17}, seconds=1.23456)
    folder = ws.path / art.id
    assert art.id == "0001-export"
    assert art.path == folder / "model.onnx"
    assert art.dir == folder
    assert (folder / "model.onnx").read_bytes() == b"\x08\x07 onnx-ish bytes"
    assert (folder / "notes" / "log.txt").read_text() == "log of export\n"
    side = json.loads((folder / SIDECAR).read_text())
    assert side == art.to_record()
    assert side["main"] == "model.onnx"
    assert set(side["files"]) == {"model.onnx", "notes/log.txt"}  # the sidecar is not listed
    assert ws.get(art.id) is art and len(ws) == 1


def test_manifest_records_everything(tmp_path):
    ws = Workspace(tmp_path / "ws")
    art = _commit(ws, params={"opset": 17, "names": ("input",)}, seconds=1.23456)
    doc = _manifest(ws)
    assert doc["version"] == artifact_mod.MANIFEST_VERSION
    (rec,) = doc["artifacts"]
    assert rec["id"] == art.id
    assert rec["stage"] == "export"
    assert rec["format"] == "onnx"
    assert rec["parent"] is None
    assert rec["params"] == {"opset": 17, "names": ["input"]}
    for tool in ("torch", "onnx", "onnxruntime", "pnnx", "ncnn"):
        assert tool in rec["tools"]
    assert rec["tools"]["onnx"] == onnx.__version__
    # which environment made it: the lock make installed from, and whether it still holds
    import hashlib
    import sys
    from pathlib import Path

    lock = Path(sys.prefix) / "requirements.lock"
    if lock.is_file():  # installed by make (always, in make test)
        sha = hashlib.sha256(lock.read_bytes()).hexdigest()
        assert rec["tools"]["lock-sha256"] == sha
        assert doc["environment"]["lock_sha256"] == sha
        assert doc["environment"]["matches_lock"] is True, doc["environment"]["differs"]
        assert rec["tools"]["lock-matches"] == "yes"
    assert rec["seconds"] == pytest.approx(1.2346)
    assert rec["created"]
    for rel in ("model.onnx", "notes/log.txt"):
        f = art.dir / rel
        assert rec["files"][rel]["sha256"] == _sha(f)
        assert rec["files"][rel]["bytes"] == f.stat().st_size


def test_params_and_metrics_become_plain_json(tmp_path):
    ws = Workspace(tmp_path / "ws")
    art = _commit(ws, params={"shape": (1, 3), "where": Path("a/b"), "scale": np.float32(0.5),
                              "one": np.array([7])},
                  metrics={"max_abs": np.float64(1e-6)})
    assert art.params == {"shape": [1, 3], "where": "a/b", "scale": 0.5, "one": [7]}
    assert art.metrics == {"max_abs": 1e-6}
    assert _manifest(ws)["artifacts"][0]["params"] == art.params


def test_numpy_arrays_in_params_and_metrics_become_lists(tmp_path):
    ws = Workspace(tmp_path / "ws")
    art = _commit(ws, params={"mean": np.array([0.5, 0.25])},
                  metrics={"per_output": np.arange(3)})
    assert art.params == {"mean": [0.5, 0.25]}
    assert art.metrics == {"per_output": [0, 1, 2]}


def test_stage_name_is_made_safe_for_the_folder(tmp_path):
    ws = Workspace(tmp_path / "ws")
    art = _commit(ws, stage="Raise Ops / v2!")
    assert art.id == "0001-raise-ops-v2"
    assert art.stage == "Raise Ops / v2!"
    assert (ws.path / "0001-raise-ops-v2" / "model.onnx").is_file()


def test_same_stage_twice_makes_a_new_artifact_and_keeps_the_first(tmp_path):
    ws = Workspace(tmp_path / "ws")
    first = _commit(ws, content=b"first run")
    sha_before = _sha(first.path)
    second = _commit(ws, content=b"second run")
    assert first.id != second.id
    assert (first.id, second.id) == ("0001-export", "0002-export")
    assert first.path != second.path
    assert first.path.read_bytes() == b"first run"
    assert _sha(first.path) == sha_before == first.files["model.onnx"]["sha256"]
    assert second.path.read_bytes() == b"second run"
    assert [a["id"] for a in _manifest(ws)["artifacts"]] == [first.id, second.id]
    assert ws.verify() == []


def test_two_workspace_objects_on_one_folder_do_not_collide(tmp_path):
    ws1 = Workspace(tmp_path / "ws")
    ws2 = Workspace(tmp_path / "ws")
    a = _commit(ws1, content=b"a")
    b = _commit(ws2, content=b"b")
    assert a.id != b.id
    assert a.path.read_bytes() == b"a" and b.path.read_bytes() == b"b"
    assert {r["id"] for r in _manifest(ws2)["artifacts"]} == {a.id, b.id}
    assert {x.id for x in _open_quietly(tmp_path / "ws")} == {a.id, b.id}


def test_diagnostics_are_stored_and_read_back(tmp_path):
    ws = Workspace(tmp_path / "ws")
    diags = [Diagnostic("warning", "tracer-constant", "x.item() froze", "use a tensor op",
                        source="model.py:12"),
             Diagnostic("error", "numeric-mismatch", "max abs 3.0")]
    art = _commit(ws, diagnostics=diags)
    assert not art.ok
    assert [d.code for d in art.diagnostics_with("tracer-constant")] == ["tracer-constant"]
    again = _open_quietly(ws.path).get(art.id)
    assert [d.__dict__ for d in again.diagnostics] == [d.__dict__ for d in diags]
    assert not again.ok


def test_diagnostic_dict_and_str():
    d = Diagnostic("warning", "tracer-constant", "froze a number", "use torch ops",
                   source="m.py:3")
    assert Diagnostic.from_dict(d.to_dict()) == d
    bare = Diagnostic("info", "note", "just so you know")
    assert bare.to_dict() == {"level": "info", "code": "note", "message": "just so you know"}
    assert Diagnostic.from_dict(bare.to_dict()) == bare
    assert str(d) == "warning: tracer-constant [m.py:3]: froze a number\n    hint: use torch ops"
    assert str(bare) == "info: note: just so you know"


# -- lineage and reopening -----------------------------------------------------------------


def test_lineage(tmp_path):
    ws = Workspace(tmp_path / "ws")
    a = _commit(ws, stage="export")
    b = _commit(ws, stage="simplify", parent=a)
    c = _commit(ws, stage="raise", parent=b)
    assert a.parent is None and a.parent_id is None
    assert b.parent_id == a.id and b.parent.id == a.id
    assert c.parent_id == b.id and c.parent.id == b.id
    assert c.parent.parent.path == a.path
    assert [x.id for x in c.lineage()] == [a.id, b.id, c.id]
    assert a.lineage() == [a]
    recs = {r["id"]: r for r in _manifest(ws)["artifacts"]}
    assert recs[c.id]["parent"] == b.id and recs[b.id]["parent"] == a.id
    # lineage survives reopening
    ws2 = _open_quietly(ws.path)
    assert [x.id for x in ws2.get(c.id).lineage()] == [a.id, b.id, c.id]
    assert ws2.get(c.id).parent is ws2.get(b.id)


def test_reopen_sees_the_same_artifacts(tmp_path):
    ws = Workspace(tmp_path / "ws")
    a = _commit(ws, stage="export", params={"opset": 17}, seconds=0.5)
    b = _commit(ws, stage="simplify", parent=a, metrics={"max_abs": 0.25})
    manifest_before = ws.manifest_path.read_bytes()
    ws2 = _open_quietly(tmp_path / "ws")
    assert ws2 is not ws and len(ws2) == 2
    assert [x.id for x in ws2] == [a.id, b.id]
    for old in (a, b):
        new = ws2[old.id]
        assert new.to_record() == old.to_record()
        assert new.path == old.path
        assert new.workspace is ws2
    # a clean reopen does not rewrite the manifest
    assert ws.manifest_path.read_bytes() == manifest_before
    assert "2 artifacts" in repr(ws2)


def test_new_workspace_writes_an_empty_manifest(tmp_path):
    ws = _open_quietly(tmp_path / "a" / "b" / "ws")
    assert ws.path.is_dir()
    doc = _manifest(ws)
    assert doc["artifacts"] == [] and doc["version"] == artifact_mod.MANIFEST_VERSION
    assert len(ws) == 0


def test_get_unknown_id_lists_known_ids(tmp_path):
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(InputError) as e:
        ws.get("nope")
    assert "'nope'" in e.value.message
    assert "none yet" in e.value.hint
    a = _commit(ws)
    b = _commit(ws, stage="simplify")
    with pytest.raises(InputError) as e:
        ws.get("nope")
    assert "nope" in str(e.value)
    assert a.id in e.value.hint and b.id in e.value.hint
    with pytest.raises(InputError):
        ws["nope"]


# -- manifest repair -----------------------------------------------------------------------


def test_missing_manifest_is_rebuilt_from_sidecars(tmp_path):
    ws = Workspace(tmp_path / "ws")
    a = _commit(ws)
    b = _commit(ws, stage="simplify", parent=a)
    ws.manifest_path.unlink()
    with pytest.warns(UserWarning, match="manifest-missing"):
        ws2 = Workspace(ws.path)
    assert [p.code for p in ws2.problems] == ["manifest-missing"]
    assert ws2.problems[0].level == "warning"
    assert {x.id for x in ws2} == {a.id, b.id}
    assert ws2.get(b.id).parent is ws2.get(a.id)
    assert {r["id"] for r in _manifest(ws2)["artifacts"]} == {a.id, b.id}
    _open_quietly(ws.path)  # repaired for good


def test_corrupt_manifest_is_kept_and_rebuilt(tmp_path):
    ws = Workspace(tmp_path / "ws")
    a = _commit(ws)
    garbage = b"{ this is not json \x00\xff\xfe garbage"
    ws.manifest_path.write_bytes(garbage)
    with pytest.warns(UserWarning, match="manifest-corrupt"):
        ws2 = Workspace(ws.path)
    assert [p.code for p in ws2.problems] == ["manifest-corrupt"]
    (kept,) = ws.path.glob("manifest.json.corrupt-*")
    assert kept.read_bytes() == garbage
    assert kept.name in ws2.problems[0].message
    assert [r["id"] for r in _manifest(ws2)["artifacts"]] == [a.id]
    assert ws2.get(a.id).path == a.path
    _open_quietly(ws.path)


@pytest.mark.parametrize("doc", [[1, 2, 3], {"version": 1}, "just a string"],
                         ids=["list", "no-artifacts", "string"])
def test_manifest_of_the_wrong_shape_counts_as_corrupt(tmp_path, doc):
    ws = Workspace(tmp_path / "ws")
    a = _commit(ws)
    ws.manifest_path.write_text(json.dumps(doc))
    with pytest.warns(UserWarning, match="manifest-corrupt"):
        ws2 = Workspace(ws.path)
    assert [p.code for p in ws2.problems] == ["manifest-corrupt"]
    assert [r["id"] for r in _manifest(ws2)["artifacts"]] == [a.id]


@pytest.mark.parametrize("artifacts", [[1], "abc", [{"id": "0001-export"}, None]],
                         ids=["ints", "string", "none-entry"])
def test_manifest_with_bad_artifact_entries_counts_as_corrupt(tmp_path, artifacts):
    ws = Workspace(tmp_path / "ws")
    a = _commit(ws)
    ws.manifest_path.write_text(json.dumps({"version": 1, "artifacts": artifacts}))
    with pytest.warns(UserWarning, match="manifest-"):
        ws2 = Workspace(ws.path)
    assert ws2.problems
    assert [x.id for x in ws2] == [a.id]
    assert [r["id"] for r in _manifest(ws2)["artifacts"]] == [a.id]


def test_manifest_out_of_step_after_a_folder_is_deleted(tmp_path):
    import shutil

    ws = Workspace(tmp_path / "ws")
    a = _commit(ws)
    b = _commit(ws, stage="simplify", parent=a)
    shutil.rmtree(b.dir)
    with pytest.warns(UserWarning, match="artifact-folder-missing"):
        ws2 = Workspace(ws.path)
    assert [p.code for p in ws2.problems] == ["artifact-folder-missing"]
    assert b.id in ws2.problems[0].message
    assert [x.id for x in ws2] == [a.id]
    assert [r["id"] for r in _manifest(ws2)["artifacts"]] == [a.id]
    assert [r["id"] for r in _manifest(ws2)["lost"]] == [b.id]  # the record is never dropped
    _open_quietly(ws.path)
    assert [r["id"] for r in _manifest(ws2)["lost"]] == [b.id]


def test_manifest_out_of_step_when_it_lists_fewer(tmp_path):
    ws = Workspace(tmp_path / "ws")
    a = _commit(ws)
    b = _commit(ws, stage="simplify")
    doc = _manifest(ws)
    doc["artifacts"] = [r for r in doc["artifacts"] if r["id"] == a.id]
    ws.manifest_path.write_text(json.dumps(doc))
    with pytest.warns(UserWarning, match="manifest-out-of-step"):
        ws2 = Workspace(ws.path)
    assert [p.code for p in ws2.problems] == ["manifest-out-of-step"]
    assert b.id in ws2.problems[0].message
    assert {x.id for x in ws2} == {a.id, b.id}
    assert {r["id"] for r in _manifest(ws2)["artifacts"]} == {a.id, b.id}
    # the next commit continues the numbering past every folder on disk
    assert _commit(ws2, stage="raise").id == "0003-raise"


def test_manifest_with_unknown_version_raises(tmp_path):
    ws = Workspace(tmp_path / "ws")
    _commit(ws)
    doc = _manifest(ws)
    doc["version"] = 99
    ws.manifest_path.write_text(json.dumps(doc))
    before = ws.manifest_path.read_bytes()
    with pytest.raises(ManifestError) as e:
        Workspace(ws.path)
    assert "99" in e.value.message
    assert str(ws.manifest_path) in e.value.message
    assert e.value.hint
    # nothing written before is lost
    assert ws.manifest_path.read_bytes() == before
    assert not list(ws.path.glob("manifest.json.corrupt-*"))


# -- unwritable workspaces -----------------------------------------------------------------


def test_workspace_path_is_a_file(tmp_path):
    f = tmp_path / "runs"
    f.write_text("I am a file")
    with pytest.raises(WorkspaceError) as e:
        Workspace(f)
    assert str(f) in e.value.message
    assert "file" in e.value.message
    assert e.value.hint
    assert isinstance(e.value, OSError)
    assert f.read_text() == "I am a file"


@pytest.mark.parametrize("depth", [1, 3])
def test_workspace_parent_is_a_file(tmp_path, depth):
    f = tmp_path / "blocker"
    f.write_text("x")
    target = f.joinpath(*[f"d{i}" for i in range(depth)])
    with pytest.raises(WorkspaceError) as e:
        Workspace(target)
    assert str(target) in e.value.message
    assert "not writable" in e.value.message
    assert e.value.hint
    assert f.read_text() == "x"


# -- atomic writes -------------------------------------------------------------------------


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".staging-")
            or p.name.endswith(".tmp")]


def test_no_leftover_staging_or_temp_files_after_commits(tmp_path):
    ws = Workspace(tmp_path / "ws")
    a = _commit(ws)
    _commit(ws, stage="simplify", parent=a)
    assert _leftovers(ws.path) == []
    assert sorted(p.name for p in ws.path.iterdir() if not p.name.startswith(".")) == [
        "0001-export", "0002-simplify", "manifest.json"]


def test_failed_commit_leaves_nothing(tmp_path):
    ws = Workspace(tmp_path / "ws")
    a = _commit(ws)
    manifest_before = ws.manifest_path.read_bytes()
    with pytest.raises(WorkspaceError) as e, ws.staging() as d:
        (d / "other.bin").write_bytes(b"not the main file")
        ws.commit(d, stage="export", format="onnx", main="model.onnx")
    assert "model.onnx" in e.value.message and e.value.hint
    assert [x.id for x in ws] == [a.id]
    assert ws.manifest_path.read_bytes() == manifest_before
    assert _leftovers(ws.path) == []
    assert sorted(p.name for p in ws.path.iterdir() if p.is_dir()) == [a.id]
    assert [x.id for x in _open_quietly(ws.path)] == [a.id]


def test_stage_that_raises_leaves_no_staging_folder(tmp_path):
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(RuntimeError, match="boom"), ws.staging() as d:
        assert d.parent == ws.path and d.is_dir()
        (d / "model.onnx").write_bytes(b"half written")
        raise RuntimeError("boom")
    assert _leftovers(ws.path) == []
    assert len(_open_quietly(ws.path)) == 0


# -- verify --------------------------------------------------------------------------------


def test_verify_reports_changed_and_missing_files(tmp_path):
    ws = Workspace(tmp_path / "ws")
    a = _commit(ws)
    b = _commit(ws, stage="simplify")
    assert ws.verify() == []
    a.path.write_bytes(b"edited by hand")
    (b.dir / "notes" / "log.txt").unlink()
    problems = ws.verify()
    assert len(problems) == 2
    assert any(a.id in p and "model.onnx" in p and "changed" in p for p in problems)
    assert any(b.id in p and "notes/log.txt" in p and "missing" in p for p in problems)
    # a reopened workspace sees the same damage
    assert sorted(Workspace(ws.path).verify()) == sorted(problems)


# -- import_file ---------------------------------------------------------------------------


def test_import_file_copies_an_onnx_model(tmp_path):
    src = _tiny_onnx(tmp_path / "tiny.onnx")
    ws = Workspace(tmp_path / "ws")
    art = ws.import_file(src)
    assert art.format == "onnx" and art.stage == "import"
    assert art.id == "0001-import"
    assert art.path == ws.path / art.id / "tiny.onnx"
    assert art.path.read_bytes() == src.read_bytes()
    assert art.files["tiny.onnx"]["sha256"] == _sha(src)
    assert art.params["source"] == str(src)
    assert src.exists()
    assert art.graph.op_histogram == {"Relu": 1}
    assert "1 nodes" in art.summary()
    assert _leftovers(ws.path) == []
    assert ws.verify() == []


def test_import_file_brings_external_data_along(tmp_path):
    import numpy.testing as npt
    from onnx import numpy_helper

    from workbench.runtime import ort_session

    w = np.arange(256, dtype=np.float32).reshape(16, 16)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "W"], ["y"])], "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 16])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    onnx.save_model(model, str(src_dir / "m.onnx"), save_as_external_data=True,
                    location="m.data", size_threshold=0)
    ws = Workspace(tmp_path / "ws")
    art = ws.import_file(src_dir / "m.onnx")
    assert set(art.files) == {"m.onnx", "m.data"}
    assert art.files["m.data"]["sha256"] == _sha(src_dir / "m.data")
    (y,) = ort_session.session(art.path).run(None, {"x": np.zeros((16, 16), np.float32)})
    npt.assert_array_equal(y, w)


def test_import_of_a_bad_file_adds_nothing(tmp_path):
    ws = Workspace(tmp_path / "ws")
    bad = tmp_path / "bad.onnx"
    bad.write_text("not a model")
    with pytest.raises(ModelFileError):
        ws.import_file(bad)
    with pytest.raises(ModelFileError):
        ws.import_file(tmp_path / "missing.onnx")
    assert len(ws) == 0
    assert _leftovers(ws.path) == []
    assert _manifest(ws)["artifacts"] == []


# -- default workspace ---------------------------------------------------------------------


def test_default_workspace_under_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(artifact_mod.workspace, "_DEFAULT", {})
    ws = as_workspace(None)
    assert ws.path == tmp_path / "workbench-runs" / "default"
    assert ws.path.is_dir() and ws.manifest_path.is_file()
    assert as_workspace(None) is ws
    assert as_workspace(ws) is ws
    assert Workspace().path == ws.path


def test_as_workspace_from_path_and_bad_type(tmp_path):
    ws = as_workspace(tmp_path / "p")
    assert isinstance(ws, Workspace) and ws.path == tmp_path / "p"
    assert as_workspace(str(tmp_path / "s")).path == tmp_path / "s"
    with pytest.raises(InputError) as e:
        as_workspace(42)
    assert "int" in e.value.message and e.value.hint


# -- reopening keeps every artifact a record vouches for; killed stages cleaned ------------


@pytest.mark.parametrize("damage", ["missing", "corrupt", "wrong-id", "folder"])
def test_an_artifact_with_a_bad_sidecar_is_restored_from_the_manifest(tmp_path, damage):
    ws = Workspace(tmp_path / "ws")
    a = _commit(ws)
    b = _commit(ws, stage="simplify", parent=a)
    side = b.dir / "artifact.json"
    if damage == "missing":
        side.unlink()
    elif damage == "corrupt":
        side.write_text('{"id": "0002-simpl')
    elif damage == "wrong-id":
        rec = json.loads(side.read_text())
        side.write_text(json.dumps(dict(rec, id="0001-export")))
    else:  # the sidecar's name taken by a folder
        side.unlink()
        side.mkdir()
    with pytest.warns(UserWarning, match="artifact-record-restored"):
        ws2 = Workspace(ws.path)
    assert [x.id for x in ws2] == [a.id, b.id]
    assert ws2.get(b.id).parent_id == a.id and ws2.verify() == []
    assert [p.code for p in ws2.problems] == ["artifact-record-restored"]
    assert [r["id"] for r in _manifest(ws2)["artifacts"]] == [a.id, b.id]
    if damage != "folder":  # the sidecar is rewritten from the manifest's record
        assert json.loads(side.read_text())["id"] == b.id
        _open_quietly(ws.path)


def test_a_folder_neither_record_vouches_for_is_reported_and_left_alone(tmp_path):
    ws = Workspace(tmp_path / "ws")
    a = _commit(ws)
    stray = ws.path / "0002-mystery"
    stray.mkdir()
    (stray / "artifact.json").write_text("not json")
    with pytest.warns(UserWarning, match="artifact-record-unreadable"):
        ws2 = Workspace(ws.path)
    assert [x.id for x in ws2] == [a.id]
    assert "0002-mystery" in ws2.problems[0].message and ws2.problems[0].hint
    assert (stray / "artifact.json").read_text() == "not json"


def test_a_manifest_that_is_a_folder_is_set_aside_not_an_oserror(tmp_path):
    ws = Workspace(tmp_path / "ws")
    a = _commit(ws)
    ws.manifest_path.unlink()
    ws.manifest_path.mkdir()
    with pytest.warns(UserWarning, match="manifest-corrupt"):
        ws2 = Workspace(ws.path)
    assert [x.id for x in ws2] == [a.id]
    assert ws2.manifest_path.is_file()


def test_a_killed_stage_leaves_no_staging_folder_after_reopening(tmp_path):
    import subprocess
    import sys

    ws = Workspace(tmp_path / "ws")
    a = _commit(ws)
    script = ("import os, sys, workbench as wb\n"
              "ws = wb.Workspace(sys.argv[1])\n"
              "with ws.staging() as d:\n"
              "    (d / 'model.onnx').write_bytes(b'half')\n"
              "    os.kill(os.getpid(), 9)\n")
    run = subprocess.run([sys.executable, "-c", script, str(ws.path)], capture_output=True)
    assert run.returncode == -9
    assert len(list(ws.path.glob(".staging-*"))) == 2  # the folder and its lock
    with pytest.warns(UserWarning, match="staging-removed"):
        ws2 = Workspace(ws.path)
    assert list(ws.path.glob(".staging-*")) == []
    assert [x.id for x in ws2] == [a.id]


def test_a_live_stage_s_staging_folder_survives_a_reopen(tmp_path):
    ws = Workspace(tmp_path / "ws")
    with ws.staging() as d:
        (d / "model.onnx").write_bytes(b"x")
        ws2 = _open_quietly(ws.path)  # another process opening it meanwhile
        assert d.is_dir() and (d / "model.onnx").read_bytes() == b"x"
        art = ws.commit(d, stage="export", format="onnx", main="model.onnx")
    assert art.id in [x.id for x in Workspace(ws.path)] and ws2.problems == []
    assert list(ws.path.glob(".staging-*")) == []


def test_an_old_pnnx_temp_folder_is_listed(tmp_path):
    import os

    ws = Workspace(tmp_path / "ws")
    old = ws.path / "wb-pnnx-abc123"
    old.mkdir()
    os.utime(old, (0, 0))
    (ws.path / "wb-pnnx-fresh").mkdir()
    with pytest.warns(UserWarning, match="leftover-temp-folder"):
        ws2 = Workspace(ws.path)
    assert [p.code for p in ws2.problems] == ["leftover-temp-folder"]
    assert "wb-pnnx-abc123" in ws2.problems[0].message and "rmtree" in ws2.problems[0].hint


def test_a_folder_in_place_of_the_lock_file_is_a_workspace_error(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / ".lock").mkdir()
    with pytest.raises(WorkspaceError) as e:
        Workspace(tmp_path / "ws")
    assert ".lock cannot be opened" in e.value.message and "remove" in e.value.hint


def test_an_artifact_changed_on_disk_is_refused_by_runners_and_stages(tmp_path):
    import numpy as np

    import workbench as wb
    from workbench.errors import ModelFileError
    from workbench.runtime import OrtRunner

    ws = Workspace(tmp_path / "ws")
    art = ws.import_file(_tiny_onnx(tmp_path / "tiny.onnx"))
    x = np.ones((2, 3), np.float32)
    assert OrtRunner(art).run({"x": x})["y"].shape == (2, 3)  # intact: runs
    onnx.save(onnx.load(art.path), art.path)  # same graph, rewritten: not the recorded bytes
    data = bytearray(art.path.read_bytes())
    data[-1] ^= 1
    art.path.write_bytes(bytes(data))
    for make in (lambda: OrtRunner(art), lambda: wb.simplify(art)):
        with pytest.raises(ModelFileError) as e:
            make()
        assert f"artifact {art.id}: tiny.onnx changed since its import stage wrote it" in \
            e.value.message
        assert "ws.import_file(" in e.value.hint
