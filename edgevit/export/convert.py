"""Keras model -> .tflite bytes in one of the supported precisions.

Every setting that decides what the converter produces lives here:
- the model is traced as a batch-1 ``tf.function`` with a static input shape,
  so no SHAPE/GATHER/PACK ops from a dynamic batch enter the graph;
- ``experimental_lower_to_saved_model`` is off, so the converter reads
  variables from the traced function and keeps fake-quant ranges of QAT models
  (with it on, ``tf.FakeQuantWithMinMaxVars`` fails to convert);
- QAT models (calibration None) convert without ``supported_ops`` restricted
  to int8 builtins, which would make the converter ask for a representative
  dataset before it finds the fake-quant ranges;
- full-integer modes allow integer builtins only, so the converter fails
  rather than silently falling back to float kernels where it can (what it
  still leaves in float is caught by the dtype audit in ``graph``);
- calibrated int8 files get the grid XNNPACK needs to take every int8
  BATCH_MATMUL, and (int8-mixed too) sums written as a mean times a count a
  grid of their own (``edgevit.litert.requantize``);
- int8_mixed also keeps in float the layers a model registers as
  ``mixed_float_layers``, where int8 loses its accuracy (T2T-ViT's
  Performers and its LayerNorm over raw pixel patches);
- int8 files compute each LayerNorm's RSQRT(variance + epsilon) with two 1x1
  convolutions (``edgevit.litert.piecewise``): NNAPI takes a quantized RSQRT
  only from Android 14, XNNPACK not at all;
- elementwise operands the converter left at a lower rank than their output
  get the output's rank back (``edgevit.litert.rewrite``): GPUs compute them
  wrongly otherwise;
- a file that outputs probabilities ends in the model's softmax (int8: on
  the fixed 1/256 grid), as image classifiers' clients expect; a detector's
  file outputs its boxes and the softmax scores of its classes but the
  background (``edgevit.export.detection``);
- a uint8 input takes the camera's RGB bytes and normalises them inside the
  file (``edgevit.litert.camera_input``), as the clients feed it; a float
  input of a model normalised per channel (ImageNet's mean and std) takes the
  pixels in [0, 1] and normalises them inside the file too: MediaPipe Tasks
  refuses per-channel NormalizationOptions ("Per-channel image normalization
  is not available"), one mean and std it applies.
"""
from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from edgevit.data.images import READ_BATCH, batches
from edgevit.errors import EdgevitError, first_line
from edgevit.litert.camera_input import take_rgb_bytes
from edgevit.litert.flatbuffer import Graph, Op, read
from edgevit.litert.metadata import OUTPUT_KINDS, PRECISIONS, TAKES_NORMALISED, TAKES_RGB_BYTES, TAKES_RGB_UNIT
from edgevit.litert.padding import fold_stem_padding
from edgevit.litert.piecewise import rsqrt_as_convolutions
from edgevit.litert.requantize import calibrated_int8_grids, sum_mean_grids
from edgevit.litert.rewrite import restore_operand_ranks
from edgevit.native_output import native_output_captured

INTEGER_PRECISIONS = ("int8", "int16x8")
# Float activations: a QAT model converts to them without its fake quantization.
FLOAT_PRECISIONS = ("fp32", "fp16", "dynamic")
# Ops that XNNPACK runs slower in int8 than in float on CPUs (single-op files
# on LiteRT 2.3 XNNPACK, 1 thread, x86-64: BATCH_MATMUL 8x, SOFTMAX 1.6x
# slower) or not at all (RSQRT: each int8 one splits the graph into another
# XNNPACK partition); int8_mixed keeps these in float and the rest in int8.
CPU_FLOAT_OPS = ("BATCH_MATMUL", "SOFTMAX", "RSQRT")
SHORT_KERNEL = 32


def input_takes(precision: str, io_dtype: str, normalization) -> str:
    """``rgb_bytes`` (a uint8 input), ``rgb_unit`` (a float input of a model
    normalised per channel, a float precision's or int16x8's: the file
    normalises), or ``normalised``; ``normalization``: the model's (mean,
    std), None for the graph's own input."""
    if normalization is None:
        return TAKES_NORMALISED
    if io_dtype == "uint8":
        return TAKES_RGB_BYTES
    mean, std = normalization
    per_channel = len(set(mean)) > 1 or len(set(std)) > 1
    return TAKES_RGB_UNIT if per_channel and io_dtype == "float32" and precision != "int8" else TAKES_NORMALISED


def needs_calibration(precision: str) -> bool:
    return precision in INTEGER_PRECISIONS or precision == "int8_mixed"


