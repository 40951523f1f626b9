"""The sweep's SQLite store: one row per cell and per cell and stage, written a cell at a time
in one transaction (WAL journal), so a killed sweep leaves every finished cell whole and the
next run resumes where it stopped. One sweep writes a workspace at a time (a lock file).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import sqlite3
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import WorkspaceError
from .cell import BAD, CellResult, OpPoint, StageResult
from .matrix import Cell, show

DB_NAME = "sweep.db"
LOCK_NAME = "sweep.lock"
SCHEMA_VERSION = 3  # 2: the tolerance and int8 SNR columns of stages; 3: target, flags
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cells (
    cell_id TEXT PRIMARY KEY, position INTEGER NOT NULL, model TEXT NOT NULL,
    name TEXT NOT NULL, choices TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0, seconds REAL, worker TEXT, folder TEXT,
    finished TEXT);
CREATE TABLE IF NOT EXISTS stages (
    cell_id TEXT NOT NULL REFERENCES cells(cell_id), position INTEGER NOT NULL,
    stage TEXT NOT NULL, status TEXT NOT NULL, error_class TEXT, error TEXT, hint TEXT,
    nodes INTEGER, max_abs REAL, max_abs_fp16 REAL, aligned_fraction REAL,
    first_divergence TEXT, seconds REAL, warnings INTEGER, artifact TEXT, tools TEXT,
    atol REAL, rtol REAL, snr_db REAL, min_snr_db REAL, target TEXT, flags TEXT,
    target_max_abs REAL, PRIMARY KEY (cell_id, stage));
CREATE TABLE IF NOT EXISTS ops (
    cell_id TEXT NOT NULL REFERENCES cells(cell_id), candidate TEXT NOT NULL,
    ord INTEGER NOT NULL, reference TEXT, op_type TEXT, max_abs REAL, passed INTEGER);
"""
_STAGE_COLS = ("stage", "status", "error_class", "error", "hint", "nodes", "max_abs",
               "max_abs_fp16", "aligned_fraction", "first_divergence", "seconds", "warnings",
               "artifact", "tools", "atol", "rtol", "snr_db", "min_snr_db", "target", "flags",
               "target_max_abs")
# columns added since schema 1, with their types: added to an older store opened for writing,
# read as None from one opened read-only (an earlier sweep to diff against)
_ADDED = {"atol": "REAL", "rtol": "REAL", "snr_db": "REAL", "min_snr_db": "REAL",
          "target": "TEXT", "flags": "TEXT", "target_max_abs": "REAL"}


@dataclass
class CellRecord:
    """A cell as stored: its identity, status and (once finished) its stages and op points."""

    cell_id: str
    model: str
    name: str
    choices: dict[str, Any]
    status: str
    attempts: int = 0
    seconds: float | None = None
    worker: str = ""
    folder: str = ""
    finished: str = ""
    stages: list[StageResult] = field(default_factory=list)
    ops: list[OpPoint] = field(default_factory=list)

    @property
    def label(self) -> str:
        return " ".join(f"{k}={show(v, k)}" for k, v in self.choices.items())

    @property
    def done(self) -> bool:
        return self.status != "pending"

    @property
    def failed(self) -> bool:
        return self.status in BAD


