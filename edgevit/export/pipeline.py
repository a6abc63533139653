"""The export pipeline behind `edgevit convert`, as named stages:

prepare -> convert -> audit -> package -> validate -> GPU run -> (diagnose) -> write

The output paths are checked before any work; outputs are written to a
staging folder beside them and moved into place only when every stage
succeeded, all four or none (files they replace are put back when a move
fails), so a failed or interrupted run never leaves a half-written set.
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
from edgevit.export.agreement import agreement
from edgevit.export.audit import Audit, audit
from edgevit.export.convert import check_io_dtype, convert, default_io_dtype, needs_calibration
from edgevit.export.diagnose import layerwise_comparison
from edgevit.export.result import Check, ExportFiles, ExportResult, ImageSources
from edgevit.export.run_model import run_in_child
from edgevit.litert.accelerator import GpuRun, missing_vulkan, run_on_gpu
from edgevit.litert.metadata import build_metadata, embed
from edgevit.native_output import native_output_captured
from edgevit.registry import ModelSpec
from edgevit.saving import check_writable, class_names_of

DEFAULT_VALIDATION_SAMPLES = 32
DEFAULT_GPU_IMAGES = 8
# Precisions whose files GPU delegates run entirely (dynamic-range and int16
# kernels stay on the CPU): the export holds only these to the GPU run.
GPU_PRECISIONS = ("fp32", "fp16", "int8", "int8_mixed")


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
    # Held-out images the file also runs on with LiteRT's GPU accelerator
    # against XNNPACK, where a Vulkan device exists (0: no GPU run).
    gpu_images: int = DEFAULT_GPU_IMAGES


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


@dataclass
class Prepared:
    """What the stages after `prepare` work from."""
    files: ExportFiles
    io_dtype: str
    input_size: int
    calibration: np.ndarray | None      # None: the precision needs no calibration
    validation: np.ndarray
    images: ImageSources


@dataclass
class Package:
    """The file as it will be written, with its sidecars' content."""
    content: bytes
    metadata: dict
    labels: list[str]


def prepare(model, spec: ModelSpec, opts: ExportOptions, progress: Progress) -> Prepared:
    """Check the options and the output path, load the image sets and, when
    asked, re-estimate BatchNorm statistics on the calibration images."""
    io_dtype = opts.io_dtype or default_io_dtype(opts.precision)
    check_io_dtype(opts.precision, io_dtype)
    input_size = int(model.inputs[0].shape[1])
    out_path = Path(opts.output) if opts.output else default_output_path(spec.name, opts.precision)
    files = ExportFiles.beside(out_path)
    check_output_paths(files)

    calib, val, images = _image_sets(spec, input_size, opts, need_calibration=needs_calibration(opts.precision))
    if opts.recalibrate_batchnorm:
        from edgevit.models.batchnorm import recalibrate_batchnorm  # imports every model family: only when asked

        progress.step("No weights given: estimating BatchNorm statistics on the calibration images")
        recalibrate_batchnorm(model, calib if calib is not None else
                              sample_photos.sample_batch(spec.preprocessing_at(input_size), opts.calib_samples))
    return Prepared(files, io_dtype, input_size, calib, val, images)


def check_output_paths(files: ExportFiles) -> None:
    """Fail before any work when one of the four files could not be put in
    place (see :func:`edgevit.saving.check_writable`)."""
    if files.model.suffix != ".tflite":
        raise EdgevitError(f"Output path {str(files.model)!r} must end in .tflite.")
    check_writable(files.all())


