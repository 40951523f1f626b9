"""A model's files checked against the sha256 its artifact recorded, before a runner loads them.

An Artifact checks its own files (``Artifact.check_files``). A model is as often given by
path (the CLI, notebooks, scripts: ``NcnnRunner("runs/x/0002-ncnn/model.ncnn.param")``); a
path inside an artifact folder, with its ``artifact.json`` beside it, is checked the same
way, so another model's ``.bin`` copied over is refused, not run. Files outside any artifact
folder are loaded as they are. The record is read once per (size, mtime) of the
``artifact.json``, and each file hashed once per (size, mtime): a repeated load stats, no more.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..artifact.record import SIDECAR, Artifact
from ..errors import ModelFileError
from . import worker_main

# artifact.json by (path, size, mtime, inode) -> the Artifact it records (None: unreadable)
_RECORDS: dict[tuple[str, int, int, int], Artifact | None] = {}


def check_recorded(source: Any, path: Path) -> None:
    """Refuse a model whose files changed since the stage that wrote them.

    Args:
        source: what the runner was given: an Artifact (its record is checked), or a path.
        path: the model file the runner loads.

    Raises:
        ModelFileError: a recorded file is missing or its sha256 differs; names the file.
    """
    if hasattr(source, "check_files"):  # an Artifact: its files as its stage wrote them
        source.check_files()
        return

    if worker_main.SERVING:  # the worker's twin of a runner the parent has checked
        return
    art = artifact_at(path)
    if art is None:
        return
    try:
        art.check_files()
    except ModelFileError as e:
        raise ModelFileError(
            f"{e.message} (the model {path.name} was given by path, in that artifact's "
            f"folder {art.dir})",
            f"{e.hint}. A model given by path is checked against the artifact.json beside "
            "it; a copy outside any artifact folder is loaded as it is") from None


def artifact_at(path: Path) -> Artifact | None:
    """The artifact whose folder holds ``path`` as one of its recorded files, or None (no
    readable ``artifact.json`` beside it, or one that does not list it)."""
    side = Path(path).parent / SIDECAR
    try:
        st = side.stat()
    except OSError:
        return None
    key = (str(side.absolute()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _RECORDS:
        try:
            art: Artifact | None = Artifact.from_record(
                json.loads(side.read_text(encoding="utf-8")), side.parent)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            art = None
        _RECORDS[key] = art
    art = _RECORDS[key]
    return art if art is not None and isinstance(art.files, dict) and Path(
        path).name in art.files else None
