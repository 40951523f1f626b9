"""Artifact: one output of one stage, its files on disk and the record of what made them
(lineage, params, tools), written beside the files as ``artifact.json`` (``SIDECAR``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..diagnostics import Diagnostic
from ..errors import ModelFileError
from ..fileio import file_sha256, matches_record
from ..graph import summarize, summarize_ncnn
from .rewrites import RewriteRecord

if TYPE_CHECKING:
    from ..graph import GraphSummary
    from .workspace import Workspace

SIDECAR = "artifact.json"


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
    # the rewriters that fired while this artifact was exported (artifact/rewrites.py)
    rewrites: list[RewriteRecord] = field(default_factory=list)
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
            **({"rewrites": [r.to_dict() for r in self.rewrites]} if self.rewrites else {}),
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
            rewrites=[RewriteRecord.from_dict(r) for r in rec.get("rewrites", [])],
        )

    def check_files(self) -> None:
        """Refuse an artifact whose files changed on disk since its stage wrote them (the
        sha256 its record holds), or ModelFileError naming the file: a runner or stage given
        it would otherwise run on bytes nobody checked (a bit flipped, another model's
        weights copied over). A file is hashed once per size and mtime (see _VERIFIED), and
        not at all when this process hashed it unchanged (its commit: fileio.file_sha256) or
        it is still the file whose device, inode, size and mtime the record kept
        (fileio.matches_record: a stage run in a fresh process does not read its parent's
        2 GB again)."""

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
            if matches_record(st, meta):  # the very file the record's stat was taken of
                _VERIFIED[key] = want
                continue
            got = file_sha256(f)  # the digest this process computed at commit, if unchanged
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
