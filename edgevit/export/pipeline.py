"""The export pipeline behind `edgevit convert`, as named stages:

prepare -> convert -> audit -> package -> validate -> GPU run -> Arm64 run -> (diagnose) -> write

The output paths are checked before any work; outputs are written to a
staging folder beside them and moved into place only when every stage
succeeded, all four or none (files they replace are put back when a move
fails), so a failed or interrupted run never leaves a half-written set.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from edgevit.data import sample_photos
from edgevit.data.images import ImageSet, batches, image_set
from edgevit.data.labels import default_labels
from edgevit.data.listing import list_images
from edgevit.data.transforms import deployment_preprocessing
from edgevit.errors import EdgevitError
from edgevit.export.audit import Audit, audit
from edgevit.export.convert import (
    FLOAT_PRECISIONS,
    check_io_dtype,
    check_qat_precision,
    convert,
    default_io_dtype,
    input_takes,
    needs_calibration,
)
from edgevit.export import detection
from edgevit.export.diagnose import layerwise_comparison
from edgevit.export.result import Check, ExportFiles, ExportResult, ImageSources
from edgevit.export.verdict import GPU_PRECISIONS, verdict
from edgevit.litert.accelerator import DEFAULT_IMAGES as DEFAULT_GPU_IMAGES
from edgevit.litert.accelerator import GpuRun, missing_vulkan, run_file_on_gpu
from edgevit.litert.agreement import agreement, probability_agreement
from edgevit.litert.arm import PROFILES as ARM_PROFILES
from edgevit.litert.arm import ArmCheck, check_on_arm, emulator_missing
from edgevit.litert.inputs import file_input_values
from edgevit.litert.logits_view import logits_file
from edgevit.litert.metadata import DETECTION, SEGMENTATION, build_metadata, embed
from edgevit.litert.run_model import run_in_child, split_outputs
from edgevit.memory import memory_of, release_memory
from edgevit.native_output import native_output_captured
from edgevit.pretrained import RANDOM_INIT, random_init_hint
from edgevit.progress import Progress
from edgevit.registry import ModelSpec
from edgevit.saving import class_names_of
from edgevit.writing import Staging, check_writable, staged

DEFAULT_VALIDATION_SAMPLES = 32


@dataclass
class ExportOptions:
    precision: str = "int8"
    io_dtype: str | None = None
    # "probabilities" (a softmax in the file, what image classifiers output) or "logits"
    outputs: str = "probabilities"
    # the licence of the weights, where known (the standard metadata carries it)
    licence: str | None = None
    calib_dir: str | None = None
    calib_samples: int = 64
    validation_samples: int = DEFAULT_VALIDATION_SAMPLES
    output: str | None = None
    weights_label: str = RANDOM_INIT
    recalibrate_batchnorm: bool = False
    validation_threads: int = 2
    # When a quantized file agrees poorly with the Keras model, compare it
    # layer by layer with an fp32 conversion and name where it breaks first.
    diagnose_below_cosine: float | None = None
    # Held-out sample photos the file also runs on with LiteRT's GPU accelerator
    # against XNNPACK, where a Vulkan device exists (0: no GPU run): the
    # photos `edgevit check --gpu` judges it on, so that both say the same.
    gpu_images: int = DEFAULT_GPU_IMAGES
    # A model with ImageNet weights: the report lists the top-5 labels of the
    # Keras model and of the file side by side on the held-out photos.
    show_top5_photos: bool = False
    # Held-out sample photos the file also runs on with LiteRT's Arm64 XNNPACK
    # kernels (Cortex-A76 profile, emulated) against x86 XNNPACK, where the
    # emulator is installed (0: no Arm64 run): those of `edgevit check --arm`.
    # Emulated inferences take seconds each: library callers run none unless
    # they ask.
    arm_images: int = 0
    # A detector's file with the detection post-processing op (NMS) appended,
    # its four float32 outputs what the TFLite Task Library requires, instead
    # of the raw boxes and scores (edgevit.export.detection).
    add_postprocessing_op: bool = False


def default_output_path(model_name: str, precision: str) -> Path:
    return Path(f"{model_name}_{precision}.tflite")


@dataclass
class Prepared:
    """What the stages after `prepare` work from."""
    files: ExportFiles
    io_dtype: str
    input_size: int
    calibration: ImageSet | None        # None: no calibration (a float precision, or a QAT model)
    validation: ImageSet
    images: ImageSources
    ranges: str | None                  # see quantization_ranges


# Where a file's activation ranges come from (the report and the metadata say it).
CALIBRATED, TRAINED, REMOVED = "calibrated", "trained", "removed"


def quantization_ranges(precision: str, qat: bool) -> str | None:
    """``calibrated`` on images, ``trained`` by QAT, ``removed`` (a float file
    of a QAT model: its fake quantization left out), None (a float file)."""
    if precision in FLOAT_PRECISIONS:
        return REMOVED if qat else None
    return TRAINED if qat else CALIBRATED


@dataclass
class Package:
    """The file as it will be written, with its sidecars' content."""
    content: bytes
    metadata: dict
    labels: list[str]

    @cached_property
    def input_values(self) -> Callable[[np.ndarray], np.ndarray]:
        """Normalised images -> the values the file's input takes (the file
        read once for every stage that feeds it)."""
        return file_input_values(self.content, self.metadata)


