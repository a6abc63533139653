"""The official `benchmark_model` tool: command lines per delegate, which
machine a build runs on (read from its ELF header), running it on this
machine, and turning its output into a result row."""
from __future__ import annotations

import platform
import re
import signal
import subprocess
from pathlib import Path

from edgevit.errors import EdgevitError
from edgevit.profile import benchmark_output

# ELF e_machine -> architecture name; Android ABI -> architecture name.
ELF_MACHINES = {0x03: "x86", 0x28: "arm", 0x3E: "x86_64", 0xB7: "aarch64"}
ABI_ARCH = {"arm64-v8a": "aarch64", "armeabi-v7a": "arm", "armeabi": "arm", "x86_64": "x86_64", "x86": "x86"}
DELEGATES = ("cpu", "gpu", "nnapi")
TOP_OPS = 8


def elf_arch(path: str | Path) -> str | None:
    """Architecture a binary was built for, or None if it is not an ELF file."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError as err:
        raise EdgevitError(f"Cannot read benchmark binary {str(path)!r}: {err.strerror}.") from None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    order = "little" if head[5] == 1 else "big"
    return ELF_MACHINES.get(int.from_bytes(head[18:20], order), f"machine {int.from_bytes(head[18:20], order)}")


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64", "i686": "x86", "i386": "x86"}.get(machine, machine)


def check_binary(path: str | Path) -> str:
    """The binary's architecture; a clear error when it is missing or not ELF."""
    p = Path(path)
    if not p.exists():
        raise EdgevitError(f"Benchmark binary {str(path)!r} does not exist: download a benchmark_model build "
                           "(e.g. the TFLite/LiteRT nightly for android_aarch64 or linux_x86-64) and pass its path.")
    if p.is_dir():
        raise EdgevitError(f"Benchmark binary {str(path)!r} is a folder, not the benchmark_model executable.")
    arch = elf_arch(p)
    if arch is None:
        with open(p, "rb") as f:
            if f.read(2) == b"#!":  # a wrapper script runs here, on this machine
                return host_arch()
        raise EdgevitError(f"{str(path)!r} is not an executable benchmark_model build (no ELF header).")
    return arch


def benchmark_args(graph: str, delegate: str, threads: int, runs: int, warmup: int,
                   op_profiling: bool = False, peak_memory: bool = False,
                   nnapi_accelerator: str | None = None) -> list[str]:
    if delegate not in DELEGATES:
        raise EdgevitError(f"Unknown delegate {delegate!r}; choose from {', '.join(DELEGATES)}.")
    args = [f"--graph={graph}", f"--num_threads={threads}", f"--num_runs={runs}", f"--warmup_runs={warmup}"]
    if delegate == "gpu":
        args.append("--use_gpu=true")
    elif delegate == "nnapi":
        args.append("--use_nnapi=true")
        if nnapi_accelerator:
            args.append(f"--nnapi_accelerator_name={nnapi_accelerator}")
    if op_profiling:
        args.append("--enable_op_profiling=true")
    if peak_memory:
        args.append("--report_peak_memory_footprint=true")
    return args


def _signal_name(returncode: int) -> str | None:
    sig = -returncode if returncode < 0 else (returncode - 128 if 128 < returncode < 160 else None)
    if sig is None:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _last_lines(text: str, n: int = 2) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-n:])