def default_io_dtype(precision: str) -> str:
    """What `edgevit convert` gives a file's input and output: uint8 for int8
    (the camera's bytes in, the clients' types), float32 otherwise."""
    return "uint8" if precision == "int8" else "float32"


def check_io_dtype(precision: str, io_dtype: str) -> None:
    if io_dtype == "float32" or (precision == "int8" and io_dtype in ("int8", "uint8")):
        return
    if precision == "int8_mixed":
        raise EdgevitError("int8_mixed models take float32 input and output: use --io float32.")
    if precision == "int16x8":
        raise EdgevitError("int16x8 models take float32 input and output: use --io float32.")
    raise EdgevitError(f"--io {io_dtype} needs a fully-integer model: add --int8, "
                       f"or use --io float32 with --{precision}.")


def file_outputs(model, outputs, probabilities: bool, quantized_softmax: bool):
    """What a file computes from ``model``'s outputs: a classifier's logits,
    or with ``probabilities`` their softmax; a detector's boxes, then each
    class's score without the background (edgevit.export.detection says why),
    a dict as the converter orders a function's outputs by name. With
    ``quantized_softmax`` the softmax lands on the int8 softmax grid, as a QAT
    model's int8 file writes it. Traced by the export (a fake-quant the
    converter reads), and called eagerly on a QAT model's outputs to say what
    its int8 file must compute on the target kernels (their SOFTMAX rounds
    its own way: edgevit.quantize.kernel_arithmetic)."""
    import keras

    from edgevit.models.ssdlite import is_detector
    from edgevit.quantize.int8_ranges import FIXED_OUTPUT_RANGES
    from edgevit.quantize.qat import output_params
    from edgevit.quantize.quantizers import ActivationQuantizer

    def softmax(logits, index):
        scores = keras.ops.softmax(logits, axis=-1)
        if not quantized_softmax:
            return scores
        # as the int8 SOFTMAX of the target kernels writes it (edgevit.quantize.kernel_arithmetic)
        return ActivationQuantizer(fixed_range=FIXED_OUTPUT_RANGES["softmax"], name="softmax.quant")(
            scores, logits=logits, logit_params=output_params(model, index))

    if is_detector(model):
        boxes, logits = outputs
        return {"boxes": boxes, "scores": softmax(logits, 1)[..., 1:]}
    return softmax(outputs, 0) if probabilities else outputs


def batch1_function(model, float_ops: tuple[str, ...] = (), fake_quant: bool = True, probabilities: bool = False,
                    normalization=None):
    """The model as a batch-1 concrete function; a QAT model's quantizers
    leave the outputs of ``float_ops`` (op kinds) unquantized, and without
    ``fake_quant`` it computes in float. With ``probabilities`` it ends in a
    softmax over the logits (a QAT model's on the int8 softmax grid, unless
    SOFTMAX is one of ``float_ops``), as a detector's scores always do; with
    ``normalization`` (mean, std) it takes pixels in [0, 1] and normalises
    them first."""
    import tensorflow as tf

    from edgevit.quantize.qat import is_qat_model

    quantized_softmax = is_qat_model(model) and fake_quant and "SOFTMAX" not in float_ops

    shape = [1, *model.inputs[0].shape[1:]]
    if any(d is None for d in shape):
        raise EdgevitError(f"Model {model.name} has a dynamic input shape {shape}; "
                           "edgevit exports static shapes only.")

    @tf.function(autograph=False)
    def forward(images):
        if normalization is not None:
            mean, std = (tf.constant(v, tf.float32) for v in normalization)
            images = (images - mean) / std
        return file_outputs(model, model(images, training=False), probabilities, quantized_softmax)

    from edgevit.quantize.export_trace import exporting

    with exporting(float_ops, fake_quant):  # a QAT model traces to the fake-quant ops the converter reads
        return forward.get_concrete_function(tf.TensorSpec(shape, tf.float32, name="images"))


