"""Where the ARM target's pieces are, and the command line that starts its aarch64 Python.

``make arm-target`` installs them into ``.arm64/`` beside the ``workbench`` package (the
environment variable ``WORKBENCH_ARM64`` names another folder): ``qemu-aarch64-static`` from
Debian's qemu-user-static; ``sysroot/``, an aarch64 CPython 3.11 unpacked from Debian bookworm's
arm64 packages (pinned with their sha256 in ``arm64-sysroot.txt``); ``site-packages/``, ncnn's
and numpy's aarch64 wheels (``requirements-arm64.lock``); and ``machines/<target>/``, the CPU
each target shows ncnn (see ``Machine``). Nothing is fetched at run time, and a missing piece is
an ``InputError`` naming it and the make target. Standard library only: this module also runs
inside the emulated process (``hwcaps``) and in ``make`` before anything else is imported.
"""

from __future__ import annotations

import os
import platform
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

ENV_VAR = "WORKBENCH_ARM64"
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / ".arm64"  # beside the workbench package
QEMU = "qemu-aarch64-static"
PYTHON = "usr/bin/python3.11"  # inside the sysroot
HINT = ("run `make arm-target` in the workbench checkout: it installs QEMU user mode, the arm64 "
        f"sysroot and the aarch64 wheels (cached; a second run does nothing), or set {ENV_VAR} "
        "to a folder it made")


@dataclass(frozen=True)
class Machine:
    """What ncnn reads of the CPU besides its feature bits (those come from the ELF auxiliary
    vector, which QEMU derives from ``-cpu``): the core count (its default thread count), each
    core's MIDR (it picks its Cortex-A53/A55-tuned kernels by it), cache sizes (its GEMM tile
    sizes) and maximum frequencies (big or little cores). Under QEMU user mode these would be
    read from the host's /proc/cpuinfo and /sys; ``write_machine`` writes them as files that
    QEMU's ``-L`` shows in place of the host's, so a target is the same phone on every host.
    (Measured with ncnn 1.0.20261020: the host's or any of these descriptions gave bit-identical
    outputs for 3x3, strided and 1x1 convolutions, InnerProduct and MatMul, fp32 and fp16
    arithmetic; what they change is the default thread count and the kernel choice.)"""

    core: str
    midr: int
    cores: int  # the cluster ncnn runs on by default: a phone's big cores
    l1d_kb: int
    l2_kb: int
    l2_shared: bool  # one L2 for the cluster (Cortex-A53) or one per core
    l3_kb: int  # 0: none
    max_khz: int


@dataclass(frozen=True)
class ArmTarget:
    """A phone class, as a QEMU CPU model and the features ncnn finds there.

    The flags were checked by running ncnn's aarch64 wheel under each QEMU 7.2 CPU model
    (``tests/test_arm_env.py`` checks them again). ncnn's Python binding exposes only
    ``cpu_support_arm_asimdhp/neon/vfpv4``; asimddp, bf16 and i8mm were read from the emulated
    process's AT_HWCAP/AT_HWCAP2, which is what ncnn's ``cpu_support_arm_*`` test on Linux
    (``hwcaps`` below). QEMU 7.2's models gave:

    - cortex-a53, cortex-a72: none of asimdhp, asimddp, asimdfhm, bf16, i8mm, sve;
    - cortex-a76, neoverse-n1: asimdhp, asimddp; no bf16, i8mm, asimdfhm or SVE;
    - a64fx: asimdhp and SVE; no asimddp, bf16, i8mm;
    - max: asimdhp, asimddp, asimdfhm, bf16, i8mm, and also SVE, SVE2, SVE-bf16/i8mm and SME;
      ``max,sve=off,sme=off`` keeps asimdhp, asimddp, asimdfhm, bf16, i8mm and drops the rest.

    No QEMU 7.2 model has bf16 or i8mm without SVE except ``max`` with SVE and SME turned off,
    so ``arm64-v8.6`` uses that (``pauth-impdef=on`` only makes pointer authentication cheaper
    to emulate). ``dotprod`` is asimddp (ncnn's int8 sdot kernels).
    """

    name: str
    qemu_cpu: str
    fp16_arithmetic: bool
    bf16: bool
    i8mm: bool
    stands_for: str
    dotprod: bool
    machine: Machine