def check_options(opts: ExportOptions) -> None:
    """What can be checked before the model is built or loaded: the input
    and output types, the calibration folder and an explicit output path."""
    check_io_dtype(opts.precision, opts.io_dtype or default_io_dtype(opts.precision))
    if opts.calib_dir is not None:
        with warnings.catch_warnings():  # the images are counted when they load
            warnings.simplefilter("ignore")
            list_images(opts.calib_dir)
    if opts.output is not None:
        check_output_paths(ExportFiles.beside(Path(opts.output)))


def prepare(model, spec: ModelSpec, opts: ExportOptions, progress: Progress) -> Prepared:
    """Check the options and the output path, load the image sets and, when
    asked, re-estimate BatchNorm statistics on the calibration images."""
    from edgevit.quantize.qat import is_qat_model

    check_options(opts)
    io_dtype = opts.io_dtype or default_io_dtype(opts.precision)
    input_size = int(model.inputs[0].shape[1])
    out_path = Path(opts.output) if opts.output else default_output_path(spec.name, opts.precision)
    files = ExportFiles.beside(out_path)
    check_output_paths(files)
    qat = is_qat_model(model)
    if qat:
        check_qat_precision(opts.weights_label, opts.precision)
    ranges = quantization_ranges(opts.precision, qat)
    if ranges == TRAINED and opts.calib_dir is not None:
        progress.step(f"{opts.weights_label} is a QAT model: its trained ranges quantize the file, and the images "
                      f"of {opts.calib_dir} only validate it")

    calib, val, images = _image_sets(spec, input_size, opts, need_calibration=ranges == CALIBRATED)
    if opts.recalibrate_batchnorm:
        from edgevit.models.batchnorm import recalibrate_batchnorm  # imports every model family: only when asked

        progress.step("No weights given: estimating BatchNorm statistics on the calibration images")
        statistics_of = calib if calib is not None else sample_photos.sample_images(spec.preprocessing_at(input_size),
                                                                                     opts.calib_samples, task=spec.task)
        with (memory_of("BatchNorm estimation", model),
              progress.bar("BatchNorm statistics", len(statistics_of), "images") as advance):
            recalibrate_batchnorm(model, statistics_of, on_batch=advance)
    return Prepared(files, io_dtype, input_size, calib, val, images, ranges)


def check_output_paths(files: ExportFiles) -> None:
    """Fail before any work when one of the four files could not be put in
    place (see :func:`edgevit.writing.check_writable`)."""
    if files.model.suffix != ".tflite":
        raise EdgevitError(f"Output path {str(files.model)!r} must end in .tflite.")
    check_writable(files.all())