def convert(model, precision: str, calibration: np.ndarray | None = None,
            io_dtype: str | None = None,
            on_calibration_step: Callable[[], None] | None = None,
            float_layers: tuple[str, ...] = (), outputs: str = "logits",
            normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None) -> bytes:
    """Convert ``model``. Full-integer precisions need ``calibration``:
    preprocessed [H, W, 3] inputs (an [N, H, W, 3] array or an
    :class:`~edgevit.data.images.ImageSet`, read a batch at a time), unless the model carries
    trained fake-quant ranges (QAT), which quantize it instead (a float
    precision converts a QAT model without its fake quantization).
    ``float_layers``: names of layers whose ops int8_mixed keeps in float
    (a registered model's ``mixed_float_layers``). ``outputs``: one of
    OUTPUT_KINDS. ``normalization``: the model's (mean, std) of [0, 1] pixels;
    given, the file takes what apps feed (:func:`input_takes`) and applies
    it; a uint8 input needs it."""
    import tensorflow as tf

    if precision not in PRECISIONS:
        raise EdgevitError(f"Unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}.")
    # the library's default is the graph's own input: int8 for int8
    io_dtype = io_dtype or ("int8" if precision == "int8" else "float32")
    check_io_dtype(precision, io_dtype)
    if outputs not in OUTPUT_KINDS:
        raise EdgevitError(f"Unknown outputs {outputs!r}; choose one of {', '.join(OUTPUT_KINDS)}.")
    if io_dtype == "uint8" and normalization is None:
        raise EdgevitError("A uint8 input takes the image's bytes: give the model's normalization (mean, std).")

    from edgevit.quantize.qat import is_qat_model

    qat = is_qat_model(model)
    if qat:
        check_qat_precision(model.name, precision)
        calibration = None  # the trained ranges quantize it
    float_ops = CPU_FLOAT_OPS if precision == "int8_mixed" else ()
    unit_input = input_takes(precision, io_dtype, normalization) == TAKES_RGB_UNIT
    if unit_input and calibration is not None:
        calibration = _as_unit_pixels(calibration, normalization)
    function = batch1_function(model, float_ops, fake_quant=not (qat and precision in FLOAT_PRECISIONS),
                               probabilities=outputs == "probabilities",
                               normalization=normalization if unit_input else None)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function], model)
    converter.experimental_lower_to_saved_model = False
    if precision == "fp16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif precision == "dynamic":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif precision == "int8_mixed" and qat:
        # the trained ranges quantize every op but the CPU_FLOAT_OPS, whose outputs have none
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif precision == "int8_mixed":
        return restore_operand_ranks(fold_stem_padding(sum_mean_grids(
            _convert_mixed(converter, calibration, on_calibration_step, model.name, float_layers))))
    elif precision in INTEGER_PRECISIONS:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if calibration is not None:
            converter.representative_dataset = _representative(calibration, on_calibration_step)
            ops = (tf.lite.OpsSet.TFLITE_BUILTINS_INT8 if precision == "int8" else
                   tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8)
            converter.target_spec.supported_ops = [ops]
        else:
            if not qat:
                raise EdgevitError(f"{precision} conversion of {model.name} needs calibration images "
                                   "(it has no trained quantization ranges).")
            # QAT: the ranges come from the fake-quant ops. Restricting
            # supported_ops to TFLITE_BUILTINS_INT8 would make the converter
            # demand a representative dataset before it looks for them; the
            # dtype audit in ``graph`` still rejects any float op left over.
        types = {"float32": tf.float32, "int8": tf.int8, "uint8": tf.uint8}
        # a uint8 input is the int8 one with the bytes' requantization in front (take_rgb_bytes)
        converter.inference_input_type = types["int8" if io_dtype == "uint8" else io_dtype]
        converter.inference_output_type = types[io_dtype]
    try:
        with native_output_captured() as log:
            content = bytes(converter.convert())
    except Exception as err:  # the converter raises many types, all with long texts
        first = first_line(err)
        detail = _last_error_line(log.read_text()) if log.exists() else ""
        raise EdgevitError(f"TFLite conversion ({precision}) of {model.name} failed: {first}"
                           + (f" [{detail}]" if detail and detail not in first else "")) from err
    if precision == "int8" and not qat:
        # calibrated grids; a QAT model trains on the grids its file keeps
        content = calibrated_int8_grids(content)
    if precision == "int8":
        content = rsqrt_as_convolutions(content)
    content = restore_operand_ranks(fold_stem_padding(content))
    return take_rgb_bytes(content, *normalization) if io_dtype == "uint8" else content


def check_qat_precision(name: str, precision: str) -> None:
    """A QAT model converts to int8 or int8_mixed with its trained ranges, or
    to a float precision without them; its int8 ranges do not make int16x8."""
    if precision == "int16x8":
        raise EdgevitError(f"{name} is a quantization-aware (QAT) model: its trained ranges are int8 ranges. "
                           "Convert it with --int8 or --int8-mixed, or convert the float model it was trained "
                           "from with --int16x8.")


def epsilon_adds(graph: Graph) -> list[Op]:
    """The ADDs of a constant that feed an RSQRT: a LayerNorm's variance +
    epsilon. In int8 the epsilon's scale is ~1e-7 of the variance's, and
    XNNPACK refuses such an ADD; it stays in float with the RSQRT."""
    adds = []
    for op in graph.ops:
        if op.name != "RSQRT" or op.inputs[0].index not in graph.producers:
            continue
        producer = graph.ops[graph.producers[op.inputs[0].index]]
        if producer.name == "ADD" and producer.const_inputs:
            adds.append(producer)
    return adds