TARGETS: dict[str, ArmTarget] = {t.name: t for t in (
    ArmTarget(
        "arm64-v8.0", "cortex-a53", fp16_arithmetic=False, bf16=False, i8mm=False,
        stands_for="an ARMv8.0 phone without fp16 arithmetic: Cortex-A53 cores "
                   "(Snapdragon 625-class); fp16 storage at most, computed in fp32",
        dotprod=False,
        machine=Machine("Cortex-A53", 0x410FD034, cores=4, l1d_kb=32, l2_kb=1024,
                        l2_shared=True, l3_kb=0, max_khz=2016000)),
    ArmTarget(
        "arm64-v8.2", "cortex-a76", fp16_arithmetic=True, bf16=False, i8mm=False,
        stands_for="an ARMv8.2 phone with fp16 arithmetic and int8 dot product: Cortex-A76 "
                   "big cores (Snapdragon 855-class)",
        dotprod=True,
        machine=Machine("Cortex-A76", 0x414FD0B1, cores=4, l1d_kb=64, l2_kb=256,
                        l2_shared=False, l3_kb=2048, max_khz=2419200)),
    ArmTarget(
        "arm64-v8.6", "max,sve=off,sme=off,pauth-impdef=on", fp16_arithmetic=True, bf16=True,
        i8mm=True,
        stands_for="an ARMv8.6 phone with bf16 and int8 matrix multiply (i8mm) besides fp16 "
                   "arithmetic: Cortex-A710/X2-class big cores (Snapdragon 8 Gen 1-class), "
                   "NEON kernels only (QEMU's max CPU with its SVE and SME off)",
        dotprod=True,
        machine=Machine("Cortex-A710", 0x412FD470, cores=4, l1d_kb=64, l2_kb=512,
                        l2_shared=False, l3_kb=6144, max_khz=2496000)),
)}


@dataclass(frozen=True)
class ArmEnv:
    """The installed pieces: QEMU, the arm64 sysroot and its Python, the aarch64 wheels, and
    the folder of per-target machine descriptions (each a ``-L`` root, see ``Machine``)."""

    qemu: Path
    sysroot: Path
    python: Path  # the aarch64 CPython inside the sysroot
    site_packages: Path
    machines: Path
    ncnn_version: str


def target(name: str) -> ArmTarget:
    """The ARM target called ``name`` (``TARGETS``); an unknown name is an InputError that
    lists the known ones."""
    if name not in TARGETS:
        known = ", ".join(f"{t.name!r} ({t.stands_for})" for t in TARGETS.values())
        raise InputError(f"unknown ARM target {name!r}", f"use one of: {known}")
    return TARGETS[name]


def root() -> Path:
    """The folder ``make arm-target`` installs into: ``$WORKBENCH_ARM64``, else ``.arm64/``."""
    return Path(os.environ.get(ENV_VAR) or DEFAULT_ROOT).absolute()


def arm_env() -> ArmEnv:
    """The installed ARM target, checked piece by piece.

    Returns:
        ArmEnv with absolute paths.

    Raises:
        InputError: something is missing (QEMU, the sysroot's Python, ncnn's or numpy's
            aarch64 wheel, a target's machine description), naming each missing piece and
            ``make arm-target``.
    """
    base = root()
    qemu = shutil.which(QEMU)
    sysroot, site, machines = base / "sysroot", base / "site-packages", base / "machines"
    missing = []
    if qemu is None:
        missing.append(f"{QEMU} (Debian's qemu-user-static) on PATH")
    for path, what in ((sysroot / PYTHON, "the arm64 sysroot's python3.11"),
                       (sysroot / "lib/ld-linux-aarch64.so.1", "the arm64 sysroot's libc"),
                       (site / "ncnn/__init__.py", "ncnn's aarch64 wheel"),
                       (site / "numpy/__init__.py", "numpy's aarch64 wheel")):
        if not path.is_file():
            missing.append(f"{what} ({path})")
    absent = [n for n in TARGETS if not (machines / n / "proc/cpuinfo").is_file()]
    if absent:
        missing.append(f"the machine description of {', '.join(absent)} ({machines})")
    if missing:
        raise InputError(f"the ARM target is not installed in {base}: missing "
                         + "; ".join(missing), HINT)
    dist = sorted(site.glob("ncnn-*.dist-info"))
    version = dist[-1].name[len("ncnn-"):-len(".dist-info")] if dist else "unknown"
    return ArmEnv(Path(qemu), sysroot, sysroot / PYTHON, site, machines, version)


def command(env: ArmEnv, arm: ArmTarget, argv: list[str]) -> list[str]:
    """The command that runs the aarch64 Python with ``argv`` (its arguments, e.g.
    ``["-c", code]``) under QEMU user mode as ``arm``: ``-L`` is the target's machine root
    (the sysroot, with its /proc/cpuinfo and /sys in front) and ``-cpu`` its QEMU model."""
    return [str(env.qemu), "-L", str(env.machines / arm.name), "-cpu", arm.qemu_cpu,
            str(env.python), "-s", *argv]


