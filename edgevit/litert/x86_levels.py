"""This machine's LiteRT on the x86 kernels of older CPUs, under emulation.

XNNPACK picks its x86 microkernels by the instruction sets the CPU reports,
and their integer arithmetic is not the same on all of them: in LiteRT 2.3
the int8 sum behind a MEAN over the last axis runs in 16-bit lanes on the
SSE4, AVX and AVX2 kernels and overflows past 4096 (SSE4, AVX) or 8192
(AVX2) elements, where the AVX-512 VNNI kernel sums in 32 bits. So a file's
answers on this host's kernels say nothing certain about another x86 CPU's.

Debian's qemu-x86_64 (installed beside the Arm64 emulator by
scripts/install-arm-emulator.sh) runs this machine's own Python and LiteRT
as an older CPU would: its CPU model sets the instruction sets the guest
sees (CPUID), and so the kernels XNNPACK chooses. ``LEVELS`` names the
levels; :func:`emulated_command` prefixes a command with the emulator.
"""
from __future__ import annotations

import os
from pathlib import Path

from edgevit.errors import EdgevitError
from edgevit.litert.emulator_home import HOW_TO_INSTALL, arm_home

# level -> qemu's CPU model: the newest x86 level without AVX-512, and one without AVX
LEVELS = {"avx2": "Haswell-noTSX", "sse4": "Nehalem"}


def emulator() -> Path:
    return arm_home() / "qemu" / "qemu-x86_64"


def x86_emulator_missing() -> str | None:
    """Why the x86 emulator cannot run here (None: installed)."""
    return None if os.access(emulator(), os.X_OK) else f"qemu-x86_64 is not installed in {emulator().parent}"


def emulated_command(level: str, command: list[str], environment: dict) -> tuple[list[str], dict]:
    """``command`` (a program of this machine and its arguments) and its
    ``environment``, run as a CPU of x86 ``level`` would run them."""
    if level not in LEVELS:
        raise EdgevitError(f"Unknown x86 level {level!r}; choose from {', '.join(LEVELS)}.")
    missing = x86_emulator_missing()
    if missing:
        raise EdgevitError(f"{missing[0].upper()}{missing[1:]}: {HOW_TO_INSTALL}.")
    # LD_LIBRARY_PATH is for qemu's own libraries; the guest keeps the caller's (or none)
    guest_library_path = environment.get("LD_LIBRARY_PATH")
    keep = ["-E", f"LD_LIBRARY_PATH={guest_library_path}"] if guest_library_path else ["-U", "LD_LIBRARY_PATH"]
    return ([str(emulator()), *keep, "-cpu", LEVELS[level], *command],
            {**environment, "LD_LIBRARY_PATH": str(emulator().parent / "lib")})
