"""Cases that misbehave on purpose, to show the harness classifies them (used by the tests,
never generated): a write outside the workspace, a lost artifact, a death, a hang."""

from __future__ import annotations

import os
import shutil
import signal
import time

from .actions import Action, Context


def _write_outside(ctx: Context) -> Action:
    def act() -> tuple[str, str]:
        (ctx.cd.parent.parent / "escaped.txt").write_text("x")
        return "ok", "wrote outside"
    return act


def _lose(ctx: Context) -> Action:
    def act() -> tuple[str, str]:
        shutil.rmtree(ctx.ws_path / ctx.index["pnnx_id"])
        return "ok", "removed an artifact folder"
    return act


def _die(ctx: Context) -> Action:
    return lambda: (os.kill(os.getpid(), signal.SIGKILL), ("ok", ""))[1]


def _hang(ctx: Context) -> Action:
    return lambda: (time.sleep(600), ("ok", ""))[1]


def _wrong(ctx: Context) -> Action:
    return lambda: ("wrong", "a wrong answer on purpose")


KINDS = {"selftest_write_outside": _write_outside, "selftest_lose": _lose,
         "selftest_die": _die, "selftest_hang": _hang, "selftest_wrong": _wrong}