def _image_sets(spec: ModelSpec, input_size: int, opts: ExportOptions,
                need_calibration: bool) -> tuple[np.ndarray | None, np.ndarray, ImageSources]:
    """(calibration batch or None, validation batch, description of both)."""
    pre = spec.preprocessing_at(input_size)
    if opts.calib_dir is None:
        calib = sample_photos.sample_batch(pre, opts.calib_samples) if need_calibration else None
        val = sample_photos.sample_batch(pre, opts.validation_samples, held_out=True)
        source = ImageSources(f"default: {sample_photos.SOURCE_NOTE}" if need_calibration else None,
                              f"default: held-out {sample_photos.SOURCE_NOTE}")
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
    source = ImageSources(f"{len(used)} images of {opts.calib_dir}" if need_calibration else None, val_source)
    return (calib if need_calibration else None), val, source


def convert_model(model, spec: ModelSpec, opts: ExportOptions, job: Prepared,
                  progress: Progress) -> tuple[bytes, float]:
    """The .tflite bytes and the seconds the conversion took."""
    progress.step(f"Converting {spec.name} ({job.input_size}x{job.input_size}) to {opts.precision}")
    start = time.perf_counter()
    if job.calibration is not None:
        with progress.bar("calibrating", total=len(job.calibration)) as advance:
            content = convert(model, opts.precision, job.calibration, job.io_dtype, on_calibration_step=advance,
                              float_layers=spec.mixed_float_layers)
    else:
        content = convert(model, opts.precision, io_dtype=job.io_dtype)
    return content, time.perf_counter() - start


def package(content: bytes, model, spec: ModelSpec, opts: ExportOptions, job: Prepared, checked: Audit) -> Package:
    """Embed the metadata document in the file; the labels go beside it:
    the class names the model was trained with, or the defaults."""
    labels = class_names_of(model) or default_labels(int(model.outputs[0].shape[-1]))
    metadata = build_metadata(
        model_name=spec.name, family=spec.family, precision=opts.precision, weights=opts.weights_label,
        labels=labels, labels_file=job.files.labels.name, graph_input=checked.summary.input,
        graph_output=checked.summary.output, preprocessing=spec.preprocessing_at(job.input_size).to_dict())
    return Package(embed(content, metadata), metadata, labels)


def validate(model, staged_model: Path, images: np.ndarray, threads: int, progress: Progress) -> tuple[dict, float]:
    """Agreement of the staged file, run by LiteRT in a child process, with the
    Keras model on held-out images; and the seconds it took."""
    progress.step(f"Validating on {len(images)} held-out images with LiteRT (XNNPACK)")
    start = time.perf_counter()
    expected = np.asarray(model.predict(images, batch_size=8, verbose=0))
    actual = run_in_child(staged_model, images, num_threads=threads)
    return agreement(expected, actual), time.perf_counter() - start


def gpu_run(staged_model: Path, images: np.ndarray, precision: str, progress: Progress) -> GpuRun:
    """The staged file on LiteRT's GPU accelerator against XNNPACK (a
    not-run record, saying why, when this machine has no Vulkan device)."""
    if missing_vulkan() is None:
        progress.step(f"Running on {len(images)} held-out images with LiteRT's GPU accelerator")
    return run_on_gpu(staged_model, images, precision, images=f"{len(images)} held-out validation images")


# What to try when a quantized file departs from the Keras model.
BREAKING_LAYER_HINTS = {
    "int16x8": "int16x8 already keeps activations in 16 bits: the int8 weights are the loss; "
               "trained weights quantize better than random ones",
}
DEFAULT_BREAKING_LAYER_HINT = ("try --int16x8, or --int8-mixed on the CPU; "
                               "trained weights quantize better than random ones")


def diagnose(model, content: bytes, images: np.ndarray, threshold: float, precision: str,
             progress: Progress) -> dict | None:
    """The first layer where ``content`` departs from an fp32 conversion of
    ``model`` (None when no layer falls below ``threshold``)."""
    progress.step(f"Agreement below cosine {threshold}: comparing every layer with an fp32 conversion")
    fp32 = convert(model, "fp32")
    with native_output_captured():  # LiteRT's own INFO lines
        found = layerwise_comparison(fp32, content, images[:2], threshold=threshold)["first_below"]
    if found is None:
        return None
    return {**found, "threshold": threshold,
            "hint": BREAKING_LAYER_HINTS.get(precision, DEFAULT_BREAKING_LAYER_HINT)}


