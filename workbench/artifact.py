"""Artifacts and the Workspace that records them.

A Workspace is a folder: one sub-folder per artifact (its files plus an ``artifact.json``
sidecar) and a ``manifest.json`` index of every artifact. Writes are atomic (temp file or
staging folder + rename) and nothing is overwritten: running a stage again makes a new
artifact. The sidecars make the manifest rebuildable when it is missing or corrupt.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import functools
import json
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .diagnostics import Diagnostic
from .environment import lock_status
from .errors import InputError, ManifestError, ModelFileError, WorkspaceError
from .fileio import atomic_write_text, sha256_file
from .graph import summarize, summarize_ncnn
from .onnx_io import check_model_file, external_data_files

if TYPE_CHECKING:
    from .graph import GraphSummary

MANIFEST_VERSION = 1
SIDECAR = "artifact.json"
DEFAULT_ROOT = Path("workbench-runs")
TOOLS = ("torch", "onnx", "onnxruntime", "onnxslim", "onnxsim", "onnxscript", "onnx-ir",
         "pnnx", "ncnn", "deploy-workbench")


@functools.lru_cache(maxsize=1)
def tool_versions() -> dict[str, str]:
    """Installed versions of the tools a stage may use (read from metadata, nothing imported),
    the Python, and the sha256 of the lock ``make`` installed the environment from (with
    ``lock-matches``: whether the installed versions are still the locked ones)."""
    import platform
    from importlib import metadata


    out = {}
    for name in TOOLS:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["python"] = platform.python_version()
    lock = lock_status()
    out["lock-sha256"] = lock.sha256 or "none (not installed by make)"
    if lock.matches is not None:
        out["lock-matches"] = ("yes" if lock.matches
                               else f"no: {len(lock.differs)} package(s) differ")
    return out


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


@dataclass(eq=False)
class Artifact:
    """One output of one stage: files on disk plus what made them (lineage, params, tools)."""

    id: str
    stage: str
    format: str
    path: Path
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    parent_id: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    tools: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    diagnostics: list[Diagnostic] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    workspace: Workspace | None = field(default=None, repr=False)
    _graph: Any = field(default=None, repr=False)

    @property
    def dir(self) -> Path:
        return self.path.parent

    @property
    def parent(self) -> Artifact | None:
        if self.parent_id is None or self.workspace is None:
            return None
        return self.workspace.get(self.parent_id)

    def lineage(self) -> list[Artifact]:
        """This artifact and its ancestors, oldest first."""
        chain: list[Artifact] = []
        node: Artifact | None = self
        while node is not None and node not in chain:
            chain.append(node)
            node = node.parent
        return chain[::-1]

    @property
    def graph(self) -> GraphSummary:
        if self._graph is None:
            pnnx = next((a for a in reversed(self.lineage()[:-1]) if a.format == "pnnx"),
                        None) if self.format == "ncnn" else None  # its shapes: pnnx's graph
            self._graph = (summarize_ncnn(self.path, pnnx.path) if pnnx is not None
                           else summarize(self.path))
        return self._graph

    @property
    def ok(self) -> bool:
        """False when any diagnostic is an error (a numeric mismatch, a checker failure...)."""
        return not any(d.level == "error" for d in self.diagnostics)

    def diagnostics_with(self, code: str) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.code == code]

    def summary(self) -> str:
        g = self.graph
        err = self.metrics.get("max_abs")
        err_s = f", max abs {err:.3g}" if isinstance(err, (int, float)) else ""
        issues = sum(d.level != "info" for d in self.diagnostics)
        return (f"{self.id}: {self.format} from {self.stage}, {g.node_count} nodes"
                f"{err_s}, {self.seconds:.2f} s, {issues} warning(s)/error(s)")

    def to_record(self) -> dict[str, Any]:
        return {
            "id": self.id, "stage": self.stage, "format": self.format,
            "main": self.path.name, "files": self.files, "parent": self.parent_id,
            "params": self.params, "tools": self.tools, "seconds": round(self.seconds, 4),
            "diagnostics": [d.to_dict() for d in self.diagnostics],
            "metrics": self.metrics, "created": self.created,
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any], folder: Path,
                    workspace: Workspace | None = None) -> Artifact:
        return cls(
            id=rec["id"], stage=rec["stage"], format=rec["format"],
            path=folder / rec["main"], files=rec.get("files", {}), parent_id=rec.get("parent"),
            params=rec.get("params", {}), tools=rec.get("tools", {}),
            seconds=rec.get("seconds", 0.0),
            diagnostics=[Diagnostic.from_dict(d) for d in rec.get("diagnostics", [])],
            metrics=rec.get("metrics", {}), created=rec.get("created", ""), workspace=workspace,
        )

    def check_files(self) -> None:
        """Refuse an artifact whose files changed on disk since its stage wrote them (the
        sha256 its record holds), or ModelFileError naming the file: a runner or stage given
        it would otherwise run on bytes nobody checked (a bit flipped, another model's
        weights copied over). A file is hashed once per size and mtime (see _verified)."""

        for rel, meta in self.files.items():
            want = meta.get("sha256") if isinstance(meta, dict) else None
            if not want:
                continue
            f = self.dir / rel
            hint = (f"artifact {self.id} ({self.stage}) is no longer what its stage wrote: run "
                    f"the stage again, or, if you changed the file on purpose, import it as "
                    f"a new artifact (ws.import_file({str(f)!r}))")
            try:
                st = f.stat()
            except OSError:
                raise ModelFileError(f"artifact {self.id}: its file {rel} is missing", hint) \
                    from None
            if not f.is_file():
                raise ModelFileError(f"artifact {self.id}: {rel} is no longer a file", hint)
            key = (str(f), st.st_size, st.st_mtime_ns, st.st_ino)
            if _VERIFIED.get(key) == want:
                continue
            got = sha256_file(f)
            if got != want:
                raise ModelFileError(
                    f"artifact {self.id}: {rel} changed since its {self.stage} stage wrote it "
                    f"(sha256 {got[:12]}..., recorded {want[:12]}...; "
                    f"{meta.get('bytes', '?')} bytes recorded, {st.st_size} now)", hint)
            _VERIFIED[key] = want

    def __repr__(self) -> str:
        return f"Artifact({self.id!r}, format={self.format!r}, path='{self.path}')"


# files whose sha256 matched their record, by (path, size, mtime, inode): hashed once, not at
# every runner made from the artifact
_VERIFIED: dict[tuple[str, int, int, int], str] = {}


class Workspace:
    """A folder of artifacts with a ``manifest.json`` index.

    ``problems`` lists what was found wrong with the manifest when the workspace was opened
    (missing, corrupt, out of step with the artifact folders); each is also a warning.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        """Open (or create) the workspace at ``path``.

        Args:
            path: a folder; None is ``workbench-runs/default``. An existing manifest is
                read and checked against the artifact folders (see ``problems``).

        Raises:
            WorkspaceError: the folder cannot be created or written, or is a file.
        """
        if path is None:
            path = DEFAULT_ROOT / "default"
        self.path = Path(path).absolute()
        self.problems: list[Diagnostic] = []
        self._ensure_writable()
        self._artifacts: dict[str, Artifact] = {}
        with self._lock():
            self._load()

    # -- opening ---------------------------------------------------------------------------
    def _ensure_writable(self) -> None:
        hint = ("pass a folder you can write to, e.g. wb.Workspace('runs/mymodel'), "
                "or leave workspace=None for ./workbench-runs/default")
        if self.path.exists() and not self.path.is_dir():
            raise WorkspaceError(f"workspace {str(self.path)!r} is a file, expected a folder",
                                 hint)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".write-probe-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise WorkspaceError(
                f"workspace {str(self.path)!r} is not writable: {e.strerror or e}", hint
            ) from e

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        try:
            f = open(self.path / ".lock", "a+")  # noqa: SIM115 - closed below
        except OSError as e:  # a folder in its place, no permission...
            raise WorkspaceError(
                f"workspace {str(self.path)!r}: its lock file .lock cannot be opened "
                f"({e.strerror or e})", "remove whatever is at .lock in the workspace folder "
                "(the workbench makes it again), or use another folder") from e
        with f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _report(self, code: str, message: str, hint: str = "") -> None:
        diag = Diagnostic("warning", code, message, hint)
        self.problems.append(diag)
        warnings.warn(f"{code}: {message}", stacklevel=3)

    def _scan_sidecars(self, report: bool = True) -> dict[str, Artifact]:
        """Artifacts whose folder holds a readable ``artifact.json`` naming that folder."""
        found: dict[str, Artifact] = {}
        for side in sorted(self.path.glob(f"*/{SIDECAR}")):
            try:
                rec = json.loads(side.read_text(encoding="utf-8"))
                art = Artifact.from_record(rec, side.parent, self)
                if art.id != side.parent.name:
                    raise ValueError(f"it names artifact {art.id!r}, not its folder's")
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                if report:
                    self._sidecar_errors[side.parent.name] = str(e)
                continue
            found[art.id] = art
        return found

    def _load(self) -> None:
        self._sidecar_errors: dict[str, str] = {}
        self._lost: list[dict[str, Any]] = []
        self._clean_leftovers()
        on_disk = self._scan_sidecars()
        manifest: dict[str, Any] | None = None
        if self.manifest_path.exists():
            try:
                manifest = json.loads(self.manifest_path.read_text(encoding="utf-8"))
                if not isinstance(manifest, dict) or not isinstance(manifest.get("artifacts"),
                                                                      list):
                    raise ValueError("no 'artifacts' list")
                if not all(isinstance(a, dict) and "id" in a for a in manifest["artifacts"]):
                    raise ValueError("an entry of 'artifacts' is not an artifact record")
            except (ValueError, OSError) as e:  # OSError: manifest.json is a folder, say
                backup = self.manifest_path.with_name(
                    f"manifest.json.corrupt-{_dt.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}")
                os.replace(self.manifest_path, backup)
                self._report("manifest-corrupt",
                             f"{self.manifest_path} is not a valid manifest ({e}); kept as "
                             f"{backup.name} and rebuilt from {len(on_disk)} artifact record(s)",
                             "compare the kept copy with the rebuilt manifest if anything "
                             "looks missing")
                manifest = None
            else:
                version = manifest.get("version")
                if version != MANIFEST_VERSION:
                    raise ManifestError(
                        f"{self.manifest_path} has manifest version {version!r}, expected "
                        f"{MANIFEST_VERSION}",
                        "open it with the workbench version that wrote it, or use a new "
                        "workspace folder")
        elif on_disk:
            self._report("manifest-missing",
                         f"{self.manifest_path} was missing; rebuilt from {len(on_disk)} "
                         "artifact record(s)")
        self._artifacts = on_disk
        changed = manifest is None and (bool(on_disk) or not self.manifest_path.exists())
        if manifest is not None:
            changed |= self._reconcile(manifest)
        for folder, why in sorted(self._sidecar_errors.items()):
            if folder not in self._artifacts:  # neither record vouches for it: left alone
                self._report("artifact-record-unreadable",
                             f"{self.path / folder / SIDECAR} cannot be read ({why}) and the "
                             "manifest has no record of it; the folder is left as it is",
                             "inspect the folder; remove it by hand if it is not wanted")
        if changed:
            self._write_manifest()

    def _reconcile(self, manifest: dict[str, Any]) -> bool:
        """Fold the manifest's records into the sidecars' view; True if anything changed.

        Either record vouches for an artifact: a folder whose ``artifact.json`` is missing,
        unreadable or names another id is restored from the manifest (and its sidecar
        rewritten); a record whose folder is gone is kept under ``lost`` in the manifest.
        """
        changed = False
        kept_lost = manifest.get("lost") if isinstance(manifest.get("lost"), list) else []
        self._lost = [r for r in kept_lost if isinstance(r, dict)]
        for rec in manifest["artifacts"]:
            art_id = rec.get("id")
            if not isinstance(art_id, str) or art_id in self._artifacts:
                continue
            folder = self.path / art_id
            if "/" in art_id or art_id.startswith(".") or not folder.is_dir():
                self._lost.append(rec)
                self._report("artifact-folder-missing",
                             f"manifest lists artifact {art_id!r} but its folder is gone; its "
                             "record is kept under 'lost' in manifest.json",
                             "restore the folder from a copy if you need the artifact")
                changed = True
                continue
            try:
                art = Artifact.from_record(rec, folder, self)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                self._lost.append(rec)
                self._report("artifact-record-unreadable",
                             f"neither {folder / SIDECAR} nor the manifest's record of "
                             f"{art_id!r} can be read ({e}); the record is kept under 'lost'",
                             "inspect the folder; remove it by hand if it is not wanted")
                changed = True
                continue
            self._artifacts[art_id] = art
            try:
                atomic_write_text(folder / SIDECAR, json.dumps(rec, indent=2, default=str))
                rewritten = "; its artifact.json rewritten"
            except OSError as e:  # e.g. a folder in its place: the manifest still holds it
                rewritten = f"; artifact.json could not be rewritten ({e.strerror or e})"
            self._report("artifact-record-restored",
                         f"{folder / SIDECAR} was missing or unreadable "
                         f"({self._sidecar_errors.get(art_id, 'missing')}); restored from "
                         f"manifest.json{rewritten}", "check the artifact with ws.verify()")
            changed = True
        listed = {a.get("id") for a in manifest["artifacts"]}
        unlisted = sorted(set(self._artifacts) - listed)
        if unlisted:
            self._report("manifest-out-of-step",
                         f"artifact folder(s) {unlisted} hold records the manifest did not "
                         "list (written by a process that stopped before updating it); added",
                         "nothing to do")
            changed = True
        self._artifacts = dict(sorted(self._artifacts.items()))
        return changed

    def _clean_leftovers(self) -> None:
        """Remove staging folders of stages that were killed; list old pnnx temp folders.

        A live stage holds an flock on ``.staging-<id>.lock``; a folder whose lock can be
        taken belongs to no running process. pnnx's temporary folders hold no lock: those
        untouched for an hour are listed in ``problems``, not removed.
        """
        for d in self.path.glob(".staging-*"):
            if not d.is_dir():
                continue
            lock = d.with_name(d.name + ".lock")
            try:
                with open(lock, "a+") as f:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a stage is writing there now
            shutil.rmtree(d, ignore_errors=True)
            lock.unlink(missing_ok=True)
            self._report("staging-removed", f"removed {d.name}, left by a stage that was "
                         "stopped before it finished", "nothing to do")
        for lock in self.path.glob(".staging-*.lock"):
            if not lock.with_suffix("").exists():
                lock.unlink(missing_ok=True)
        now = time.time()
        for d in self.path.glob("wb-pnnx-*"):
            if d.is_dir() and now - d.stat().st_mtime > 3600:
                self._report("leftover-temp-folder",
                             f"{d} is a pnnx temporary folder left by a conversion that was "
                             "stopped", f"remove it: shutil.rmtree({str(d)!r})")

    def _write_manifest(self) -> None:

        doc = {"version": MANIFEST_VERSION, "workspace": str(self.path), "updated": _now(),
               "environment": lock_status().to_record(),
               "artifacts": [a.to_record() for a in self._artifacts.values()]}
        if getattr(self, "_lost", None):
            doc["lost"] = self._lost  # records whose folders are gone: never dropped
        atomic_write_text(self.manifest_path, json.dumps(doc, indent=2, default=str))

    # -- reading ---------------------------------------------------------------------------
    @property
    def artifacts(self) -> list[Artifact]:
        return list(self._artifacts.values())

    def get(self, artifact_id: str) -> Artifact:
        try:
            return self._artifacts[artifact_id]
        except KeyError:
            raise InputError(
                f"no artifact {artifact_id!r} in workspace {self.path}",
                f"known ids: {', '.join(self._artifacts) or 'none yet'}") from None

    __getitem__ = get

    def __len__(self) -> int:
        return len(self._artifacts)

    def __iter__(self) -> Iterator[Artifact]:
        return iter(self.artifacts)

    def __repr__(self) -> str:
        return f"Workspace('{self.path}', {len(self)} artifacts)"

    def verify(self) -> list[str]:
        """Check every artifact's files against the sha256 recorded; return the problems."""
        problems = []
        for art in self.artifacts:
            for rel, meta in art.files.items():
                f = art.dir / rel
                if not f.exists():
                    problems.append(f"{art.id}: {rel} is missing")
                elif not f.is_file():
                    problems.append(f"{art.id}: {rel} is no longer a file (a folder?)")
                elif sha256_file(f) != meta.get("sha256"):
                    problems.append(f"{art.id}: {rel} changed since it was written (sha256)")
        return problems

    # -- writing ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        """A fresh folder inside the workspace for a stage to write into before ``commit``."""
        d = self.path / f".staging-{uuid.uuid4().hex}"
        # held while the stage runs: reopening the workspace leaves a live stage's folder be
        with open(d.with_name(d.name + ".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            d.mkdir()
            try:
                yield d
            finally:
                if d.exists():
                    shutil.rmtree(d, ignore_errors=True)
                os.unlink(lock.name)

    def commit(self, staging: Path, *, stage: str, format: str, main: str,
               parent: Artifact | None = None, params: dict[str, Any] | None = None,
               seconds: float = 0.0, diagnostics: list[Diagnostic] | None = None,
               metrics: dict[str, Any] | None = None) -> Artifact:
        """Turn a staging folder into a new artifact: hash files, rename, update the manifest."""
        files = {
            str(p.relative_to(staging)): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
            for p in sorted(staging.rglob("*")) if p.is_file() and p.name != SIDECAR
        }
        if main not in files:
            raise WorkspaceError(f"stage {stage!r} did not write its main file {main!r}",
                                 "this is a workbench bug; please report it")
        safe_stage = re.sub(r"[^a-z0-9]+", "-", stage.lower()).strip("-") or "stage"
        with self._lock():
            # another process may have committed since we loaded: re-read the sidecars
            for art_id, art in self._scan_sidecars(report=False).items():
                self._artifacts.setdefault(art_id, art)  # keep the objects callers hold
            n = 1 + max((int(i.split("-", 1)[0]) for i in self._artifacts
                         if i.split("-", 1)[0].isdigit()), default=0)
            art_id = f"{n:04d}-{safe_stage}"
            art = Artifact(
                id=art_id, stage=stage, format=format, path=self.path / art_id / main,
                files=files, parent_id=parent.id if parent is not None else None,
                params=_jsonable(params or {}), tools=dict(tool_versions()), seconds=seconds,
                diagnostics=list(diagnostics or []), metrics=_jsonable(metrics or {}),
                created=_now(), workspace=self,
            )
            atomic_write_text(staging / SIDECAR, json.dumps(art.to_record(), indent=2,
                                                            default=str))
            os.rename(staging, self.path / art_id)
            self._artifacts[art_id] = art
            self._write_manifest()
        return art

    def import_file(self, path: str | os.PathLike[str], format: str | None = None) -> Artifact:
        """Copy a model file (and the external-data files it names) in as an ``import`` artifact."""

        src = Path(path)
        fmt = format or check_model_file(src)
        t0 = time.perf_counter()
        with self.staging() as d:
            shutil.copy2(src, d / src.name)
            if fmt == "onnx":  # locations checked to stay in src's folder (and so in d)
                for rel in external_data_files(src):
                    if not (src.parent / rel).is_file():
                        raise ModelFileError(
                            f"{str(src)!r} names external data {rel!r}, which is not a file "
                            f"in {str(src.parent)!r}",
                            "keep the .onnx file and its .data file(s) together in one "
                            "folder, then import again")
                    (d / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src.parent / rel, d / rel)
            return self.commit(d, stage="import", format=fmt, main=src.name,
                               params={"source": str(src.absolute())}, seconds=time.perf_counter() - t0)


def _jsonable(obj: Any) -> Any:
    """Params and metrics as plain JSON values (tuples -> lists, paths -> str, numpy -> float)."""
    return json.loads(json.dumps(obj, default=_json_default))


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):  # numpy arrays and scalars, torch tensors
        return o.tolist()
    if hasattr(o, "item") and callable(o.item):
        return o.item()
    return str(o)


_DEFAULT: dict[Path, Workspace] = {}


def as_workspace(ws: Workspace | str | os.PathLike[str] | None) -> Workspace:
    """A Workspace from a Workspace, a path, or None (the default under ./workbench-runs/)."""
    if isinstance(ws, Workspace):
        return ws
    if ws is None:
        key = (DEFAULT_ROOT / "default").absolute()
        if key not in _DEFAULT:
            _DEFAULT[key] = Workspace(key)
        return _DEFAULT[key]
    if isinstance(ws, (str, os.PathLike)):
        return Workspace(ws)
    raise InputError(f"workspace must be a Workspace, a path or None, got {type(ws).__name__}",
                     "pass workspace=wb.Workspace('runs/mymodel')")