class SweepDB:
    """The store of one sweep in ``folder``/sweep.db. ``readonly`` opens without creating."""

    def __init__(self, folder: str | os.PathLike[str], *, readonly: bool = False) -> None:
        self.folder = Path(folder).absolute()
        self.path = self.folder / DB_NAME
        hint = "give the folder of a sweep (it holds sweep.db), or a new folder to start one"
        if readonly and not self.path.is_file():
            raise WorkspaceError(f"workspace {str(self.folder)!r} holds no sweep "
                                 f"({DB_NAME} not found)", hint)
        if not readonly:
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise WorkspaceError(f"workspace {str(self.folder)!r} cannot be created: "
                                     f"{e.strerror or e}", hint) from e
        try:
            # a URI for read-only: its path percent-encoded ('?' or '#' in a folder name)
            uri = (f"file:{urllib.parse.quote(str(self.path))}?mode=ro" if readonly
                   else str(self.path))
            self.conn = sqlite3.connect(uri, uri=readonly, timeout=30.0,
                                        isolation_level=None)  # transactions are explicit
            if not readonly:
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=NORMAL")
                self.conn.executescript(SCHEMA)  # idempotent: CREATE ... IF NOT EXISTS
                self._upgrade()
            self.conn.execute("SELECT count(*) FROM cells").fetchone()
        except sqlite3.DatabaseError as e:
            raise WorkspaceError(f"{self.path} is not a sweep database ({e})",
                                 "this folder's sweep.db is another program's file or damaged: "
                                 "move it aside, or sweep into a new folder") from e

    def close(self) -> None:
        self.conn.close()

    def _columns(self) -> list[str]:
        return [r[1] for r in self.conn.execute("PRAGMA table_info(stages)")]

    def _upgrade(self) -> None:
        """A store of an earlier schema gets the columns added since (one transaction)."""
        missing = [c for c in _ADDED if c not in self._columns()]
        if missing:
            with self.transaction() as c:
                for col in missing:
                    c.execute(f"ALTER TABLE stages ADD COLUMN {col} {_ADDED[col]}")
                c.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)",
                          (str(SCHEMA_VERSION),))

    def __enter__(self) -> SweepDB:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any error (a killed writer leaves the
        last committed state: SQLite's journal guarantees it)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # -- identity --------------------------------------------------------------------------
    def meta(self) -> dict[str, str]:
        return dict(self.conn.execute("SELECT key, value FROM meta"))

    def claim(self, models: list[str], matrix_json: str, cells: list[Cell]) -> None:
        """Record this sweep (models, matrix, cells) in a new store, or check that the store
        holds the same sweep: a workspace of another sweep is refused, never mixed."""
        meta = self.meta()
        mine = {"models": json.dumps(models), "matrix": matrix_json}
        if meta.get("models") is not None:
            differs = [k for k in mine if meta.get(k) != mine[k]]
            if differs:
                what = " and ".join(differs)
                raise WorkspaceError(
                    f"workspace {str(self.folder)!r} holds another sweep: its {what} differ "
                    f"(it has models {meta.get('models')} and matrix {meta.get('matrix')}; "
                    f"this sweep has models {mine['models']} and matrix {mine['matrix']})",
                    "sweep into a new folder (then `workbench report NEW --against "
                    f"{self.folder}` shows what changed), or repeat that sweep's models and "
                    "matrix to resume it")
            return
        with self.transaction() as c:
            c.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", [
                *mine.items(), ("schema", str(SCHEMA_VERSION)),
                ("created", _now())])
            c.executemany(
                "INSERT OR IGNORE INTO cells (cell_id, position, model, name, choices) "
                "VALUES (?, ?, ?, ?, ?)",
                [(cell.id, i, cell.model, cell.name, json.dumps(dict(cell.choices)))
                 for i, cell in enumerate(cells)])

    # -- results ---------------------------------------------------------------------------
    def save(self, result: CellResult, folder: str) -> None:
        """Store one finished cell: its row, stages and op points in one transaction."""
        with self.transaction() as c:
            c.execute("DELETE FROM stages WHERE cell_id = ?", (result.cell_id,))
            c.execute("DELETE FROM ops WHERE cell_id = ?", (result.cell_id,))
            c.executemany(
                f"INSERT INTO stages (cell_id, position, {', '.join(_STAGE_COLS)}) VALUES "
                f"(?, ?, {', '.join('?' * len(_STAGE_COLS))})",
                [(result.cell_id, i, *[_col(getattr(s, k)) for k in _STAGE_COLS])
                 for i, s in enumerate(result.stages)])
            c.executemany("INSERT INTO ops VALUES (?, ?, ?, ?, ?, ?, ?)",
                          [(result.cell_id, o.candidate, o.order, o.reference, o.op_type,
                            o.max_abs, int(o.passed)) for o in result.ops])
            c.execute("UPDATE cells SET status = ?, attempts = attempts + ?, seconds = ?, "
                      "worker = ?, folder = ?, finished = ? WHERE cell_id = ?",
                      (result.status, result.attempts, result.seconds, result.worker, folder,
                       _now(), result.cell_id))

    def todo(self, retry_failed: bool = False) -> list[str]:
        """Cell ids still to run: never finished, and the failed ones with ``retry_failed``."""
        statuses = ("pending", *BAD) if retry_failed else ("pending",)
        q = f"SELECT cell_id FROM cells WHERE status IN ({', '.join('?' * len(statuses))}) " \
            "ORDER BY position"
        return [r[0] for r in self.conn.execute(q, statuses)]

    def cells(self) -> list[CellRecord]:
        """Every cell with its stages and op points, in matrix order."""
        rows = self.conn.execute("SELECT cell_id, model, name, choices, status, attempts, "
                                 "seconds, worker, folder, finished FROM cells "
                                 "ORDER BY position").fetchall()
        stages: dict[str, list[StageResult]] = {}
        have = set(self._columns())
        cols = [c for c in _STAGE_COLS if c in have]  # an older store lacks the _ADDED ones
        for r in self.conn.execute(f"SELECT cell_id, {', '.join(cols)} FROM stages "
                                   "ORDER BY cell_id, position"):
            d = dict.fromkeys(_STAGE_COLS) | dict(zip(cols, r[1:], strict=True))
            d["tools"] = json.loads(d["tools"] or "{}")
            d = {k: ("" if v is None and k in ("error_class", "error", "hint",
                                                "first_divergence", "artifact", "target",
                                                "flags") else v)
                 for k, v in d.items()}
            stages.setdefault(r[0], []).append(StageResult(**d))
        ops: dict[str, list[OpPoint]] = {}
        for r in self.conn.execute("SELECT cell_id, candidate, ord, reference, op_type, "
                                   "max_abs, passed FROM ops ORDER BY cell_id, candidate, ord"):
            ops.setdefault(r[0], []).append(OpPoint(r[1], r[2], r[3], r[4], r[5], bool(r[6])))
        return [CellRecord(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], r[7] or "",
                           r[8] or "", r[9] or "", stages.get(r[0], []), ops.get(r[0], []))
                for r in rows]

    def integrity(self) -> str:
        """SQLite's own check: 'ok' for a sound file."""
        return self.conn.execute("PRAGMA integrity_check").fetchone()[0]


@contextlib.contextmanager
def writer_lock(folder: Path) -> Iterator[None]:
    """Hold the workspace's sweep lock (flock: released by the OS if the holder dies); a
    second sweep on the same folder is refused at once rather than interleaved."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    f = open(path, "a+")  # noqa: SIM115 - closed below
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise WorkspaceError(
                f"workspace {str(folder)!r} is being written by another sweep ({holder})",
                "wait for it to finish (or stop it: Ctrl-C keeps every finished cell), or "
                "sweep into another folder") from None
        f.truncate(0)
        f.write(f"pid {os.getpid()} since {_now()}")
        f.flush()
        yield
    finally:
        f.close()


def _col(v: Any) -> Any:
    return json.dumps(v, sort_keys=True) if isinstance(v, dict) else v


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")

