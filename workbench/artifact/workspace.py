"""The Workspace: a folder of artifacts, one sub-folder each (its files plus an
``artifact.json`` sidecar), indexed by ``manifest.json``.

Writes are atomic (temp file or staging folder + rename) and nothing is overwritten: running
a stage again makes a new artifact. The sidecars make the manifest rebuildable when it is
missing or corrupt (manifest.py); one process at a time reads or writes it (locking.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..capacity import disk_errors
from ..diagnostics import Diagnostic
from ..errors import InputError, ModelFileError, WorkspaceError
from ..fileio import atomic_write_text, hash_ahead, sha256_file, stat_record
from ..onnx_io import check_model_file, external_data_files
from .locking import clean_leftovers, staging_folder, workspace_lock
from .manifest import (
    MANIFEST,
    now,
    read_manifest,
    reconcile,
    report_unvouched,
    scan_sidecars,
    write_manifest,
)
from .record import SIDECAR, Artifact
from .rewrites import RewriteRecord
from .tools import tool_versions

DEFAULT_ROOT = Path("workbench-runs")


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
        self._lost: list[dict[str, Any]] = []  # records whose folders are gone: kept
        with workspace_lock(self.path):
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
        return self.path / MANIFEST

    def _report(self, code: str, message: str, hint: str = "") -> None:
        diag = Diagnostic("warning", code, message, hint)
        self.problems.append(diag)
        warnings.warn(f"{code}: {message}", stacklevel=3)

    def _load(self) -> None:
        """Read the sidecars and the manifest, reconcile them, and write the manifest again
        when they disagreed (every problem found is in ``problems``)."""
        clean_leftovers(self.path, self._report)
        sidecar_errors: dict[str, str] = {}
        on_disk = scan_sidecars(self.path, self, sidecar_errors)
        manifest = read_manifest(self.manifest_path, len(on_disk), self._report)
        self._artifacts = on_disk
        changed = manifest is None and (bool(on_disk) or not self.manifest_path.exists())
        if manifest is not None:
            self._artifacts, self._lost, reconciled = reconcile(
                self.path, manifest, on_disk, sidecar_errors, self._report, self)
            changed |= reconciled
        report_unvouched(self.path, sidecar_errors, self._artifacts, self._report)
        if changed:
            self._write_manifest()

    def _write_manifest(self) -> None:
        write_manifest(self.path, self._artifacts, self._lost)

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
    def staging(self, what: str = "the new artifact's files") -> Iterator[Path]:
        """A fresh folder inside the workspace for a stage to write into before ``commit``;
        removed unless committed. A disk that fills meanwhile (ENOSPC, a quota, ulimit -f)
        raises NotEnoughDisk naming the workspace, ``what`` and the bytes written when it
        stopped; nothing of the folder is kept."""
        with disk_errors(self.path, what), staging_folder(self.path) as d, \
                disk_errors(self.path, what, written_in=d, removed=True):
            yield d

    def commit(self, staging: Path, *, stage: str, format: str, main: str,
               parent: Artifact | None = None, params: dict[str, Any] | None = None,
               seconds: float = 0.0, diagnostics: list[Diagnostic] | None = None,
               metrics: dict[str, Any] | None = None,
               rewrites: list[RewriteRecord] | None = None) -> Artifact:
        """Turn a staging folder into a new artifact: hash files, rename, update the manifest
        (``rewrites``: the rewriters that fired while it was exported). A file the stage had
        hashed ahead (``prepare_commit``) and not changed since is not read again."""
        files = {}
        for p in _staged_files(staging):  # a digest, and the stat that lets a later check
            digest, stat = stat_record(p)  # trust the file without reading it again
            files[str(p.relative_to(staging))] = {"sha256": digest, "bytes": p.stat().st_size,
                                                  **stat}
        if main not in files:
            raise WorkspaceError(f"stage {stage!r} did not write its main file {main!r}",
                                 "this is a workbench bug; please report it")
        safe_stage = re.sub(r"[^a-z0-9]+", "-", stage.lower()).strip("-") or "stage"
        with workspace_lock(self.path):
            art_id = f"{self._next_number():04d}-{safe_stage}"
            art = Artifact(
                id=art_id, stage=stage, format=format, path=self.path / art_id / main,
                files=files, parent_id=parent.id if parent is not None else None,
                params=_jsonable(params or {}), tools=dict(tool_versions()), seconds=seconds,
                diagnostics=list(diagnostics or []), metrics=_jsonable(metrics or {}),
                created=now(), workspace=self, rewrites=list(rewrites or []),
            )
            atomic_write_text(staging / SIDECAR, json.dumps(art.to_record(), indent=2,
                                                            default=str))
            os.rename(staging, self.path / art_id)
            self._artifacts[art_id] = art
            self._write_manifest()
        return art

    @staticmethod
    def prepare_commit(staging: Path) -> None:
        """Start computing what ``commit`` needs, in threads, while the stage does other work
        (its numeric check waits on onnxruntime in a worker process): the sha256 of the
        files written in ``staging`` so far (fileio.hash_ahead) and the tool versions (read
        from the metadata of every installed package once per process: 0.6 s)."""
        hash_ahead(_staged_files(staging))
        if tool_versions.cache_info().currsize == 0:
            threading.Thread(target=tool_versions, daemon=True, name="wb-tools").start()

    def _next_number(self) -> int:
        """The next artifact number, counting what other processes committed since we
        loaded (their sidecars re-read; the objects callers hold are kept)."""
        for art_id, art in scan_sidecars(self.path, self).items():
            self._artifacts.setdefault(art_id, art)
        return 1 + max((int(i.split("-", 1)[0]) for i in self._artifacts
                        if i.split("-", 1)[0].isdigit()), default=0)

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


def _staged_files(staging: Path) -> list[Path]:
    """The files of a staging folder that its artifact records (not the sidecar)."""
    return [p for p in sorted(staging.rglob("*")) if p.is_file() and p.name != SIDECAR]


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