def environ(env: ArmEnv, extra_pythonpath: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """The emulated process's environment: this one's without the host's Python, QEMU and
    dynamic-loader variables (an x86 site-packages or LD_PRELOAD would be read by the aarch64
    side), with PYTHONPATH = the aarch64 site-packages, then ``extra_pythonpath`` (the folder
    holding ``workbench``). No PYTHONHOME: the sysroot's Python finds its own prefix."""
    drop = ("PYTHON", "QEMU_", "LD_", "VIRTUAL_ENV", "CONDA_PREFIX")
    out = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    out["PYTHONPATH"] = os.pathsep.join([str(env.site_packages), *map(str, extra_pythonpath)])
    out["PYTHONNOUSERSITE"] = "1"
    return out


# --- inside the emulated process -----------------------------------------------------------

# Linux's arch/arm64/include/uapi/asm/hwcap.h: (AT_HWCAP or AT_HWCAP2, bit)
_HWCAP_BITS = {"asimdhp": (16, 10), "asimddp": (16, 20), "sve": (16, 22), "asimdfhm": (16, 23),
               "sve2": (26, 1), "i8mm": (26, 13), "bf16": (26, 14), "sme": (26, 23)}


def hwcaps() -> dict[str, bool]:
    """In an aarch64 process: the CPU features the kernel (here QEMU) reports in the ELF
    auxiliary vector, the bits ncnn's ``cpu_support_arm_*`` test. ``{}`` elsewhere."""
    if platform.machine() not in ("aarch64", "arm64"):
        return {}
    with open("/proc/self/auxv", "rb") as f:
        aux = dict(struct.iter_unpack("<QQ", f.read()))
    return {name: bool(aux.get(tag, 0) >> bit & 1) for name, (tag, bit) in _HWCAP_BITS.items()}


# --- written by make arm-target ------------------------------------------------------------

def _cpuinfo(arm: ArmTarget) -> str:
    m, flags = arm.machine, ["fp", "asimd", "evtstrm", "crc32", "cpuid"]
    flags += ["fphp", "asimdhp"] * arm.fp16_arithmetic + ["asimddp"] * arm.dotprod
    flags += ["i8mm"] * arm.i8mm + ["bf16"] * arm.bf16
    block = (f"BogoMIPS\t: 38.40\nFeatures\t: {' '.join(flags)}\nCPU implementer\t: "
             f"0x{m.midr >> 24:02x}\nCPU architecture: 8\nCPU variant\t: 0x{m.midr >> 20 & 15:x}"
             f"\nCPU part\t: 0x{m.midr >> 4 & 0xFFF:03x}\nCPU revision\t: {m.midr & 15}\n\n")
    return "".join(f"processor\t: {i}\n{block}" for i in range(m.cores))


def machine_files(arm: ArmTarget) -> dict[str, str]:
    """The files of ``arm``'s machine description, by path under its ``-L`` root. Every file
    ncnn looks for is there (an absent one would be read from the host through ``-L``)."""
    m = arm.machine
    cpus = f"0-{m.cores - 1}\n"
    files = {"proc/cpuinfo": _cpuinfo(arm)}
    for name in ("possible", "present", "online"):
        files[f"sys/devices/system/cpu/{name}"] = cpus
    caches = [(1, "Data", m.l1d_kb, False), (1, "Instruction", m.l1d_kb, False),
              (2, "Unified", m.l2_kb, m.l2_shared), (3, "Unified", m.l3_kb, True)]
    for i in range(m.cores):
        cpu = f"sys/devices/system/cpu/cpu{i}"
        files[f"{cpu}/regs/identification/midr_el1"] = f"0x{m.midr:016x}\n"
        for name in ("thread_siblings", "core_cpus"):
            files[f"{cpu}/topology/{name}"] = f"{1 << i:x}\n"
        for name in ("thread_siblings_list", "core_cpus_list"):
            files[f"{cpu}/topology/{name}"] = f"{i}\n"
        files[f"{cpu}/cpufreq/cpuinfo_max_freq"] = f"{m.max_khz}\n"
        files[f"sys/devices/system/cpu/cpufreq/stats/cpu{i}/time_in_state"] = f"{m.max_khz} 0\n"
        for index, (level, kind, kb, shared) in enumerate(caches):
            shared_map = (1 << m.cores) - 1 if shared else 1 << i
            for key, value in (("level", level), ("type", kind), ("size", f"{kb}K"),
                               ("shared_cpu_map", f"{shared_map:x}")):
                files[f"{cpu}/cache/index{index}/{key}"] = f"{value}\n"
    return files


def write_machines(base: Path) -> None:
    """Write every target's machine root under ``base/machines``: the sysroot's top folders as
    relative symlinks, and ``machine_files``. Rewritten whole each time."""
    for arm in TARGETS.values():
        top = base / "machines" / arm.name
        shutil.rmtree(top, ignore_errors=True)
        top.mkdir(parents=True)
        for entry in sorted((base / "sysroot").iterdir()):
            (top / entry.name).symlink_to(Path("../../sysroot") / entry.name)
        for rel, text in machine_files(arm).items():
            (top / rel).parent.mkdir(parents=True, exist_ok=True)
            (top / rel).write_text(text)


def main(args: list[str]) -> int:
    """``python -m workbench.runtime.arm_env machines DIR`` (make arm-target's last step)."""
    if len(args) == 2 and args[0] == "machines":
        write_machines(Path(args[1]).absolute())
        return 0
    print("usage: python -m workbench.runtime.arm_env machines DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