def _image_sets(spec: ModelSpec, input_size: int, opts: ExportOptions,
                need_calibration: bool) -> tuple[ImageSet | None, ImageSet, ImageSources]:
    """(calibration images or None, validation images, description of both)."""
    pre = spec.preprocessing_at(input_size)
    if opts.calib_dir is None:
        calib = sample_photos.sample_images(pre, opts.calib_samples, task=spec.task) if need_calibration else None
        val = sample_photos.sample_images(pre, opts.validation_samples, held_out=True, task=spec.task)
        calib_note = f"; {sample_photos.FEW_PHOTOS_NOTE}" if opts.show_top5_photos else ""
        source = ImageSources(f"default: {sample_photos.SOURCE_NOTE}{calib_note}" if need_calibration else None,
                              f"default: held-out {sample_photos.SOURCE_NOTE}")
        return calib, val, source
    files = list_images(opts.calib_dir)
    order = np.random.default_rng(0).permutation(len(files))
    files = [files[i] for i in order]
    calib = image_set(files, pre, limit=opts.calib_samples, task=spec.task) if need_calibration else None
    used = calib.items if calib is not None else []
    rest = files[files.index(used[-1]) + 1:] if used else files  # unreadable files were passed over too
    held_out = "held-out " if need_calibration else ""
    if len(rest) >= 8:
        val = image_set(rest, pre, limit=opts.validation_samples, task=spec.task)
        val_source = f"{len(val)} {held_out}images of {opts.calib_dir}"
    else:
        val = sample_photos.sample_images(pre, opts.validation_samples, held_out=True, task=spec.task)
        val_source = (f"default: held-out {sample_photos.SOURCE_NOTE} ({opts.calib_dir} has too few images"
                      + (" beyond the calibration set)" if need_calibration else ": fewer than 8)"))
    source = ImageSources(f"{len(used)} images of {opts.calib_dir}" if need_calibration else None, val_source)
    return calib, val, source


def convert_model(model, spec: ModelSpec, opts: ExportOptions, job: Prepared,
                  progress: Progress) -> tuple[bytes, float]:
    """The .tflite bytes and the seconds the conversion took."""
    progress.step(f"Converting {spec.name} ({job.input_size}x{job.input_size}) to {opts.precision}")
    start = time.perf_counter()
    pre = spec.preprocessing_at(job.input_size)
    common = {"io_dtype": job.io_dtype, "outputs": opts.outputs, "normalization": (pre.mean, pre.std)}
    if job.calibration is not None:
        with progress.bar("calibrating", total=len(job.calibration)) as advance:
            content = convert(model, opts.precision, job.calibration, on_calibration_step=advance,
                              float_layers=spec.mixed_float_layers, **common)
    else:
        content = convert(model, opts.precision, **common)
    release_memory()
    return content, time.perf_counter() - start


def package(content: bytes, model, spec: ModelSpec, opts: ExportOptions, job: Prepared, checked: Audit) -> Package:
    """Embed edgevit's metadata document and the standard TFLite metadata
    built from it, with the labels inside the file; the labels also go
    beside it: the class names the model was trained with, or the defaults."""
    detector = spec.task == DETECTION
    if detector:
        labels = detection.object_labels(model)
        block = detection.detection_block(model, opts.add_postprocessing_op, checked.summary.outputs)
        output_kind = detection.output_kind(opts.add_postprocessing_op)
    else:
        labels = class_names_of(model) or default_labels(int(model.outputs[0].shape[-1]))
        block, output_kind = None, opts.outputs
    pre = spec.preprocessing_at(job.input_size)
    metadata = build_metadata(
        model_name=spec.name, family=spec.family, precision=opts.precision, weights=opts.weights_label,
        labels=labels, labels_file=job.files.labels.name, graph_input=checked.summary.input,
        graph_output=checked.summary.output, preprocessing=deployment_preprocessing(pre, spec.task).to_dict(),
        quantization_ranges=job.ranges, output_kind=output_kind,
        input_takes=input_takes(opts.precision, job.io_dtype, (pre.mean, pre.std)),
        licence=opts.licence, task=spec.task, detection=block)
    anchors = detection.anchors_of(model) if detector and not opts.add_postprocessing_op else None
    return Package(embed(content, metadata, labels, anchors), metadata, labels)


