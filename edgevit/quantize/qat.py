"""Quantization-aware training models, built by rewriting a functional graph.

:func:`quantize_model` walks an edgevit (or any functional Keras) model and
rebuilds it with fake quantization wherever the int8 TFLite graph has a
quantized tensor:

- model input: the preprocessing's value range (fixed);
- Conv2D / DepthwiseConv2D (+ the BatchNormalization that follows, folded in)
  and Dense: per-channel int8 kernels, tracked output range;
- activations (SiLU as LOGISTIC + MUL, fixed 1/256 sigmoid/softmax ranges),
  residual adds, concatenations, pooling: tracked output ranges;
- edgevit's LayerNorm and attention layers: their quantization-aware
  subclasses, with a range at every internal op;
- reshapes, splits, padding, dropout, unfold/fold and resizes keep the
  scale of their input (TFLite requires it), so nothing is inserted.

Layers it does not know are taken as one op with a tracked output range.
The QAT model keeps the original model's name, so it is still recognised as
its registered variant, and saves/loads as ``.keras``.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from edgevit.errors import EdgevitError, first_line

# Layers whose output takes the scale of their input in TFLite (no new range).
SCALE_PRESERVING = {"InputLayer", "ZeroPadding2D", "Cropping2D", "Dropout", "SpatialDropout2D", "DropPath",
                    "Reshape", "Flatten", "Permute", "Identity", "Unfold", "Fold", "ResizeBilinear",
                    "MaxPooling2D", "UpSampling2D", "TokenSlice", "ActivityRegularization"}
CONV_TYPES = ("Conv2D", "DepthwiseConv2D")


def is_qat_model(model) -> bool:
    from edgevit.quantize.layers import ActivationQuantizer

    return any(isinstance(layer, ActivationQuantizer) for layer in _all_layers(model))


def quantize_model(model, calibration: np.ndarray | None = None, *, momentum: float = 0.99,
                   input_range: tuple[float, float] | None = None, batch_size: int = 16):
    """A quantization-aware copy of functional ``model`` (weights copied,
    BatchNorm folded). With ``calibration`` images, activation ranges are
    initialised from them (see :func:`calibrate`)."""
    import keras

    from edgevit.quantize import layers as q

    if is_qat_model(model):
        raise EdgevitError(f"{model.name} is already a quantization-aware model.")
    if not isinstance(model, keras.Model) or not hasattr(model, "_run_through_graph") \
            or type(model).__name__ not in ("Functional", "Model"):
        raise EdgevitError(f"QAT needs a functional Keras model; {model.name} is a {type(model).__name__}.")
    if input_range is None:
        input_range = _preprocessing_range(model)
    folded_bn = _conv_batchnorm_pairs(model)
    conv_of_bn = {id(bn): conv for conv, bn in folded_bn}
    bn_of_conv = {id(conv): bn for conv, bn in folded_bn}
    input_quantizers: dict[int, object] = {}

    def quantize_inputs(args):
        def visit(t):
            if isinstance(t, keras.KerasTensor) and id(t) in new_inputs:
                if id(t) not in input_quantizers:
                    input_quantizers[id(t)] = q.ActivationQuantizer(
                        fixed_range=input_range, name=f"{t.name or 'input'}.quant")(t)
                return input_quantizers[id(t)]
            return t

        return keras.tree.map_structure(visit, args)

    def call(layer, *args, **kwargs):
        args = quantize_inputs(args)
        kwargs = quantize_inputs(kwargs)
        kind = type(layer).__name__
        aq = lambda name: q.ActivationQuantizer(momentum, name=name)  # noqa: E731

        if isinstance(layer, tuple(q.QUANTIZED_CUSTOM)):
            return _quantized_custom(layer, momentum)(*args, **kwargs)
        if kind in CONV_TYPES:
            out = _quantized_conv(layer, bn_of_conv.get(id(layer)))(*args, **kwargs)
            if id(layer) in bn_of_conv:  # the folded BatchNorm puts the range
                return out
            out = aq(f"{layer.name}.quant")(out)
            return _activation(layer, out, momentum)
        if kind == "BatchNormalization" and id(layer) in conv_of_bn:
            return aq(f"{layer.name}.quant")(args[0])
        if kind == "Dense":
            out = aq(f"{layer.name}.quant")(_quantized_dense(layer)(*args, **kwargs))
            return _activation(layer, out, momentum)
        if kind == "Activation":
            name = _activation_name(layer.get_config()["activation"])
            if name == "linear":
                return args[0]
            return q.QuantActivation(name, momentum, name=layer.name)(*args, **kwargs)
        if kind == "Softmax":
            return q.ActivationQuantizer(fixed_range=q.UNIT_RANGE, name=f"{layer.name}.quant")(
                _clone(layer)(*args, **kwargs))
        out = _clone(layer)(*args, **kwargs)
        if kind in SCALE_PRESERVING:
            return out
        return aq(f"{layer.name}.quant")(out)

    new_inputs: dict[int, object] = {}
    input_tensors = [keras.Input(batch_shape=t.shape, dtype=t.dtype, name=t.name) for t in model.inputs]
    for t in input_tensors:
        new_inputs[id(t)] = t
    try:
        qat = keras.models.clone_model(model, input_tensors=input_tensors if len(input_tensors) > 1
                                       else input_tensors[0], clone_function=lambda layer: layer,
                                       call_function=call)
    except EdgevitError:
        raise
    except Exception as err:
        raise EdgevitError(f"Could not build the QAT model of {model.name}: {first_line(err)}") from err
    if calibration is not None:
        calibrate(qat, calibration, batch_size=batch_size)
    return qat


def calibrate(qat_model, images: np.ndarray | Iterable, batch_size: int = 16, max_batches: int | None = None) -> int:
    """Initialise activation ranges: run ``images`` (an array or an iterable
    of batches) through the model with every quantizer observing (inputs pass
    unquantized), in inference mode. Returns the number of batches."""
    from edgevit.quantize.layers import ActivationQuantizer

    quantizers = [layer for layer in _all_layers(qat_model) if isinstance(layer, ActivationQuantizer)]
    if isinstance(images, np.ndarray):
        batches = [images[i:i + batch_size] for i in range(0, len(images), batch_size)]
    else:
        batches = images
    count = 0
    try:
        for quantizer in quantizers:
            quantizer.observing = True
        for batch in batches:
            if isinstance(batch, (tuple, list)):
                batch = batch[0]
            qat_model(batch, training=False)
            count += 1
            if max_batches is not None and count >= max_batches:
                break
    finally:
        for quantizer in quantizers:
            quantizer.observing = False
    if not count:
        raise EdgevitError("No images to calibrate the QAT ranges with.")
    return count


def quantization_ranges(qat_model) -> dict[str, tuple[float, float]]:
    """{quantizer path: (min, max)} of every activation quantizer."""
    from edgevit.quantize.layers import ActivationQuantizer

    ranges = {}
    for layer in _all_layers(qat_model):
        if isinstance(layer, ActivationQuantizer):
            if layer.fixed_range is not None:
                ranges[layer.path] = layer.fixed_range
            else:
                lo, hi = layer.quantization_range()
                ranges[layer.path] = (float(lo), float(hi))
    return ranges


# --- graph helpers -----------------------------------------------------------------------------

def _all_layers(model):
    seen = set()

    def walk(layer):
        if id(layer) in seen:
            return
        seen.add(id(layer))
        yield layer
        for sub in getattr(layer, "_layers", []) or []:
            yield from walk(sub)

    for layer in model.layers:
        yield from walk(layer)


def _producer(tensor):
    history = getattr(tensor, "_keras_history", None)
    return history.operation if history is not None else None


def _conv_batchnorm_pairs(model) -> list:
    """(conv, batchnorm) where the BatchNorm is the only consumer of the conv."""
    pairs = []
    for layer in model.layers:
        if type(layer).__name__ != "BatchNormalization" or len(layer._inbound_nodes) != 1:
            continue
        node = layer._inbound_nodes[0]
        inputs = node.input_tensors
        if len(inputs) != 1:
            continue
        conv = _producer(inputs[0])
        if conv is None or type(conv).__name__ not in CONV_TYPES or len(conv._inbound_nodes) != 1:
            continue
        if len(conv._outbound_nodes) != 1 or conv.get_config().get("activation") not in (None, "linear"):
            continue
        axis = layer.axis if isinstance(layer.axis, int) else layer.axis[0]
        if axis not in (-1, 3):
            continue
        pairs.append((conv, layer))
    return pairs


def _activation_name(activation) -> str:
    if isinstance(activation, str):
        return activation
    if isinstance(activation, dict):
        return activation.get("config", activation.get("class_name", "linear"))
    return getattr(activation, "__name__", str(activation))


def _activation(layer, out, momentum):
    from edgevit.quantize.layers import QuantActivation

    name = _activation_name(layer.get_config().get("activation", "linear"))
    if name in (None, "linear"):
        return out
    return QuantActivation(name, momentum, name=f"{layer.name}.act")(out)


def _clone(layer):
    return type(layer).from_config(layer.get_config())


def _quantized_conv(conv, bn):
    from edgevit.quantize.layers import QuantConv2D, QuantDepthwiseConv2D

    config = conv.get_config()
    config["activation"] = None
    depthwise = type(conv).__name__ == "DepthwiseConv2D"
    kernel = np.asarray(conv.get_weights()[0], np.float64)
    bias = np.asarray(conv.get_weights()[1], np.float64) if conv.use_bias else None
    if bn is not None:
        gamma, beta, mean, var = _batchnorm_params(bn)
        factor = gamma / np.sqrt(var + bn.epsilon)
        if depthwise:
            kernel = kernel * factor.reshape(kernel.shape[2], kernel.shape[3])
        else:
            kernel = kernel * factor
        bias = (beta - mean * factor) + (bias * factor if bias is not None else 0.0)
        config["use_bias"] = True
    cls = QuantDepthwiseConv2D if depthwise else QuantConv2D
    new = cls.from_config(config)
    new.build(conv.input.shape)
    weights = [kernel.astype(np.float32)] + ([bias.astype(np.float32)] if config["use_bias"] else [])
    new.set_weights(weights)
    return new


def _batchnorm_params(bn):
    channels = bn.moving_mean.shape[0]
    gamma = np.asarray(bn.gamma, np.float64) if bn.scale else np.ones(channels)
    beta = np.asarray(bn.beta, np.float64) if bn.center else np.zeros(channels)
    return gamma, beta, np.asarray(bn.moving_mean, np.float64), np.asarray(bn.moving_variance, np.float64)


def _quantized_dense(dense):
    from edgevit.quantize.layers import QuantDense

    config = dense.get_config()
    config["activation"] = None
    new = QuantDense.from_config(config)
    new.build(dense.input.shape)
    new.set_weights(dense.get_weights())
    return new


def _quantized_custom(layer, momentum):
    from edgevit.quantize.layers import QUANTIZED_CUSTOM

    cls = next(c for base, c in QUANTIZED_CUSTOM.items() if type(layer) is base)
    new = cls.from_config({**layer.get_config(), "momentum": momentum})
    new.build(layer.input.shape)
    for src, dst in zip(_own_weights(layer), _own_weights(new)):
        dst.assign(src)
    return new


def _own_weights(layer):
    """Trainable parameters and non-quantizer state, in a stable order."""
    out = []
    for w in layer.weights:
        owner = w.path.split("/")[-2] if "/" in w.path else ""
        if owner.startswith("q_") or "range_" in w.name or w.name == "batches_seen":
            continue
        out.append(w)
    return out


def _preprocessing_range(model) -> tuple[float, float]:
    try:
        from edgevit.registry import get_spec

        return get_spec(model.name).preprocessing.value_range
    except EdgevitError:
        return (0.0, 1.0)

