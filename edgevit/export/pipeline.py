"""The export pipeline behind `edgevit convert`:
calibration data -> conversion -> graph audit -> metadata -> validation -> files.

Outputs are written under temporary names and moved into place only when
every step succeeded, so a failed run never leaves a half-written model.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgevit.data import sample_photos
from edgevit.data.images import list_images, load_images
from edgevit.data.labels import default_labels
from edgevit.errors import EdgevitError
from edgevit.export import graph as graph_mod
from edgevit.export.agreement import agreement
from edgevit.export.convert import (CPU_FLOAT_OPS, INTEGER_PRECISIONS, check_io_dtype, convert, default_io_dtype,
                                    needs_calibration)
from edgevit.export.run_model import run_in_child
from edgevit.litert import delegates as delegate_rules
from edgevit.litert.metadata import build_metadata, embed
from edgevit.native_output import native_output_captured
from edgevit.registry import ModelSpec

MAX_RANK = 4
DEFAULT_VALIDATION_SAMPLES = 32


@dataclass
class ExportOptions:
    precision: str = "int8"
    io_dtype: str | None = None
    calib_dir: str | None = None
    calib_samples: int = 64
    validation_samples: int = DEFAULT_VALIDATION_SAMPLES
    output: str | None = None
    weights_label: str = "random-init"
    recalibrate_batchnorm: bool = False
    validation_threads: int = 2
    # When a quantized file agrees poorly with the Keras model, compare it
    # layer by layer with an fp32 conversion and name where it breaks first.
    diagnose_below_cosine: float | None = None


class Progress:
    """Progress on stderr; silent when ``enabled`` is False (library use)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._console = None
        if enabled:
            from rich.console import Console

            # A private handle on stderr: the converter's native output is
            # captured through file descriptors 1/2 while progress still shows.
            self._console = Console(file=os.fdopen(os.dup(2), "w", buffering=1))

    def step(self, message: str) -> None:
        if self._console:
            self._console.print(f"[bold]>[/bold] {message}")

    @contextmanager
    def bar(self, description: str, total: int):
        if not self._console:
            yield lambda: None
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TimeElapsedColumn

        with Bar(f"  {description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                 console=self._console, transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda: bar.advance(task)


def default_output_path(model_name: str, precision: str) -> Path:
    return Path(f"{model_name}_{precision}.tflite")


def sidecar_paths(tflite_path: Path) -> dict[str, Path]:
    stem = tflite_path.with_suffix("")
    return {"metadata": stem.with_name(stem.name + ".json"),
            "labels": stem.with_name(stem.name + ".labels.txt"),
            "report": stem.with_name(stem.name + ".report.json")}


def _image_sets(spec: ModelSpec, input_size: int, opts: ExportOptions, need_calibration: bool):
    """(calibration batch or None, validation batch, description of both)."""
    pre = spec.preprocessing_at(input_size)
    if opts.calib_dir is None:
        calib = sample_photos.sample_batch(pre, opts.calib_samples) if need_calibration else None
        val = sample_photos.sample_batch(pre, opts.validation_samples, held_out=True)
        source = {"calibration": f"default: {sample_photos.SOURCE_NOTE}" if need_calibration else None,
                  "validation": f"default: held-out {sample_photos.SOURCE_NOTE}"}
        return calib, val, source
    files = list_images(opts.calib_dir)
    order = np.random.default_rng(0).permutation(len(files))
    files = [files[i] for i in order]
    calib, used = load_images(files, pre, limit=opts.calib_samples)
    rest = files[len(used):]
    if len(rest) >= 8:
        val, val_used = load_images(rest, pre, limit=opts.validation_samples)
        val_source = f"{len(val_used)} held-out images of {opts.calib_dir}"
    else:
        val = sample_photos.sample_batch(pre, opts.validation_samples, held_out=True)
        val_source = (f"default: held-out {sample_photos.SOURCE_NOTE} "
                      f"({opts.calib_dir} has too few images beyond the calibration set)")
    source = {"calibration": f"{len(used)} images of {opts.calib_dir}" if need_calibration else None,
              "validation": val_source}
    return (calib if need_calibration else None), val, source


def _checks(summary: graph_mod.GraphSummary, precision: str, io_dtype: str) -> list[dict]:
    checks = [
        {"check": "static batch-1 shapes (no SHAPE/GATHER/PACK/REDUCE_PROD)",
         "passed": not summary.dynamic_shape_ops(),
         "detail": ", ".join(f"{k} x{v}" for k, v in summary.dynamic_shape_ops().items()) or "none"},
        {"check": f"max tensor rank <= {MAX_RANK}", "passed": summary.max_rank <= MAX_RANK,
         "detail": f"max rank {summary.max_rank} ({summary.max_rank_tensor})"},
    ]
    if precision in INTEGER_PRECISIONS:
        floats = summary.float_ops(allow_io_boundary=io_dtype == "float32")
        checks.append({"check": "every op integer (no float op, no inner QUANTIZE/DEQUANTIZE)",
                       "passed": not floats,
                       "detail": ", ".join(f"{op.name}#{op.index}" for op in floats[:10])
                                 + (" ..." if len(floats) > 10 else "") or "none"})
    if precision == "int8_mixed":
        allowed = (*CPU_FLOAT_OPS, "QUANTIZE", "DEQUANTIZE")
        floats = summary.float_ops(allow_io_boundary=True)
        unexpected = [op for op in floats if op.name not in allowed]
        checks.append({"check": f"float only in {'/'.join(CPU_FLOAT_OPS)} (and their (de)quantize)",
                       "passed": not unexpected,
                       "detail": ", ".join(f"{op.name}#{op.index}" for op in unexpected[:10])
                                 or f"{sum(op.name in CPU_FLOAT_OPS for op in floats)} float ops"})
    return checks


def export(model, spec: ModelSpec, opts: ExportOptions, progress: Progress | None = None) -> dict:
    """Convert ``model`` and write NAME.tflite with its sidecars; return the report."""
    progress = progress or Progress(enabled=False)
    precision = opts.precision
    io_dtype = opts.io_dtype or default_io_dtype(precision)
    check_io_dtype(precision, io_dtype)
    input_size = int(model.inputs[0].shape[1])
    out_path = Path(opts.output) if opts.output else default_output_path(spec.name, precision)
    if out_path.suffix != ".tflite":
        raise EdgevitError(f"Output path {str(out_path)!r} must end in .tflite.")
    out_dir = out_path.parent if str(out_path.parent) else Path(".")
    if not out_dir.is_dir():
        raise EdgevitError(f"Output folder {str(out_dir)!r} does not exist.")
    if not os.access(out_dir, os.W_OK):
        raise EdgevitError(f"Output folder {str(out_dir)!r} is not writable.")

    calibrated = needs_calibration(precision)
    calib, val, sources = _image_sets(spec, input_size, opts, need_calibration=calibrated)
    if opts.recalibrate_batchnorm:
        from edgevit.models.batchnorm import recalibrate_batchnorm  # imports every model family: only when asked

        progress.step("No weights given: estimating BatchNorm statistics on the calibration images")
        recalibrate_batchnorm(model, calib if calib is not None else
                              sample_photos.sample_batch(spec.preprocessing_at(input_size), opts.calib_samples))

    progress.step(f"Converting {spec.name} ({input_size}x{input_size}) to {precision}")
    start = time.perf_counter()
    if calibrated:
        with progress.bar("calibrating", total=len(calib)) as advance:
            content = convert(model, precision, calib, io_dtype, on_calibration_step=advance)
    else:
        content = convert(model, precision, io_dtype=io_dtype)
    convert_seconds = time.perf_counter() - start

    summary = graph_mod.describe(content)
    checks = _checks(summary, precision, io_dtype)
    delegates = delegate_compatibility(content)
    labels = default_labels(int(model.outputs[0].shape[-1]))
    paths = sidecar_paths(out_path)
    metadata = build_metadata(
        model_name=spec.name, family=spec.family, precision=precision, weights=opts.weights_label,
        labels=labels, labels_file=paths["labels"].name, graph_input=summary.input,
        graph_output=summary.output, preprocessing=spec.preprocessing_at(input_size).to_dict())
    content = embed(content, metadata)

    with tempfile.TemporaryDirectory(prefix=".edgevit-", dir=out_dir) as staging:
        staged = Path(staging) / out_path.name
        staged.write_bytes(content)
        progress.step(f"Validating on {len(val)} held-out images with LiteRT (XNNPACK)")
        start = time.perf_counter()
        expected = np.asarray(model.predict(val, batch_size=8, verbose=0))
        actual = run_in_child(staged, val, num_threads=opts.validation_threads)
        validate_seconds = time.perf_counter() - start

        report = {
            "model": spec.name,
            "precision": precision,
            "input_size": input_size,
            "weights": opts.weights_label,
            "file": str(out_path),
            "size_bytes": len(content),
            "io": {"input": _public(summary.input), "output": _public(summary.output)},
            "ops": len(summary.ops),
            "macs": summary.macs,
            "op_histogram": summary.op_histogram,
            "max_rank": summary.max_rank,
            "checks": checks,
            "delegates": delegates,
            "images": sources,
            "agreement": agreement(expected, actual),
            "seconds": {"convert": round(convert_seconds, 2), "validate": round(validate_seconds, 2)},
            "files": {"model": str(out_path), **{k: str(v) for k, v in paths.items()}},
        }
        threshold = opts.diagnose_below_cosine
        if (threshold is not None and needs_calibration(precision)
                and report["agreement"]["cosine_mean"] < threshold):
            report["first_breaking_layer"] = _first_breaking_layer(model, content, val, threshold, precision,
                                                                      progress)
        failed = [c for c in checks if not c["passed"]]
        if precision in INTEGER_PRECISIONS and any(c["check"].startswith("every op integer") for c in failed):
            raise EdgevitError(
                f"The {precision} conversion left float ops in the graph "
                f"({next(c['detail'] for c in failed if c['check'].startswith('every op'))}); "
                "no file was written.")
        (Path(staging) / paths["metadata"].name).write_text(json.dumps(metadata, indent=2))
        (Path(staging) / paths["labels"].name).write_text("\n".join(labels) + "\n")
        (Path(staging) / paths["report"].name).write_text(json.dumps(report, indent=2))
        for final in [out_path, *paths.values()]:
            os.replace(Path(staging) / final.name, final)
    return report


def delegate_compatibility(content: bytes) -> dict:
    """Ops the phone GPU / NNAPI delegates would leave on the CPU, and the
    delegate partitions (the rules behind `edgevit check`)."""
    return delegate_rules.summary(delegate_rules.check(content))


# What to try when a quantized file departs from the Keras model.
BREAKING_LAYER_HINTS = {
    "int16x8": "int16x8 already keeps activations in 16 bits: the int8 weights are the loss; "
               "trained weights quantize better than random ones",
}
DEFAULT_BREAKING_LAYER_HINT = ("try --int16x8, or --int8-mixed on the CPU; "
                               "trained weights quantize better than random ones")


def _first_breaking_layer(model, content: bytes, images: np.ndarray, threshold: float, precision: str,
                          progress: Progress) -> dict | None:
    from edgevit.export.diagnose import layerwise_comparison

    progress.step(f"Agreement below cosine {threshold}: comparing every layer with an fp32 conversion")
    fp32 = convert(model, "fp32")
    with native_output_captured():  # LiteRT's own INFO lines
        found = layerwise_comparison(fp32, content, images[:2], threshold=threshold)["first_below"]
    if found is None:
        return None
    return {**found, "threshold": threshold,
            "hint": BREAKING_LAYER_HINTS.get(precision, DEFAULT_BREAKING_LAYER_HINT)}


def _public(tensor: dict) -> dict:
    return {k: tensor[k] for k in ("shape", "dtype", "quantization")}