def record_from_output(text: str, returncode: int, delegate: str, binary_name: str = "benchmark_model") -> dict:
    """A result row from one run's output and exit status (status: ok, refused,
    missing, crashed, failed)."""
    parsed = benchmark_output.parse(text)
    row: dict = {"runtime": "benchmark_model", "delegate": delegate}
    lowered = text.lower()
    delegate_error = next((e for e in parsed.errors if "failed to apply" in e.lower() or
                           ("delegate" in e.lower() and "error" in e.lower())), None)
    if returncode == 0 and parsed.has_timings:
        row.update(status="ok", error=None)
    elif returncode in (126, 127) and ("not found" in lowered or "no such file" in lowered):
        row.update(status="missing", error=f"{binary_name} was not found on the target "
                                             f"({_last_lines(text, 1) or f'exit status {returncode}'})")
    elif "not executable" in lowered or "exec format error" in lowered or returncode == 126:
        row.update(status="failed", error=f"{binary_name} cannot run there ({_last_lines(text, 1)})")
    elif delegate_error and not parsed.has_timings:
        row.update(status="refused", error=f"{delegate.upper()} delegate refused: {delegate_error}")
    elif returncode != 0:
        sig = _signal_name(returncode)
        how = f"crashed ({sig}, exit status {returncode})" if sig else f"failed (exit status {returncode})"
        row.update(status="crashed" if sig else "failed",
                   error=f"{binary_name} {how}" + (f": {_last_lines(text)}" if text.strip() else ""))
    else:
        row.update(status="failed", error=f"no timings in {binary_name} output ({_last_lines(text)})")
    if row["status"] == "ok" and delegate in ("gpu", "nnapi"):
        _flag_undelegated(row, parsed, delegate, text)
    runs = parsed.runs
    row.update({
        "runs": runs.count if runs else None,
        "init_ms": _ms(parsed.init_us), "first_ms": _ms(parsed.first_us), "warmup_avg_ms": _ms(parsed.warmup_avg_us),
        "avg_ms": _ms(parsed.inference_avg_us if parsed.inference_avg_us is not None else (runs.avg if runs else None)),
        "std_ms": _ms(runs.std) if runs else None, "min_ms": _ms(runs.min) if runs else None,
        "max_ms": _ms(runs.max) if runs else None, "p5_ms": _ms(runs.p5) if runs else None,
        "p50_ms": _ms(runs.median) if runs else None, "p95_ms": _ms(runs.p95) if runs else None,
        "p90_ms": None, "p99_ms": None,
        "peak_mem_mb": parsed.peak_memory_mb, "mem_delta_mb": parsed.memory_overall_mb,
        "delegated_nodes": parsed.delegated_nodes, "total_nodes": parsed.total_nodes,
        "delegate_kernels": next((v["delegate_kernels"] for k, v in parsed.applied.items()
                                  if k.lower() == delegate or (delegate == "cpu" and k == "XNNPACK")), None),
        "op_profile": parsed.op_type_summary()[:TOP_OPS],
    })
    return row


def _ms(us):
    return None if us is None else us / 1e3


def _flag_undelegated(row: dict, parsed, delegate: str, text: str) -> None:
    """benchmark_model still prints timings when the delegate took nothing
    (NNAPI unavailable, every op refused): that row measured the CPU."""
    applied = {k.lower(): v for k, v in parsed.applied.items()}
    replaced = parsed.delegate is not None and delegate in parsed.delegate.lower() and parsed.delegated_nodes
    if applied.get(delegate, {}).get("delegate_kernels") == 0 or (delegate not in applied and not replaced):
        refusal = re.compile(r"unsupported|not supported|failed|unavailable", re.I)
        hint = next((line.strip() for line in text.splitlines() if delegate in line.lower() and refusal.search(line)),
                    "no sign in the output that the delegate took any op")
        row.update(status="not delegated", error=f"{delegate.upper()} took no op, the run measured the CPU ({hint})")


def run_on_host(binary: str | Path, model: str | Path, threads: int, runs: int, warmup: int,
                op_profiling: bool = True, peak_memory: bool = False, timeout: float = 600.0) -> dict:
    args = benchmark_args(str(model), "cpu", threads, runs, warmup, op_profiling, peak_memory)
    base = {"target": "host", "threads": threads}
    try:
        proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        partial = (err.stdout or b"").decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        return {**base, "runtime": "benchmark_model", "delegate": "cpu", "status": "timeout",
                "error": f"benchmark_model gave no result within {timeout:.0f} s"
                         + (f" (last output: {_last_lines(partial, 1)})" if partial.strip() else "")}
    except OSError as err:
        return {**base, "runtime": "benchmark_model", "delegate": "cpu", "status": "failed",
                "error": f"cannot run {binary}: {err.strerror}"}
    return {**base, **record_from_output(proc.stdout + "\n" + proc.stderr, proc.returncode, "cpu")}