def score_arithmetic(graph: Graph) -> list[Op]:
    """The ops between an attention's scores BATCH_MATMUL and its SOFTMAX
    (Swin's position bias and shift mask, reshapes around them): in
    int8_mixed they stay in float with the two ops they connect; an int8
    ADD there would quantize scores whose masked pairs reach -100."""
    between = []
    for op in graph.ops:
        if op.name != "SOFTMAX":
            continue
        path, index = [], op.inputs[0].index
        while index in graph.producers:
            producer = graph.ops[graph.producers[index]]
            if producer.name == "BATCH_MATMUL":
                between += path
                break
            if producer.name not in ("ADD", "MUL", "RESHAPE") or len(producer.runtime_inputs) != 1:
                break
            path.append(producer)
            index = producer.runtime_inputs[0].index
    return between


def short_kernel_stem(graph: Graph) -> list[Op]:
    """The ops before the second convolution when the first one is a
    CONV_2D whose kernel reads fewer than SHORT_KERNEL values per output (a
    3x3 stem on the RGB image reads 27); int8_mixed keeps them in float.
    int8 GEMM kernels gain nothing on so short a dot product, and the int8
    stem quantizes the image besides: MobileViT-v3-XS's stem took 0.69 ms in
    int8 and 0.37 ms in float, and its int8-mixed file went from 0.469x to
    0.454x of fp32 with the stem in float (LiteRT 2.3 XNNPACK, 1 thread,
    AVX-512 VNNI; also in float, the next MobileNetV2 block made it slower)."""
    stem = []
    for op in graph.ops:
        if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            if any(earlier.name == "CONV_2D" for earlier in stem):
                return stem
            if op.name != "CONV_2D" or int(np.prod(op.inputs[1].shape[1:])) >= SHORT_KERNEL:
                return []
        stem.append(op)
    return []


def ops_of_layers(graph: Graph, layer_names: tuple[str, ...]) -> list[Op]:
    """The ops a converted graph computes for the Keras layers named
    ``layer_names``: their output tensors are named ``model/layer[_N]/op``
    (``_N`` numbers the call in TensorFlow's name scopes)."""
    if not layer_names:
        return []
    pattern = re.compile(r"[^/;]*/(" + "|".join(re.escape(n) for n in layer_names) + r")(_\d+)?/")
    return [op for op in graph.ops if pattern.match(op.outputs[0].name)]


def _convert_mixed(converter, calibration, on_step, model_name: str, float_layers: tuple[str, ...] = ()) -> bytes:
    """int8 everywhere except CPU_FLOAT_OPS, the epsilon ADDs before them,
    the score arithmetic between them, a short-kernel stem and the ops of
    ``float_layers``, via the converter's
    selective quantization: the calibrated float model is quantized with a
    deny list of op kinds and of op outputs by name (what
    tf.lite.experimental.QuantizationDebugger does, without its debug model)."""
    import tensorflow as tf
    from tensorflow.lite.python import convert as tflite_convert

    if calibration is None:
        raise EdgevitError("int8_mixed needs calibration images.")
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = _representative(calibration, on_step)
    converter.experimental_mlir_quantizer = True
    converter._experimental_calibrate_only = True
    try:
        with native_output_captured():
            calibrated = converter.convert()
            graph = read(calibrated)
            float_outputs = [op.outputs[0].name for op in epsilon_adds(graph) + short_kernel_stem(graph)
                             + score_arithmetic(graph) + ops_of_layers(graph, float_layers)]
            return bytes(tflite_convert.mlir_quantize(calibrated, denylisted_ops=list(CPU_FLOAT_OPS),
                                                      denylisted_nodes=float_outputs))
    except Exception as err:
        raise EdgevitError(f"TFLite conversion (int8_mixed) of {model_name} failed: {first_line(err)}") from err


def _last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if "error" in line.lower()]
    return lines[-1] if lines else ""


def _as_unit_pixels(calibration, normalization):
    """The [0, 1] pixels normalised inputs came from, a batch at a time."""
    mean, std = (np.asarray(v, np.float32) for v in normalization)
    if isinstance(calibration, np.ndarray):
        return calibration * std + mean
    return calibration.map(lambda batch: batch * std + mean)


def _representative(calibration, on_step):
    def generator():
        for batch in batches(calibration, READ_BATCH):
            for sample in batch:
                yield [sample[None].astype(np.float32)]
                if on_step is not None:
                    on_step()

    return generator