def validate(model, packaged: Package, staged_model: Path, images: ImageSet, threads: int, progress: Progress,
             fake_quant: bool = True) -> tuple[dict, dict | None, float]:
    """Agreement of the staged file, run by LiteRT in a child process, with the
    Keras model on held-out images (a QAT model without its fake quantization
    unless ``fake_quant``): on the logits (the softmax's input where the file
    outputs probabilities), and on the probabilities such a file outputs
    (None for a file of logits); and the seconds it took."""
    progress.step(f"Validating on {len(images)} held-out images with LiteRT (XNNPACK)")
    start = time.perf_counter()
    with progress.bar("Keras model", len(images), "images") as advance:
        expected = keras_outputs(model, images, fake_quant, on_batch=advance)
    inputs = images.map(packaged.input_values)
    if packaged.metadata.get("task") == DETECTION:
        with logits_file(staged_model) as raw:  # with the post-processing op: the boxes and scores it reads
            boxes, scores = split_outputs(raw.read_bytes(), run_in_child(raw, inputs, num_threads=threads))
        release_memory()
        return (detection.raw_agreement(*expected, boxes, scores, detection.anchors_of(model)), None,
                time.perf_counter() - start)
    with logits_file(staged_model) as logits_path:
        logits = agreement(expected, run_in_child(logits_path, inputs, num_threads=threads))
    probabilities = None
    if packaged.metadata["output"]["kind"] == "probabilities":
        probabilities = probability_agreement(softmax(expected), run_in_child(staged_model, inputs,
                                                                              num_threads=threads))
    release_memory()
    return logits, probabilities, time.perf_counter() - start


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits.astype(np.float64) - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


# Images per call of the Keras model when validating. Traced, a float model
# holds one batch of activations, memory TensorFlow then keeps for the whole
# process (as BatchNorm estimation, edgevit/models/batchnorm.py); a QAT model
# runs eagerly, where a call costs the dispatch of its ops whatever the batch.
TRACED_BATCH, EAGER_BATCH = 2, 8


def keras_outputs(model, images: np.ndarray | ImageSet, fake_quant: bool = True,
                  on_batch: Callable[[int], None] = lambda count: None) -> np.ndarray:
    """The Keras model's outputs, a batch at a time (``on_batch(images in
    it)`` after each); a QAT model's without its fake quantization (in
    float, as its float files compute) unless ``fake_quant``. A float model runs as one traced graph (``predict`` would
    first copy the whole image set into a dataset); a QAT model eagerly:
    tracing it took 142 s for 32 images of mobilevit_v3_xxs at 32 px, eager
    calls 24 s, with identical outputs. A detector's outputs are a pair
    (boxes, class logits)."""
    import tensorflow as tf

    from edgevit.quantize.export_trace import exporting
    from edgevit.quantize.qat import is_qat_model

    def forward(batch):
        return model(batch, training=False)

    def as_arrays(result):  # a detector's two outputs: a list
        return [np.asarray(t) for t in result] if isinstance(result, (list, tuple)) else np.asarray(result)

    qat = is_qat_model(model)
    if not qat:
        forward = tf.function(forward, reduce_retracing=True, autograph=False)
    batch_size = EAGER_BATCH if qat else TRACED_BATCH
    outputs = []
    with exporting(fake_quant=False) if qat and not fake_quant else contextlib.nullcontext():
        for batch in batches(images, batch_size):
            outputs.append(as_arrays(forward(tf.constant(batch))))
            on_batch(len(batch))
    if isinstance(outputs[0], list):
        return tuple(np.concatenate(parts) for parts in zip(*outputs))
    return np.concatenate(outputs)


def top5_on_photos(model, packaged: Package, staged_model: Path, pre, threads: int,
                   progress: Progress) -> list[dict]:
    """Per held-out photo (whole, with the model's preprocessing), the top-5
    labels and probabilities of the Keras model and of the staged file."""
    names, photos = sample_photos.held_out_photos(pre)
    progress.step(f"Classifying {len(names)} sample photos with the Keras model and the file")
    keras_probs = softmax(keras_outputs(model, photos))
    file_outputs = run_in_child(staged_model, packaged.input_values(photos), num_threads=threads)
    file_probs = file_outputs if packaged.metadata["output"]["kind"] == "probabilities" else softmax(file_outputs)
    return [{"photo": name, "keras": _top5(k, packaged.labels), "file": _top5(f, packaged.labels)}
            for name, k, f in zip(names, keras_probs, file_probs)]


