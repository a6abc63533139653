"""Exact instruction counts of a .tflite file on LiteRT's Arm64 kernels
(emulated; edgevit.litert.arm runs it), by function and kernel family.

edgevit's TCG plugin (scripts/arm-emulator/insn_regions.c) counts every guest
instruction executed between two marker syscalls around ``invoke()``, per
translation block; the block addresses are named after the functions of
LiteRT's library, whose XNNPACK kernel names survive (edgevit.profile.symbols),
and grouped into kernel families (edgevit.profile.kernels). Counts repeat to
the instruction between runs and hosts.

Instructions are not cycles (an in-order little core runs more instructions
of its own kernels in less time than their count suggests, a load costs more
than an add): compare counts made with the same kernels only.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgevit.errors import EdgevitError
from edgevit.litert.arm import KERNEL_SETS, ArmProfile, Emulator, find_emulator, parallel, run_guest
from edgevit.profile.kernels import family_of
from edgevit.profile.symbols import AddressNamer, demangle

NOT_CYCLES = ("instructions are not cycles: compare only counts made with the same kernels "
              "(one CPU profile, one kernel set)")


@dataclass
class InstructionCount:
    """Exact instructions of the counted inferences, in total and by function
    (demangled names; ``[library]`` where the library has no symbol there)."""
    profile: str
    kernels: str
    threads: int
    per_inference: list[int]            # each counted invoke
    functions: dict[str, float]         # instructions per inference, by function
    runtime: str = ""

    @property
    def instructions(self) -> int:
        """Instructions per inference (mean of the counted invokes)."""
        return round(sum(self.per_inference) / len(self.per_inference))

    @property
    def families(self) -> dict[str, int]:
        out: dict[str, float] = {}
        for name, count in self.functions.items():
            family = family_of(name)
            out[family] = out.get(family, 0.0) + count
        return {k: round(v) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}

    def top_functions(self, limit: int = 25) -> list[tuple[str, int]]:
        ranked = sorted(self.functions.items(), key=lambda kv: -kv[1])[:limit]
        return [(name, round(count)) for name, count in ranked]

    def xnnpack_kernels(self) -> list[str]:
        """The XNNPACK microkernels that ran, most instructions first."""
        return [name for name, _ in sorted(self.functions.items(), key=lambda kv: -kv[1])
                if name.startswith("xnn_") and "ukernel" in name]

    def to_dict(self, functions: int = 40) -> dict:
        return {"profile": self.profile, "kernels": self.kernels, "threads": self.threads,
                "instructions_per_inference": self.instructions, "counted_inferences": self.per_inference,
                "families": self.families, "xnnpack_kernels": self.xnnpack_kernels(),
                "top_functions": [[n, c] for n, c in self.top_functions(functions)], "runtime": self.runtime,
                "note": NOT_CYCLES}


def parse_counts(text: str) -> tuple[list[int], list[tuple[int, int, int]]]:
    """The plugin's dump: (instructions of each region, [(address,
    instructions in the block, executions in all regions)])."""
    lines = text.splitlines()
    if not lines or lines[0] != "insn_regions 1" or lines[-1] != "end":
        raise EdgevitError("The instruction-counting plugin wrote no complete result (the guest stopped early?).")
    regions, blocks = [], []
    for line in lines[1:-1]:
        kind, *values = line.split()
        if kind == "region":
            regions.append(int(values[1]))
        elif kind == "block":
            blocks.append((int(values[0], 16), int(values[1]), int(values[2])))
    return regions, blocks


def read_counts(counts_text: str, maps_text: str, profile: str, kernels: str, threads: int,
                debug_root: Path | None = None, runtime: str = "") -> InstructionCount:
    regions, blocks = parse_counts(counts_text)
    if not regions:
        raise EdgevitError("No inference was counted.")
    namer = AddressNamer(maps_text, debug_root=debug_root)
    by_name: dict[str, int] = {}
    for address, insns, executions in blocks:
        name = namer.name(address)
        by_name[name] = by_name.get(name, 0) + insns * executions
    readable = demangle(list(by_name))
    functions: dict[str, float] = {}
    for name, total in by_name.items():
        key = readable[name]
        functions[key] = functions.get(key, 0.0) + total / len(regions)
    return InstructionCount(profile, kernels, threads, regions, functions, runtime)


def count_instructions(model_path: str | Path, profile: ArmProfile, kernels: str = "xnnpack", runs: int = 2,
                       warmup: int = 1, threads: int = 1, inputs: np.ndarray | None = None,
                       emulator: Emulator | None = None, timeout: float = 1800) -> InstructionCount:
    """Exact instructions per inference of ``model_path`` on ``profile``'s
    Arm64 kernels: ``runs`` counted invokes after ``warmup`` uncounted ones
    (the first invoke plans and packs: not what a phone repeats)."""
    emulator = emulator or find_emulator()
    if inputs is None:
        from edgevit.litert.inputs import inputs_for_file

        inputs, _ = inputs_for_file(Path(model_path).read_bytes(), runs)
    run = run_guest(emulator, model_path, inputs[:runs], profile, (kernels,), threads=threads, counted=runs,
                    warmup=warmup, timeout=timeout)
    return read_counts(run.counts, run.maps, profile.name, kernels, threads, debug_root=emulator.rootfs,
                       runtime=emulator.runtime)


def count_many(model_paths: list[str | Path], profiles: list[ArmProfile], kernels: str = "xnnpack", runs: int = 2,
               warmup: int = 1, threads: int = 1, step: Callable[[str], None] = lambda msg: None,
               timeout: float = 1800) -> list[tuple[str, InstructionCount]]:
    """Every file on every profile, as many emulated processes at once as
    this machine has cores; (file, count) in file-then-profile order."""
    emulator = find_emulator()
    jobs = [(str(path), profile) for path in model_paths for profile in profiles]

    def one(job):
        path, profile = job
        step(f"arm64 {profile.name}: counting {Path(path).name} ({kernels}, {runs} inference(s))")
        return path, count_instructions(path, profile, kernels, runs, warmup, threads, emulator=emulator,
                                        timeout=timeout)

    return parallel(one, jobs)


# ---------------------------------------------------------------- `edgevit bench --arm`
def bench_on_arm(models: list[str | Path], profiles: list[ArmProfile], kernels: str = "xnnpack", runs: int = 2,
                 warmup: int = 1, step: Callable[[str], None] = lambda msg: None, timeout: float = 1800) -> dict:
    """Instructions per inference of every file on every profile: the
    result document of `edgevit bench --arm` (its JSON)."""
    from edgevit.profile.bench import describe_models

    infos = describe_models(models)
    if kernels not in KERNEL_SETS:
        raise EdgevitError(f"Unknown LiteRT kernels {kernels!r}; choose from {', '.join(KERNEL_SETS)}.")
    emulator = find_emulator()
    counts = count_many([i["path"] for i in infos], profiles, kernels, runs, warmup, step=step, timeout=timeout)
    by_path = {i["path"]: i for i in infos}
    results = []
    for path, count in counts:
        info = by_path[path]
        results.append({"model": info["model"], "file": info["file"], "precision": info["precision"],
                        **count.to_dict()})
    return {"models": infos, "arm": {"runtime": emulator.runtime, "versions": emulator.versions,
                                     "profiles": {p.name: p.description for p in profiles}, "kernels": kernels,
                                     "threads": 1, "note": NOT_CYCLES},
            "results": results}
