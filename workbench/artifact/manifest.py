"""The workspace's records read and written: ``manifest.json`` (the index of every artifact)
and each artifact folder's ``artifact.json`` (SIDECAR), reconciled so either record vouches
for an artifact. A corrupt manifest is kept aside and rebuilt from the sidecars; a sidecar
that is missing or unreadable is restored from the manifest; a record whose folder is gone
is kept under ``lost``. Each problem found goes to ``report(code, message, hint)``."""

from __future__ import annotations

import datetime as _dt
import json
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..environment import lock_status
from ..errors import ManifestError
from ..fileio import atomic_write_text
from .locking import Report
from .record import SIDECAR, Artifact

if TYPE_CHECKING:
    from .workspace import Workspace

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def scan_sidecars(folder: Path, workspace: Workspace,
                  errors: dict[str, str] | None = None) -> dict[str, Artifact]:
    """Artifacts whose folder holds a readable ``artifact.json`` naming that folder; why the
    others cannot be read goes into ``errors`` (by folder name) when given."""
    found: dict[str, Artifact] = {}
    for side in sorted(folder.glob(f"*/{SIDECAR}")):
        try:
            rec = json.loads(side.read_text(encoding="utf-8"))
            art = Artifact.from_record(rec, side.parent, workspace)
            if art.id != side.parent.name:
                raise ValueError(f"it names artifact {art.id!r}, not its folder's")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            if errors is not None:
                errors[side.parent.name] = str(e)
            continue
        found[art.id] = art
    return found


def read_manifest(path: Path, on_disk: int, report: Report) -> dict[str, Any] | None:
    """The manifest at ``path``, checked; None when it is missing or corrupt (a corrupt one
    is renamed aside and reported; ``on_disk``: the artifact records it is rebuilt from).

    Raises:
        ManifestError: the manifest is of another version.
    """
    if not path.exists():
        if on_disk:
            report("manifest-missing",
                   f"{path} was missing; rebuilt from {on_disk} artifact record(s)")
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict) or not isinstance(manifest.get("artifacts"), list):
            raise ValueError("no 'artifacts' list")
        if not all(isinstance(a, dict) and "id" in a for a in manifest["artifacts"]):
            raise ValueError("an entry of 'artifacts' is not an artifact record")
    except (ValueError, OSError) as e:  # OSError: manifest.json is a folder, say
        backup = path.with_name(
            f"manifest.json.corrupt-{_dt.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}")
        os.replace(path, backup)
        report("manifest-corrupt",
               f"{path} is not a valid manifest ({e}); kept as {backup.name} and rebuilt "
               f"from {on_disk} artifact record(s)",
               "compare the kept copy with the rebuilt manifest if anything looks missing")
        return None
    version = manifest.get("version")
    if version != MANIFEST_VERSION:
        raise ManifestError(
            f"{path} has manifest version {version!r}, expected {MANIFEST_VERSION}",
            "open it with the workbench version that wrote it, or use a new workspace folder")
    return manifest


def reconcile(folder: Path, manifest: dict[str, Any], on_disk: dict[str, Artifact],
              sidecar_errors: dict[str, str], report: Report, workspace: Workspace
              ) -> tuple[dict[str, Artifact], list[dict[str, Any]], bool]:
    """Fold the manifest's records into the sidecars' view: the artifacts (by id, sorted),
    the records kept under ``lost``, and whether anything changed.

    Either record vouches for an artifact: a folder whose ``artifact.json`` is missing,
    unreadable or names another id is restored from the manifest (and its sidecar
    rewritten); a record whose folder is gone is kept under ``lost`` in the manifest.
    """
    changed = False
    artifacts = dict(on_disk)
    kept_lost = manifest.get("lost") if isinstance(manifest.get("lost"), list) else []
    lost = [r for r in kept_lost if isinstance(r, dict)]
    for rec in manifest["artifacts"]:
        art_id = rec.get("id")
        if not isinstance(art_id, str) or art_id in artifacts:
            continue
        art = _restore(folder, rec, sidecar_errors.get(art_id, "missing"), report, workspace)
        if art is None:
            lost.append(rec)
        else:
            artifacts[art_id] = art
        changed = True
    listed = {a.get("id") for a in manifest["artifacts"]}
    unlisted = sorted(set(artifacts) - listed)
    if unlisted:
        report("manifest-out-of-step",
               f"artifact folder(s) {unlisted} hold records the manifest did not "
               "list (written by a process that stopped before updating it); added",
               "nothing to do")
        changed = True
    return dict(sorted(artifacts.items())), lost, changed


def _restore(folder: Path, rec: dict[str, Any], why: str, report: Report,
             workspace: Workspace) -> Artifact | None:
    """The artifact a manifest record names whose sidecar did not vouch for it, its
    ``artifact.json`` rewritten; None (reported) when its folder is gone or the record
    cannot be read."""
    art_id = rec["id"]
    art_dir = folder / art_id
    if "/" in art_id or art_id.startswith(".") or not art_dir.is_dir():
        report("artifact-folder-missing",
               f"manifest lists artifact {art_id!r} but its folder is gone; its "
               "record is kept under 'lost' in manifest.json",
               "restore the folder from a copy if you need the artifact")
        return None
    try:
        art = Artifact.from_record(rec, art_dir, workspace)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        report("artifact-record-unreadable",
               f"neither {art_dir / SIDECAR} nor the manifest's record of "
               f"{art_id!r} can be read ({e}); the record is kept under 'lost'",
               "inspect the folder; remove it by hand if it is not wanted")
        return None
    try:
        atomic_write_text(art_dir / SIDECAR, json.dumps(rec, indent=2, default=str))
        rewritten = "; its artifact.json rewritten"
    except OSError as e:  # e.g. a folder in its place: the manifest still holds it
        rewritten = f"; artifact.json could not be rewritten ({e.strerror or e})"
    report("artifact-record-restored",
           f"{art_dir / SIDECAR} was missing or unreadable ({why}); restored from "
           f"manifest.json{rewritten}", "check the artifact with ws.verify()")
    return art


def report_unvouched(folder: Path, sidecar_errors: dict[str, str],
                     artifacts: dict[str, Artifact], report: Report) -> None:
    """Folders whose ``artifact.json`` cannot be read and that no manifest record restored:
    reported, left as they are."""
    for name, why in sorted(sidecar_errors.items()):
        if name not in artifacts:
            report("artifact-record-unreadable",
                   f"{folder / name / SIDECAR} cannot be read ({why}) and the "
                   "manifest has no record of it; the folder is left as it is",
                   "inspect the folder; remove it by hand if it is not wanted")


def write_manifest(folder: Path, artifacts: dict[str, Artifact],
                   lost: list[dict[str, Any]]) -> None:
    """``manifest.json`` for ``artifacts``, written atomically; records whose folders are
    gone (``lost``) are kept, never dropped."""
    doc = {"version": MANIFEST_VERSION, "workspace": str(folder), "updated": now(),
           "environment": lock_status().to_record(),
           "artifacts": [a.to_record() for a in artifacts.values()]}
    if lost:
        doc["lost"] = lost  # records whose folders are gone: never dropped
    atomic_write_text(folder / MANIFEST, json.dumps(doc, indent=2, default=str))