def _top5(probs: np.ndarray, labels: list[str]) -> list[list]:
    return [[labels[i], round(float(probs[i]), 4)] for i in np.argsort(-probs, kind="stable")[:5]]


def gpu_run(staged_model: Path, count: int, progress: Progress) -> GpuRun:
    """The staged file on LiteRT's GPU accelerator against XNNPACK on
    ``count`` held-out sample photos, compared on its logits, as `edgevit
    check --gpu` runs it (a not-run record, saying why, when this machine has
    no Vulkan device)."""
    if missing_vulkan() is None:
        progress.step(f"Running on {count} held-out sample photos with LiteRT's GPU accelerator")
    with progress.bar("GPU accelerator and XNNPACK (one child process)", None):
        return run_file_on_gpu(staged_model, count)


# The convert report's Arm64 line: the big-core kernels phones run most, XNNPACK
# only (`edgevit check --arm` runs every profile and the builtin kernels too).
ARM_PROFILE = "a76"


def arm_run(staged_model: Path, count: int, progress: Progress) -> ArmCheck:
    """The staged file on LiteRT's Arm64 XNNPACK kernels (emulated) against
    x86 XNNPACK on ``count`` held-out sample photos, compared on its logits,
    as `edgevit check --arm` runs it (a not-run record, saying how to install
    the emulator, when it is not installed)."""
    if emulator_missing() is None:
        progress.step(f"Running on {count} held-out sample photo(s) with LiteRT's Arm64 kernels (emulated, "
                      f"{ARM_PROFILE})")
    with progress.bar("Arm64 run", None) as advance:
        return check_on_arm(staged_model, [ARM_PROFILES[ARM_PROFILE]], ("xnnpack",), images=count,
                            step=lambda message: advance(0, status=message))


# What to try when a quantized file departs from the Keras model.
BREAKING_LAYER_HINTS = {
    "int16x8": "int16x8 already keeps activations in 16 bits: the int8 weights are the loss; "
               "trained weights quantize better than random ones",
}
DEFAULT_BREAKING_LAYER_HINT = ("try --int16x8, or --int8-mixed on the CPU; "
                               "trained weights quantize better than random ones")


def diagnose(model, packaged: Package, images: ImageSet, threshold: float, precision: str,
             progress: Progress) -> dict | None:
    """The first layer where the packaged file departs from an fp32
    conversion of ``model`` (None when no layer falls below ``threshold``)."""
    progress.step(f"Agreement below cosine {threshold}: comparing every layer with an fp32 conversion")
    with progress.bar("fp32 conversion", None):
        fp32 = convert(model, "fp32")
    release_memory()
    images = images[:2]
    with native_output_captured(), progress.bar("comparing layers", len(images), "images") as advance:
        found = layerwise_comparison(fp32, packaged.content, images, threshold=threshold,  # LiteRT's INFO lines
                                     quant_inputs=packaged.input_values(images),
                                     on_image=advance)["first_below"]
    if found is None:
        return None
    return {**found, "threshold": threshold,
            "hint": BREAKING_LAYER_HINTS.get(precision, DEFAULT_BREAKING_LAYER_HINT)}


def write(staging: Staging, packaged: Package, result: ExportResult) -> None:
    """Write the sidecars next to the staged model; they are moved into place
    together when the export's staging block ends."""
    files = result.files
    staging.write_text(files.metadata, json.dumps(packaged.metadata, indent=2))
    staging.write_text(files.labels, "\n".join(packaged.labels) + "\n")
    staging.write_text(files.report, json.dumps(result.to_dict(), indent=2))


