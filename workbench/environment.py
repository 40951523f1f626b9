"""The environment a number came from: the lock it was installed from, and what moved.

``make`` installs the venv from ``requirements.lock`` (every package pinned, with hashes)
and leaves a copy of it in the venv; :func:`lock_status` reads that copy, hashes it and
compares it with what ``importlib.metadata`` says is installed, so a manifest can record
which environment produced its artifacts, and whether it was still the locked one.

Run as ``python -m workbench.environment moved NEW --from OLD`` it prints the packages whose
pinned version differs between two locks (``make lock``, ``make test-latest``); as
``pin-environment LOCK environment.yml`` it pins conda's pip list to the lock (``make lock``).
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

# A pin line of a hashed requirements file: ``name==version \`` (uv / pip-compile format).
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Foo_Bar`` == ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str) -> dict[str, str]:
    """``{normalized name: version}`` for every pin in a requirements lock's text."""
    pins = {}
    for line in text.splitlines():
        m = _PIN.match(line)
        if m:
            pins[normalize(m.group(1))] = m.group(2)
    return pins


def installed_versions() -> dict[str, str]:
    """``{normalized name: version}`` of every distribution importable in this Python."""
    from importlib import metadata

    out = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(normalize(name), dist.version)
    return out


@dataclass(frozen=True)
class Moved:
    """One package whose version differs between two sets of pins."""

    name: str
    old: str | None  # None: not in the old set
    new: str | None  # None: not in the new set

    def __str__(self) -> str:
        return f"{self.name}: {self.old or '(absent)'} -> {self.new or '(absent)'}"


def moved(old: dict[str, str], new: dict[str, str],
          ignore: tuple[str, ...] = ()) -> list[Moved]:
    """Packages whose version differs (or that appear or vanish) from ``old`` to ``new``."""
    skip = {normalize(n) for n in ignore}
    return [Moved(n, old.get(n), new.get(n)) for n in sorted(old.keys() | new.keys())
            if n not in skip and old.get(n) != new.get(n)]


@dataclass(frozen=True)
class LockStatus:
    """Which lock this environment was installed from, and whether it still holds it.

    ``lock`` is None when the environment was not installed by ``make`` (a plain
    ``pip install``): then nothing is known and ``matches`` is None too.
    """

    lock: Path | None
    sha256: str | None
    differs: list[Moved] = field(default_factory=list)

    @property
    def matches(self) -> bool | None:
        return None if self.lock is None else not self.differs

    def to_record(self) -> dict:
        return {"lock": self.lock.name if self.lock else None, "lock_sha256": self.sha256,
                "matches_lock": self.matches, "differs": [str(m) for m in self.differs]}


# The project itself is installed beside the lock, editable, so it is never in it.
_NOT_LOCKED = ("deploy-workbench",)


def status_of(lock: Path, installed: dict[str, str] | None = None) -> LockStatus:
    """Compare ``installed`` (default: this Python's distributions) with the pins in ``lock``."""
    data = lock.read_bytes()
    have = installed_versions() if installed is None else installed
    differs = moved(parse_lock(data.decode()), have, ignore=_NOT_LOCKED)
    return LockStatus(lock, hashlib.sha256(data).hexdigest(), differs)


@functools.lru_cache(maxsize=1)
def lock_status() -> LockStatus:
    """The lock ``make`` installed this venv from (its copy in ``sys.prefix``), checked once."""
    lock = Path(sys.prefix) / "requirements.lock"
    if not lock.is_file():
        return LockStatus(None, None)
    return status_of(lock)


_YML_ITEM = re.compile(r"^(\s*)- ([A-Za-z0-9][A-Za-z0-9._-]*)(.*?)\s*$")


def pin_environment_yml(text: str, pins: dict[str, str]) -> str:
    """``environment.yml`` text with each requirement of its ``- pip:`` list pinned to the
    lock's version (conda's own packages and ``-e .`` left alone).

    A local version label (``2.13.0+cpu``) is dropped: conda users resolve against their own
    indexes, where pip's ``==2.13.0`` also takes the ``+cpu`` build if an index offers it.
    """
    out, pip_indent = [], None
    for line in text.splitlines(keepends=True):
        m = _YML_ITEM.match(line)
        if m and pip_indent is not None and len(m.group(1)) <= pip_indent:
            pip_indent = None  # the pip list ended
        if m and m.group(2) == "pip" and m.group(3) == ":":
            pip_indent = len(m.group(1))
        elif m and pip_indent is not None and normalize(m.group(2)) in pins:
            version = pins[normalize(m.group(2))].split("+")[0]
            line = f"{m.group(1)}- {m.group(2)}=={version}\n"
        out.append(line)
    return "".join(out)


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m workbench.environment")
    sub = parser.add_subparsers(dest="cmd", required=True)
    cmd = sub.add_parser("moved", help="packages whose pin differs between two locks")
    cmd.add_argument("new", type=Path)
    cmd.add_argument("--from", dest="old", type=Path, required=True)
    env = sub.add_parser("pin-environment", help="pin environment.yml's pip list to a lock")
    env.add_argument("lock", type=Path)
    env.add_argument("environment_yml", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "pin-environment":
        pins = parse_lock(args.lock.read_text())
        text = args.environment_yml.read_text()
        args.environment_yml.write_text(pin_environment_yml(text, pins))
        return 0
    pins = {}
    for which in ("old", "new"):
        path = getattr(args, which)
        if not path.is_file():
            print(f"{path}: no such lock file", file=sys.stderr)
            return 2
        pins[which] = parse_lock(path.read_text())
    changes = moved(pins["old"], pins["new"])
    print(f"{len(changes)} of {len(pins['new'])} package(s) moved from {args.old} "
          f"to {args.new}" + (":" if changes else ""))
    for m in changes:
        print(f"  {m}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
