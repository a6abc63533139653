"""Peak resident memory of `edgevit convert --int8 MODEL`, stage by stage,
against the plain TFLiteConverter route on the same Keras model, in one run.

Each side runs in its own child process, one after the other (never two
conversions at once), and a sampler thread here sums the resident memory of
the child's whole process tree (LiteRT runs, GPU and Arm64 checks and any
other children included) every SAMPLE_SECONDS. The edgevit side is the CLI
command as a user runs it, every default stage included; its progress lines
on stderr mark where each stage begins. The plain side builds the same model
and converts a batch-1 concrete function with a representative dataset of
the same calibration images, TFLITE_BUILTINS_INT8 and int8 in and out.

    python benchmarks/memory.py                                  # the headline model
    python benchmarks/memory.py mobilevit_v3_xxs vit_tiny16 --json memory.json
    python benchmarks/memory.py --edgevit-args --input-size 128  # extra convert options
    python benchmarks/memory.py --each-family smallest --calib-samples 16
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HEADLINE = "mobilevit_v3_xs"
SAMPLE_SECONDS = 0.1
GB = 1e9
# The first words of each `edgevit convert` progress line -> the stage it starts.
STAGES = (
    ("Building", "build"),
    ("No weights given: estimating BatchNorm", "batchnorm"),
    ("Converting", "convert"),
    ("Validating", "validate"),
    ("Classifying", "top5 photos"),
    ("Running on", "gpu or arm run"),  # refined below: the line names which
    ("Agreement below cosine", "diagnose"),
)


def stage_of(line: str) -> str | None:
    text = line.lstrip("> ").strip()
    for start, stage in STAGES:
        if text.startswith(start):
            if stage == "gpu or arm run":
                return "arm run" if "Arm64" in text else "gpu run"
            return stage
    return None


def tree_rss(root: int) -> tuple[int, int]:
    """Resident bytes of ``root`` and all its descendants, summed, and of
    ``root`` alone. A child forked but not yet running its own program (its
    command line still its parent's) shares its parent's pages: not counted."""
    total, own, pending = 0, 0, [(root, None)]
    while pending:
        pid, parent_cmdline = pending.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            if cmdline == parent_cmdline:
                continue
            with open(f"/proc/{pid}/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            total += rss
            own = rss if pid == root else own
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    pending += [(int(child), cmdline) for child in f.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total, own


class RunFailed(Exception):
    """One side of one model's comparison ended with an error (said in the row, the others still run)."""


def measure(what: str, cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``; peak tree memory per stage (from its progress lines on
    stderr), in total, and its wall seconds; stdout as text."""
    # [name, start time, peak bytes, main's peak, main's at the tree's peak]
    stages: list[list] = [["start", time.perf_counter(), 0, 0, 0]]
    done = threading.Event()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def sample():
        while not done.is_set():
            total, own = tree_rss(proc.pid)
            current = stages[-1]
            if total > current[2]:  # the main process's part of the peak (its own peak may come without children)
                current[2], current[4] = total, own
            current[3] = max(current[3], own)
            time.sleep(SAMPLE_SECONDS)

    stderr_lines = []

    def read_stderr():
        for line in proc.stderr:
            stderr_lines.append(line)
            stage = stage_of(line)
            if stage is not None:
                stages.append([stage, time.perf_counter(), 0, 0, 0])

    threads = [threading.Thread(target=sample, daemon=True), threading.Thread(target=read_stderr, daemon=True)]
    for t in threads:
        t.start()
    start = stages[0][1]
    stdout = proc.stdout.read()
    proc.wait()
    end = time.perf_counter()
    done.set()
    for t in threads:
        t.join()
    if proc.returncode != 0:
        raise RunFailed(f"{what} failed (exit {proc.returncode}): " + "".join(stderr_lines[-5:]).strip())
    per_stage = {}
    for (name, begin, peak, own, own_at_peak), following in zip(stages, stages[1:] + [[None, end]]):
        if not peak:
            continue  # over before the first sample (a BatchNorm estimation of a model without BatchNorm)
        entry = per_stage.setdefault(name, {"peak_gb": 0.0, "main_process_peak_gb": 0.0,
                                            "main_process_at_peak_gb": 0.0, "seconds": 0.0})
        if peak / GB > entry["peak_gb"]:
            entry["peak_gb"], entry["main_process_at_peak_gb"] = round(peak / GB, 3), round(own_at_peak / GB, 3)
        entry["main_process_peak_gb"] = round(max(entry["main_process_peak_gb"], own / GB), 3)
        entry["seconds"] = round(entry["seconds"] + following[1] - begin, 1)
    return {"peak_gb": max(s["peak_gb"] for s in per_stage.values()), "seconds": round(end - start, 1),
            "stages": per_stage, "stdout": stdout}


PLAIN = """
import json, sys, time
import numpy as np
import tensorflow as tf
import edgevit
from edgevit.data import sample_photos
from edgevit.registry import get_spec

name, samples, size = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spec = get_spec(name)
model = edgevit.create_model(name, **({"input_size": int(size)} if size != "default" else {}))
input_size = int(model.inputs[0].shape[1])
images = sample_photos.sample_batch(spec.preprocessing_at(input_size), samples)
forward = tf.function(lambda x: model(x, training=False)).get_concrete_function(
    tf.TensorSpec([1, input_size, input_size, 3], tf.float32))
converter = tf.lite.TFLiteConverter.from_concrete_functions([forward], model)
converter.experimental_lower_to_saved_model = False  # else the variables stay variables: READ_VARIABLE fails
converter.optimizations = [tf.lite.Optimize.DEFAULT]
converter.representative_dataset = lambda: ([x[None]] for x in images)
converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
converter.inference_input_type = converter.inference_output_type = tf.int8
start = time.perf_counter()
content = converter.convert()
print(json.dumps({"convert_seconds": time.perf_counter() - start, "size_bytes": len(content)}))
"""


def plain_route(model: str, samples: int, input_size: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    run = measure(f"the plain converter on {model}",
                  [sys.executable, "-c", PLAIN, model, str(samples), input_size], env)
    run.update(json.loads(run.pop("stdout").strip().splitlines()[-1]))
    return run


def edgevit_route(model: str, samples: int, input_size: str, extra: list[str], out_dir: Path) -> dict:
    # without --json: its progress lines mark the stages, and the report sidecar holds what --json prints
    out = out_dir / f"{model}_int8.tflite"
    cmd = [sys.executable, "-m", "edgevit", "convert", model, "--int8", "--calib-samples", str(samples),
           "-o", str(out), *extra]
    if input_size != "default":
        cmd += ["--input-size", input_size]
    run = measure(f"edgevit convert {model}", cmd)
    run.pop("stdout")
    report = json.loads(out.with_suffix(".report.json").read_text())
    run.update(convert_seconds=report["seconds"]["convert"], validate_seconds=report["seconds"]["validate"],
               size_bytes=report["size_bytes"], cosine_mean=report["agreement"]["cosine_mean"],
               diagnosed="first_breaking_layer" in report,
               gpu_run=report.get("gpu_accelerator", {}).get("ran", False),
               arm_run=report.get("arm64", {}).get("ran", False))
    return run


def compare(model: str, samples: int, input_size: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        print(f"> {model}: the plain converter", file=sys.stderr, flush=True)
        plain = plain_route(model, samples, input_size)
        print(f"> {model}: edgevit convert --int8 {' '.join(extra)}", file=sys.stderr, flush=True)
        ours = edgevit_route(model, samples, input_size, extra, Path(tmp))
    return {"model": model, "input_size": input_size, "calib_samples": samples, "plain": plain, "edgevit": ours,
            "peak_ratio": round(ours["peak_gb"] / plain["peak_gb"], 2),
            "convert_time_ratio": round(ours["convert_seconds"] / plain["convert_seconds"], 2),
            "command_time_ratio": round(ours["seconds"] / plain["seconds"], 2)}


def print_table(row: dict) -> None:
    plain, ours = row["plain"], row["edgevit"]
    print(f"\n{row['model']} (input {row['input_size']}, {row['calib_samples']} calibration images)")
    print(f"  plain converter: peak {plain['peak_gb']:.2f} GB, convert {plain['convert_seconds']:.1f} s, "
          f"whole process {plain['seconds']:.1f} s")
    print(f"  edgevit convert: peak {ours['peak_gb']:.2f} GB ({row['peak_ratio']:.2f}x), "
          f"convert {ours['convert_seconds']:.1f} s ({row['convert_time_ratio']:.2f}x), "
          f"validate {ours['validate_seconds']:.1f} s, whole command {ours['seconds']:.1f} s "
          f"({row['command_time_ratio']:.2f}x)")
    print(f"  agreement with Keras: cosine {ours['cosine_mean']:.4f}"
          + ("; diagnosed layer by layer" if ours["diagnosed"] else "; no diagnosis (cosine >= 0.98)"))
    print(f"  {'stage':<14} {'peak GB':>8} {'main GB':>8} {'at peak':>8} {'seconds':>8}   (main: the edgevit process "
          "alone, its peak and its part of the stage's peak)")
    for name, stage in ours["stages"].items():
        print(f"  {name:<14} {stage['peak_gb']:>8.2f} {stage['main_process_peak_gb']:>8.2f} "
              f"{stage['main_process_at_peak_gb']:>8.2f} {stage['seconds']:>8.1f}")


def family_ends(end: str) -> list[str]:
    """The variant of every family with the fewest (``smallest``) or the most
    (``largest``) parameters in the catalog."""
    from edgevit.registry import get_spec, list_models

    by_family: dict[str, list] = {}
    for name in list_models():
        spec = get_spec(name)
        by_family.setdefault(spec.family, []).append((spec.parameters or 0, name))
    pick = min if end == "smallest" else max
    return [pick(variants)[1] for _, variants in sorted(by_family.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help=f"Default: {HEADLINE} (unless --each-family).")
    parser.add_argument("--each-family", choices=["smallest", "largest"],
                        help="Measure the smallest (largest) variant of every family, by parameters, after MODELS.")
    parser.add_argument("--calib-samples", type=int, default=64)
    parser.add_argument("--input-size", default="default")
    parser.add_argument("--json", type=Path, help="Also write the rows here.")
    parser.add_argument("--edgevit-args", nargs=argparse.REMAINDER, default=[],
                        help="Options added to `edgevit convert` (last on the line).")
    args = parser.parse_args()
    if args.json is not None and not args.json.parent.is_dir():
        sys.exit(f"error: {args.json.parent} is not a folder")
    models = args.models + (family_ends(args.each_family) if args.each_family else [])
    models = models or [HEADLINE]
    rows = []
    failed = 0
    for model in models:
        try:
            row = compare(model, args.calib_samples, args.input_size, args.edgevit_args)
            print_table(row)
        except RunFailed as err:
            print(f"error: {err}", file=sys.stderr)
            row, failed = {"model": model, "error": str(err)}, failed + 1
        rows.append(row)
        if args.json is not None:
            args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if failed:
        sys.exit(f"error: {failed} of {len(models)} model(s) failed (see above)")


if __name__ == "__main__":
    main()