def write(staging: Path, packaged: Package, result: ExportResult) -> None:
    """Write the sidecars next to the staged model, then move every file into
    place: nothing reaches the output folder before every stage succeeded."""
    files = result.files
    (staging / files.metadata.name).write_text(json.dumps(packaged.metadata, indent=2))
    (staging / files.labels.name).write_text("\n".join(packaged.labels) + "\n")
    (staging / files.report.name).write_text(json.dumps(result.to_dict(), indent=2))
    replace_all(files.all(), staging)


def replace_all(finals: list[Path], staging: Path) -> None:
    """Move ``staging/<name>`` onto each of ``finals``, all or nothing: the
    files they replace are moved aside first and put back if any move fails
    or is interrupted."""
    previous = staging / "previous"
    previous.mkdir()
    moved_aside, placed = [], []
    current = finals[0]
    try:
        for current in finals:
            if current.exists():
                os.replace(current, previous / current.name)
                moved_aside.append(current)
        for current in finals:
            os.replace(staging / current.name, current)
            placed.append(current)
    except BaseException as err:
        for final in placed:
            final.unlink(missing_ok=True)
        for final in moved_aside:
            os.replace(previous / final.name, final)
        if isinstance(err, OSError):
            raise EdgevitError(f"Could not write {str(current)!r}: {err.strerror}; "
                               "the files that were there before are back in place.") from None
        raise


def export(model, spec: ModelSpec, opts: ExportOptions, progress: Progress | None = None) -> ExportResult:
    """Convert ``model`` and write NAME.tflite with its sidecars."""
    progress = progress or Progress(enabled=False)
    job = prepare(model, spec, opts, progress)
    content, convert_seconds = convert_model(model, spec, opts, job, progress)
    checked = audit(content, opts.precision, job.io_dtype, spec.mixed_float_layers)
    packaged = package(content, model, spec, opts, job, checked)
    with tempfile.TemporaryDirectory(prefix=".edgevit-", dir=job.files.model.parent) as staging:
        staged = Path(staging) / job.files.model.name
        staged.write_bytes(packaged.content)
        agreement_stats, validate_seconds = validate(model, staged, job.validation, opts.validation_threads, progress)
        summary = checked.summary
        result = ExportResult(
            model=spec.name, precision=opts.precision, input_size=job.input_size, weights=opts.weights_label,
            files=job.files, size_bytes=len(packaged.content),
            io={"input": _public(summary.input), "output": _public(summary.output)},
            op_histogram=summary.op_histogram, macs=summary.macs, max_rank=summary.max_rank,
            checks=checked.checks, delegates=checked.delegates, images=job.images, agreement=agreement_stats,
            convert_seconds=convert_seconds, validate_seconds=validate_seconds)
        if opts.gpu_images:
            result.gpu_run = gpu_run(staged, job.validation[:opts.gpu_images], opts.precision, progress)
            run = result.gpu_run
            if run.ran and opts.precision in GPU_PRECISIONS:
                result.checks.append(Check(
                    "GPU accelerator: every op on the GPU, same answer as XNNPACK",
                    run.fully_accelerated and run.agrees,
                    f"{'every op' if run.fully_accelerated else 'not every op'} on the GPU, mean cosine "
                    f"{run.agreement['cosine_mean']:.5f} (floor {run.floor:.4g})"))
        threshold = opts.diagnose_below_cosine
        if (threshold is not None and needs_calibration(opts.precision)
                and result.agreement["cosine_mean"] < threshold):
            result.diagnosed = True
            result.first_breaking_layer = diagnose(model, packaged.content, job.validation, threshold,
                                                   opts.precision, progress)
        write(Path(staging), packaged, result)
    return result


def _public(tensor: dict) -> dict:
    return {k: tensor[k] for k in ("shape", "dtype", "quantization")}