def export(model, spec: ModelSpec, opts: ExportOptions, progress: Progress | None = None) -> ExportResult:
    """Convert ``model`` and write NAME.tflite with its sidecars."""
    progress = progress or Progress(enabled=False)
    if spec.task == SEGMENTATION:
        # a segmenter's file outputs its map of logits: MediaPipe resizes them
        # to the image before it applies the softmax its metadata names, and
        # ImageNet's top-5 photos say nothing of it
        opts = dataclasses.replace(opts, outputs="logits", show_top5_photos=False)
    if opts.add_postprocessing_op and spec.task != DETECTION:
        raise EdgevitError(f"--add-postprocessing-op: {spec.name} is a {spec.task} model; the detection "
                           "post-processing op ends a detector's file.")
    if spec.task == DETECTION:
        # the file scores each class with a softmax (edgevit.export.detection)
        opts = dataclasses.replace(opts, outputs="probabilities", show_top5_photos=False)
    job = prepare(model, spec, opts, progress)
    with memory_of("conversion", model):
        content, convert_seconds = convert_model(model, spec, opts, job, progress)
    if spec.task == DETECTION:
        content = detection.with_form(content, model, opts.add_postprocessing_op)
    checked = audit(content, opts.precision, job.io_dtype, spec.mixed_float_layers)
    packaged = package(content, model, spec, opts, job, checked)
    with staged(job.files.all()) as staging:
        staging.write_bytes(job.files.model, packaged.content)
        staged_model = staging.path_of(job.files.model)
        # the runs in child processes first, while this process holds less: the Keras model's forward passes of
        # validation keep memory here that the children would add to (ssdlite_mobilevit_v1_xs at 320 px, the
        # GPU run's peak: 1.82 GB after validation, 1.73 GB before it; docs/benchmarks.md)
        gpu = gpu_run(staged_model, opts.gpu_images, progress) if opts.gpu_images else None
        arm = arm_run(staged_model, opts.arm_images, progress) if opts.arm_images else None
        with memory_of("validation", model):
            agreement_stats, probabilities, validate_seconds = validate(
                model, packaged, staged_model, job.validation, opts.validation_threads, progress,
                fake_quant=job.ranges != REMOVED)
        summary = checked.summary
        result = ExportResult(
            model=spec.name, precision=opts.precision, input_size=job.input_size, weights=opts.weights_label,
            files=job.files, size_bytes=len(packaged.content),
            io={"input": _public(summary.input), "output": _public(summary.output),
                **({"outputs": summary.outputs} if len(summary.outputs) > 1 else {})},
            op_histogram=summary.op_histogram, macs=summary.macs, max_rank=summary.max_rank,
            checks=checked.checks, delegates=checked.delegates, images=job.images, agreement=agreement_stats,
            convert_seconds=convert_seconds, validate_seconds=validate_seconds, quantization_ranges=job.ranges,
            probability_agreement=probabilities)
        if opts.weights_label == RANDOM_INIT:
            result.weights_hint = random_init_hint(spec, opts.precision)
        if opts.show_top5_photos:
            with memory_of("top-5 on the sample photos", model):
                result.top5_photos = top5_on_photos(model, packaged, staged_model,
                                                    spec.preprocessing_at(job.input_size), opts.validation_threads,
                                                    progress)
        if gpu is not None:
            result.gpu_run = run = gpu
            if run.ran and opts.precision in GPU_PRECISIONS:
                result.checks.append(Check(
                    "GPU accelerator: every op on the GPU, same answer as XNNPACK",
                    run.fully_accelerated and run.agrees,
                    f"{'every op' if run.fully_accelerated else 'not every op'} on the GPU, mean cosine "
                    f"{run.agreement['cosine_mean']:.5f} (floor {run.floor:.4g})", place="GPU"))
        if arm is not None:
            result.arm_run = run = arm
            if run.ran:
                result.checks.append(Check(
                    "Arm64 kernels (emulated): same answer as x86 XNNPACK", bool(run.agrees),
                    f"mean cosine {min(r.agreement['cosine_mean'] for r in run.rows):.5f} (floor "
                    f"{run.rows[0].floor:.4g}), {ARM_PROFILE} XNNPACK kernels", place="Arm64"))
        threshold = opts.diagnose_below_cosine
        if (threshold is not None and needs_calibration(opts.precision)
                and result.agreement["cosine_mean"] < threshold):
            result.diagnosed = True
            with memory_of("layer-by-layer diagnosis", model):
                result.first_breaking_layer = diagnose(model, packaged, job.validation, threshold, opts.precision,
                                                       progress)
        result.verdict = verdict(result)
        write(staging, packaged, result)
    return result


def _public(tensor: dict) -> dict:
    return {k: tensor[k] for k in ("shape", "dtype", "quantization")}
