"""Latency of a .tflite file on this machine with the LiteRT interpreter.

Each configuration (kernels x threads) runs in a fresh child process: a
crashing kernel (XNNPACK once aborted with ``double free or corruption``)
becomes a failed row instead of killing edgevit, and the child's peak
resident memory (VmHWM) belongs to that configuration alone (Python, numpy
and LiteRT included; ``mem_delta_mb`` is the growth from loading and running
the model).

Kernels: ``xnnpack`` (LiteRT's default CPU delegate), ``builtin`` (optimized
builtin kernels without the default delegate) and ``reference`` (the
reference kernels; slow, useful to separate kernel effects).

Child usage: ``python -m edgevit.profile.host CONFIG.json RESULT.json``.
"""
from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from edgevit.errors import EdgevitError
from edgevit.litert.interpreter import KERNELS, describe_child_failure, load_interpreter
from edgevit.writing import temporary_folder, writing


def _random_input(detail: dict, rng: np.random.Generator) -> np.ndarray:
    dtype, shape = np.dtype(detail["dtype"]), detail["shape"]
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -128), min(info.max, 127) + 1, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raise EdgevitError(f"Cannot make random input of type {dtype}.")


def _rss_mb() -> float:
    """Peak resident memory of this process so far (MB). /proc's VmHWM belongs
    to the current address space; getrusage's ru_maxrss would also count what
    the parent had mapped when it forked this child (it survives exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KB on Linux


def percentiles(times_ms: list[float]) -> dict:
    a = np.asarray(times_ms, dtype=np.float64)
    if a.size == 0:
        return {}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"avg_ms": float(a.mean()), "std_ms": float(a.std()), "min_ms": float(a.min()),
            "max_ms": float(a.max()), "p50_ms": float(p50), "p90_ms": float(p90), "p99_ms": float(p99)}


def bench_in_process(model_path: str, threads: int = 1, kernels: str = "xnnpack", warmup: int = 5,
                     runs: int = 50, max_secs: float = 60.0, seed: int = 0) -> dict:
    """Init, first inference, warm-up, counted runs; times in ms."""
    content = Path(model_path).read_bytes()
    baseline_mb = _rss_mb()
    start = time.perf_counter()
    interp = load_interpreter(content, num_threads=threads, kernels=kernels)
    interp.allocate_tensors()
    init_ms = (time.perf_counter() - start) * 1e3
    rng = np.random.default_rng(seed)
    for detail in interp.get_input_details():
        interp.set_tensor(detail["index"], _random_input(detail, rng))
    start = time.perf_counter()
    interp.invoke()
    first_ms = (time.perf_counter() - start) * 1e3
    deadline = time.perf_counter() + max_secs
    warm = []
    for _ in range(warmup):
        t = time.perf_counter()
        interp.invoke()
        warm.append((time.perf_counter() - t) * 1e3)
    times = []
    while len(times) < runs and (not times or time.perf_counter() < deadline):
        t = time.perf_counter()
        interp.invoke()
        times.append((time.perf_counter() - t) * 1e3)
    peak_mb = _rss_mb()
    return {"init_ms": init_ms, "first_ms": first_ms,
            "warmup_avg_ms": float(np.mean(warm)) if warm else None, "runs": len(times),
            **percentiles(times), "peak_mem_mb": peak_mb, "mem_delta_mb": peak_mb - baseline_mb}


# CPU flags of int8 dot-product instructions (x86 /proc/cpuinfo "flags",
# Arm "Features"). Without them XNNPACK's int8 GEMMs run about as fast as
# fp32 ones, so int8 files gain little or nothing on that CPU.
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


def host_description(cpuinfo: str | None = None) -> str:
    """CPU name, core count and its int8 dot-product instructions."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    names, flags = [], set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Hardware"):
            names.append(value.strip())
        elif key in ("flags", "Features"):
            flags |= set(value.split())
    cpu = names[0] if names else platform.processor() or platform.machine()
    dot = [f for f in INT8_DOT_FLAGS if f in flags]
    return f"{cpu}, {os.cpu_count()} cores, int8 dot product: {', '.join(dot) or 'none'}"


def run_config(model_path: str | Path, threads: int, kernels: str, warmup: int = 5, runs: int = 50,
               max_secs: float = 60.0, timeout: float = 600.0) -> dict:
    """One configuration in a child process; a record with ``status`` ok / crashed / timeout."""
    if kernels not in KERNELS:
        raise EdgevitError(f"Unknown host kernels {kernels!r}; choose from {', '.join(KERNELS)}.")
    record = {"target": "host", "runtime": "litert-python", "delegate": kernels, "threads": threads}
    with temporary_folder("edgevit-bench-") as tmp:
        config, result = tmp / "config.json", tmp / "result.json"
        with writing(config):
            config.write_text(json.dumps({"model_path": str(model_path), "threads": threads, "kernels": kernels,
                                          "warmup": warmup, "runs": runs, "max_secs": max_secs}))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        try:
            proc = subprocess.run([sys.executable, "-m", "edgevit.profile.host", str(config), str(result)],
                                  capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return {**record, "status": "timeout", "error": f"no result within {timeout:.0f} s"}
        if proc.returncode != 0 or not result.exists():
            return {**record, "status": "crashed", "error": describe_child_failure(proc.returncode, proc.stderr)}
        return {**record, "status": "ok", "error": None, **json.loads(result.read_text())}


def _child_main(argv: list[str]) -> None:
    config = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(bench_in_process(**config)))


if __name__ == "__main__":
    _child_main(sys.argv[1:])
