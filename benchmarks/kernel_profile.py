"""Where a .tflite file's time goes on this CPU, kernel by kernel.

LiteRT's Python interpreter exposes no op profiler, and with XNNPACK the
whole graph is one delegate node anyway. LiteRT's shared library keeps the
symbol names of XNNPACK's microkernels, though, so `perf` sampling says how
much CPU time each kernel takes (`xnn_f32_gemm_minmax_ukernel_7x32__avx512f_broadcast`
is an fp32 GEMM, `xnn_x8_lut_ukernel_*` an int8 table lookup such as
LOGISTIC, `tflite::optimized_ops::Softmax<signed char, ...>` a builtin
kernel outside XNNPACK). Each file runs in a child process; perf attaches
only once the interpreter is built and warm, so loading and Python start-up
are not counted. Kernels are grouped into families; times are CPU ms per
inference (samples / rate / runs), so on one thread they add up to about
the wall time, which the table shows beside them. The families are
those of edgevit.profile.kernels, shared with the Arm64 instruction counts.

    python benchmarks/kernel_profile.py a_fp32.tflite a_int8_mixed.tflite
    python benchmarks/kernel_profile.py model.tflite --runs 400 --kernels --json out.json

Needs `perf` (Debian: `apt-get install linux-perf`); where the kernel allows
no hardware counters (virtual machines) it samples the software cpu-clock.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgevit.profile.kernels import family_of

CHILD = r"""
import sys, time, numpy as np
from pathlib import Path
from edgevit.litert.interpreter import load_interpreter
path, threads, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
interp = load_interpreter(Path(path).read_bytes(), num_threads=threads)
interp.allocate_tensors()
for detail in interp.get_input_details():
    interp.set_tensor(detail["index"], np.random.default_rng(0).random(detail["shape"]).astype(detail["dtype"]))
for _ in range(10):
    interp.invoke()
print("ready", flush=True)
sys.stdin.readline()
times = []
for _ in range(runs):
    start = time.perf_counter()
    interp.invoke()
    times.append(time.perf_counter() - start)
print("median_ms", 1e3 * float(np.median(times)), flush=True)
"""


def parse_report(text: str) -> dict[str, int]:
    """Samples per symbol from `perf report --stdio --sort symbol -n`."""
    samples = {}
    for line in text.splitlines():
        match = re.match(r"\s*[\d.]+%\s+(\d+)\s+\[[.k]\]\s+(.+?)\s*$", line)
        if match:
            samples[match.group(2)] = samples.get(match.group(2), 0) + int(match.group(1))
    return samples


def profile(path: Path, threads: int, runs: int, frequency: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="edgevit-perf-") as tmp:
        data = Path(tmp) / "perf.data"
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(threads), str(runs)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if child.stdout.readline().strip() != "ready":
            child.kill()
            raise SystemExit(f"{path}: the interpreter did not start")
        perf = subprocess.Popen(["perf", "record", "-q", "-F", str(frequency), "-e", "cpu-clock", "-o", str(data),
                                 "-p", str(child.pid)], stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # perf attaches
        child.stdin.write("go\n")
        child.stdin.flush()
        median_ms = float(child.stdout.readline().split()[1])
        child.wait()
        perf.wait()
        report = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "symbol",
                                 "-n"], capture_output=True, text=True, check=True).stdout
    samples = parse_report(report)
    per_run = 1e3 / frequency / runs
    families: dict[str, float] = {}
    for symbol, count in samples.items():
        family = family_of(symbol)
        families[family] = families.get(family, 0.0) + count * per_run
    kernels = sorted(((s, c * per_run) for s, c in samples.items()), key=lambda kv: -kv[1])
    return {"file": str(path), "threads": threads, "runs": runs, "median_ms": round(median_ms, 3),
            "cpu_ms": round(sum(c for _, c in kernels), 3),
            "families_ms": {k: round(v, 3) for k, v in sorted(families.items(), key=lambda kv: -kv[1])},
            "kernels_ms": [[s, round(ms, 3)] for s, ms in kernels if ms >= 0.005]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--frequency", type=int, default=4999, help="perf samples per second")
    parser.add_argument("--kernels", action="store_true", help="Also list each kernel's time.")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    if shutil.which("perf") is None:
        print("error: perf not found (Debian: apt-get install linux-perf)", file=sys.stderr)
        return 1
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        print(f"error: no such file: {', '.join(missing)}", file=sys.stderr)
        return 1

    results = []
    for path in args.files:
        print(f"profiling {path} ({args.runs} runs, {args.threads} thread(s))", file=sys.stderr)
        results.append(profile(path, args.threads, args.runs, args.frequency))

    from edgevit.cli.output import print_table
    from edgevit.profile.host import host_description

    families = list(dict.fromkeys(f for r in results for f in r["families_ms"]))
    rows = [[family, *[r["families_ms"].get(family, 0.0) for r in results]] for family in families]
    rows.append(["sum of samples (CPU ms)", *[r["cpu_ms"] for r in results]])
    rows.append(["median wall ms per inference", *[r["median_ms"] for r in results]])
    print_table(f"CPU ms per inference by kernel family, LiteRT XNNPACK, {args.threads} thread(s), "
                f"{host_description()}", ["kernel family", *[r["file"] for r in results]], rows)
    if args.kernels:
        for r in results:
            print_table(r["file"], ["kernel", "ms"], r["kernels_ms"][:25])
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"host": host_description(), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
