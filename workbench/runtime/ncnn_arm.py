"""The ARM target of the ncnn runner: ncnn's own aarch64 build, in a worker process that is
an aarch64 CPython under QEMU user mode (``arm_env``: set up by ``make arm-target``).

The twin runs the same ``NcnnRunner`` code as on x86, in the emulated process: the same
feeds, captures, crash isolation and tensor transfer (QEMU user mode shares this machine's
kernel, so the /dev/shm files and the socket are the same ones). What differs is what ncnn
computes there: its ARM kernels, with fp16 arithmetic where the emulated CPU has it
(ARMv8.2's asimdhp), bf16 and int8 kernels of their own. Emulated time is not phone time:
QEMU runs 100-250x slower than native and its timing says nothing of a phone's.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

from ..errors import InputError
from . import worker_main
from .arm_env import ArmTarget, arm_env, command, environ, target
from .worker import Place, Worker

# how much slower than native an emulated worker runs (measured 100-250x): timeouts scale
SLOWDOWN = 250.0
_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the workbench package


class ArmWorker(Worker):
    """A worker process that is ncnn's aarch64 build under QEMU user mode, as ``target``."""

    def __init__(self, arm: ArmTarget) -> None:
        self.env = arm_env()  # a missing piece is a hinted error now, not at the first run
        self.target = arm
        super().__init__()

    def command(self, fd: int) -> list[str]:
        return command(self.env, self.target, [
            "-c", f"from workbench.runtime.worker_main import serve; serve({fd})"])

    def environ(self) -> dict[str, str]:
        return environ(self.env, [str(_ROOT)])


@functools.cache
def place(name: str) -> Place:
    """Where a runner of target ``name`` runs: its own emulated worker process."""
    arm = target(name)
    return Place(key=name, make=lambda: ArmWorker(arm), slowdown=SLOWDOWN)


def check_target(name: str | None, emulate: str | None, isolated: bool) -> ArmTarget | None:
    """The ARM target a runner is asked for (None: this machine), checked: a known name, not
    with an emulation of storage, and only in its emulated worker, whose pieces are
    installed (a missing one is named now, not at the first run)."""
    if name is None:
        return None
    arm = target(name)
    if emulate is not None:
        raise InputError(f"emulate={emulate!r} with target={name!r}: the ARM target runs "
                         "ncnn's own ARM kernels; emulate= rounds storage on x86",
                         "pass one: target= for what the phone computes, emulate= for an x86 "
                         "approximation of fp16 storage")
    if worker_main.SERVING:
        _check_here(name)  # the twin: in the emulated aarch64 process, or refuse
    elif not isolated:
        raise InputError(f"target={name!r} runs only in its emulated worker process, not "
                         "with isolated=False", "drop isolated=False: the ARM twin runs under "
                         "QEMU user mode; this process is not an ARM one")
    else:
        arm_env()
    return arm


def _check_here(name: str) -> None:
    """In the twin: refuse to run an ARM target anywhere but in an aarch64 process (never a
    silent fall back to x86)."""
    if platform.machine() not in ("aarch64", "arm64"):
        raise InputError(
            f"target={name!r} runs in ncnn's aarch64 build, but this process is "
            f"{platform.machine()}", "make the runner with isolated=True (the default): its "
            "twin runs under QEMU user mode; an ARM target never runs in this process")
