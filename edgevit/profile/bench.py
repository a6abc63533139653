"""`edgevit bench`: one or more .tflite files x (this machine, phones) x
delegates x threads, collected into one result document."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

from edgevit.errors import EdgevitError, about
from edgevit.litert.delegates import DEFAULT_ANDROID_API
from edgevit.litert.flatbuffer import read, read_file
from edgevit.litert.gpu_rules import check_gpu
from edgevit.litert.metadata import read_embedded
from edgevit.litert.metadata_check import metadata_problems
from edgevit.litert.nnapi_rules import check_nnapi
from edgevit.profile import adb as adb_mod
from edgevit.profile import benchmark_binary, host

PRECISION_WORDS = ("int8_mixed", "int16x8", "int8", "fp16", "fp32", "dynamic")
# Phones have up to 12 cores, hosts that build Android apps rarely more;
# LiteRT's thread pool gains nothing on a ViT long before this.
MAX_THREADS = 64
# what a phone app tries first; on this machine, those up to its core count
DEFAULT_THREADS = (1, 2, 4)


@dataclass
class BenchOptions:
    delegates: list[str] = field(default_factory=lambda: ["cpu"])
    threads: list[int] = field(default_factory=lambda: list(DEFAULT_THREADS))
    threads_asked: bool = False     # --threads given: a count this machine cannot run is said, not dropped quietly
    host_kernels: list[str] = field(default_factory=lambda: ["xnnpack", "reference"])
    runs: int = 50
    warmup: int = 5
    max_secs: float = 20.0
    op_profiling: bool = False
    peak_memory: bool = False
    binaries: list[Path] = field(default_factory=list)
    device: str | None = None
    all_devices: bool = False
    host: bool = True
    nnapi_accelerator: str | None = None
    timeout: float = 300.0


def parse_list(text: str, what: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    items = [x.strip().lower() for x in text.split(",") if x.strip()]
    if not items:
        raise EdgevitError(f"--{what} needs at least one value.")
    if allowed:
        bad = [x for x in items if x not in allowed]
        if bad:
            raise EdgevitError(f"Unknown {what} {', '.join(bad)}: choose from {', '.join(allowed)}.")
    return list(dict.fromkeys(items))


def parse_threads(text: str) -> list[int]:
    out = []
    for item in parse_list(text, "threads"):
        if not item.isdigit() or not 1 <= int(item) <= MAX_THREADS:
            raise EdgevitError(f"--threads takes whole numbers from 1 to {MAX_THREADS} like 1,2,4 (got {item!r}).")
        out.append(int(item))
    return list(dict.fromkeys(out))


def describe_model(path: str | Path) -> dict:
    """File facts for the tables: name, precision, size."""
    p = Path(path)
    content = read_file(p)
    with about(p):
        graph = read(content)  # a clear error for a file that is not a .tflite flatbuffer
    for index in graph.inputs:
        signature = graph.tensors[index].shape_signature
        if signature and any(d < 0 for d in signature[1:]):  # a variable batch is measured at 1
            raise EdgevitError(f"{p.name} takes inputs of a size chosen at run time (shape {list(signature)}; -1 is "
                               "variable), which a benchmark cannot choose for you: convert the model at the size "
                               "you deploy (`edgevit convert MODEL --input-size N`) and measure that file.")
    problems = metadata_problems(content)
    try:
        meta = read_embedded(content) or {} if not problems else {}
    except EdgevitError:  # damaged metadata: name and precision come from the file name and graph
        meta = {}
    precision = meta.get("precision") or _precision_from_name(p.stem) or _precision_from_graph(content)
    return {"file": p.name, "path": str(p), "model": meta.get("model") or p.stem,
            "precision": precision, "size_mb": round(len(content) / 1e6, 3),
            **({"metadata_problems": problems} if problems else {})}


def describe_models(models: list[str | Path]) -> list[dict]:
    """:func:`describe_model` of each file; rows are keyed by file name, so
    two files may not share one."""
    infos = [describe_model(m) for m in models]
    names = [i["file"] for i in infos]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise EdgevitError(f"Two models are named {dup}: give each file its own name (rows are keyed by it).")
    return infos


def _precision_from_name(stem: str) -> str | None:
    words = re.split(r"[^a-z0-9]+", stem.lower().replace("int8_mixed", "int8mixed"))
    for word in PRECISION_WORDS:
        if word.replace("_", "") in words:
            return word
    return None


def _precision_from_graph(content: bytes) -> str:
    graph = read(content)
    dtypes = {t.dtype for op in graph.ops for t in [*op.inputs, *op.outputs] if t is not None and not t.is_const}
    if "int16" in dtypes:
        return "int16x8"
    if dtypes & {"int8", "uint8"}:
        return "int8" if not dtypes & {"float32"} else "int8_mixed"
    if graph.folded_ops:
        return "fp16"
    weights = {t.dtype for op in graph.ops for t in op.inputs if t is not None and t.is_const}
    return "dynamic" if weights & {"int8"} else "fp32"


def host_threads(asked: list[int], cores: int, on_phones: bool, warn: Callable[[str], None] | None) -> list[int]:
    """The thread counts measured on this machine: those up to its core
    count (more threads than cores time the cores' sharing, not the model).
    Leaving some out is a warning (``warn``: None where the user asked for
    none, and the defaults are cut to the cores quietly), leaving all out an
    error unless phones are measured."""
    fitting = [t for t in asked if t <= cores]
    left_out = [t for t in asked if t > cores]
    if not left_out or warn is None:
        return fitting
    counts = ", ".join(map(str, left_out))
    if not fitting and not on_phones:
        raise EdgevitError(f"--threads {counts}: this machine has {cores} cores, and more threads than cores "
                           f"measure how the cores are shared, not the model: ask for at most {cores}.")
    warn(f"this machine has {cores} cores: {counts} thread(s) left out of its runs"
         + (f" (it measures {', '.join(map(str, fitting))})" if fitting else " (only the phones are measured)"))
    return fitting


def run_bench(models: list[str | Path], opts: BenchOptions,
              step: Callable[[str], None] = lambda msg: None,
              warn: Callable[[str], None] = lambda msg: None) -> dict:
    """Every configuration asked for; the result says what was measured
    (each row, ``host.threads``) and what was left out (``warnings``)."""
    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        warn(message)

    infos = describe_models(models)
    for info in infos:
        if info.get("metadata_problems"):
            note(f"{info['file']}: its metadata contradicts the file ({info['metadata_problems'][0]}): named and "
                 "typed from the graph, not from its metadata")
    if opts.device and opts.all_devices:
        raise EdgevitError("Use either --device SERIAL or --all-devices, not both.")
    on_phones = bool(opts.device or opts.all_devices)
    binaries = {}
    for b in opts.binaries:
        binaries.setdefault(benchmark_binary.check_binary(b), Path(b))
    if on_phones and not any(arch in ("aarch64", "arm", "x86_64", "x86") for arch in binaries):
        raise EdgevitError("Benchmarking on phones needs --benchmark-binary PATH: the Android benchmark_model "
                           "build for the phone's ABI (android_aarch64 for arm64-v8a phones).")
    if not on_phones and "cpu" not in opts.delegates:
        raise EdgevitError(f"--delegate {','.join(opts.delegates)} needs a phone: add --device SERIAL or "
                           "--all-devices (this machine runs the CPU only; ai-edge-litert ships no GPU/NNAPI "
                           "delegate).")
    if not on_phones and set(opts.delegates) - {"cpu"}:
        note(f"{'/'.join(d.upper() for d in opts.delegates if d != 'cpu')} needs a phone: "
             "measuring the CPU on this machine only")

    cores = os.cpu_count() or 1
    measured = host_threads(opts.threads, cores, on_phones, note if opts.threads_asked else None) if opts.host else []
    # Resolve phones before the (slow) host runs, so device errors come first.
    adb = devices = None
    if on_phones:
        adb = adb_mod.Adb()
        devices = adb_mod.select_devices(adb, opts.device, opts.all_devices, warn=note)

    results: list[dict] = []
    by_file = {info["file"]: info for info in infos}
    host_info = {"target": "host", "model": host.host_description(), "cpus": cores, "threads": measured}
    if measured:
        for info in infos:
            for kernels in opts.host_kernels:
                # The reference kernels are single-threaded: one row is enough.
                for threads in (measured if kernels != "reference" else measured[:1]):
                    step(f"host: {info['file']} {kernels} x{threads}")
                    row = host.run_config(info["path"], threads, kernels, opts.warmup, opts.runs, opts.max_secs,
                                          timeout=opts.timeout)
                    results.append(_with_model({**row, "device": "host"}, info))
            binary = binaries.get(benchmark_binary.host_arch())
            if binary is not None:
                for threads in measured:
                    step(f"host: {info['file']} benchmark_model x{threads}")
                    row = benchmark_binary.run_on_host(binary, info["path"], threads, opts.runs, opts.warmup,
                                                       op_profiling=True, peak_memory=opts.peak_memory,
                                                       timeout=opts.timeout)
                    results.append(_with_model({**row, "device": "host"}, info))
            elif binaries and not on_phones:
                note(f"no benchmark binary for this machine ({benchmark_binary.host_arch()}): "
                     f"given builds are for {', '.join(binaries)}")

    device_facts = []
    for device in devices or []:
        try:
            step(f"{device.serial}: reading device facts")
            facts = adb_mod.device_facts(adb, device)
            device_facts.append(facts)
            if facts["thermal"].get("status") not in ("none", "light", "unknown"):
                note(f"{device.serial} is already {adb_mod.thermal_label(facts['thermal'])}: it may throttle, "
                     "let it cool down for steadier numbers")
            arch = benchmark_binary.ABI_ARCH.get(facts["abi"], facts["abi"])
            binary = binaries.get(arch)
            if binary is None:
                raise EdgevitError(f"no benchmark binary for {device.serial} ({facts['model']}, {facts['abi']}): "
                                   f"given builds are for {', '.join(binaries)}")
            job = adb_mod.DeviceRun(models=[Path(i["path"]) for i in infos], binary=binary, binary_arch=arch,
                                    delegates=opts.delegates, threads=opts.threads, runs=opts.runs,
                                    warmup=opts.warmup, op_profiling=opts.op_profiling,
                                    peak_memory=opts.peak_memory, nnapi_accelerator=opts.nnapi_accelerator,
                                    timeout=opts.timeout)
            rows = adb_mod.bench_device(adb, facts, job, on_step=step)
            facts["thermal_after"] = adb_mod.read_thermal(adb, device.serial)  # throttling during the runs?
            for row in rows:
                info = by_file[row.pop("model_file")]
                if row.get("delegate") in ("gpu", "nnapi"):
                    row["expected_fallback_ops"] = _expected_fallbacks(info, row["delegate"], facts.get("sdk"),
                                                                       bool(opts.nnapi_accelerator))
                results.append(_with_model(row, info))
        except EdgevitError as err:
            if opts.device:  # the one phone asked for: the whole command fails
                raise
            note(f"{device.serial}: {err}")
            results.append({"target": device.serial, "device": device.attrs.get("model", device.serial),
                            "status": "failed", "error": str(err)})
    return {"models": infos, "host": host_info if opts.host else None, "devices": device_facts,
            "options": {"delegates": opts.delegates, "threads": opts.threads, "runs": opts.runs,
                        "warmup": opts.warmup, "host_kernels": opts.host_kernels if opts.host else []},
            "warnings": warnings, "results": results}


def _expected_fallbacks(info: dict, delegate: str, sdk: int | None, accelerator_named: bool = False) -> int:
    """What `edgevit check` predicts for this file, delegate and Android level:
    printed next to what the phone reports, to explain a slow delegate."""
    content = Path(info["path"]).read_bytes()
    if delegate == "gpu":
        return len(check_gpu(content).fallbacks)
    return len(check_nnapi(content, android_api=sdk or DEFAULT_ANDROID_API,
                           accelerator_specified=accelerator_named).fallbacks)


def _with_model(row: dict, info: dict) -> dict:
    return {"model": info["model"], "file": info["file"], "precision": info["precision"], **row}
