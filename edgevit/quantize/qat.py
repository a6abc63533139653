"""Quantization-aware training models, built by rewriting a functional graph.

:func:`quantize_model` walks an edgevit (or any functional Keras) model and
rebuilds it with fake quantization wherever the int8 LiteRT graph has a
quantized tensor, layer by layer as ``edgevit.quantize.registry`` says:

- model input: the preprocessing's value range (fixed);
- Conv2D / DepthwiseConv2D (+ the BatchNormalization that follows, folded in)
  and Dense: per-channel int8 kernels, tracked output range;
- activations (SiLU as LOGISTIC + MUL, LiteRT's fixed LOGISTIC, SOFTMAX and
  TANH output ranges), residual adds, concatenations, pooling: tracked
  output ranges;
- edgevit's LayerNorm, attention, token and resampling layers: their
  quantization-aware subclasses, with a range at every internal op and every
  constant operand on the int8 grid the converter puts it on;
- reshapes, splits, padding, dropout, unfold/fold and resizes keep the
  scale of their input (LiteRT requires it), so nothing is inserted.

A layer called at several places (one LayerNorm for a class-token group and
a patch group) keeps one set of weights and gets ranges per call. A layer
class the registry does not know is an error naming it. The QAT model keeps
the original model's name, so it is still recognised as its registered
variant, and its outputs' names (a detector's "boxes" and "scores"), and
saves/loads as ``.keras``.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

import numpy as np

from edgevit.errors import EdgevitError, first_line
from edgevit.quantize.export_trace import fake_quant_only
from edgevit.quantize.registry import rule_for, rule_of_quantized

CONV_TYPES = ("Conv2D", "DepthwiseConv2D")
# The activations LiteRT's converter fuses into the CONV_2D, DEPTHWISE_CONV_2D or FULLY_CONNECTED before them
FUSED_ACTIVATIONS = ("relu", "relu6")
# A model output that a quantizer rounds gets its name back from an Identity after the quantizer; the
# quantization-aware form of the layer that wrote it takes the name with this suffix
COMPUTED_SUFFIX = ".computed"


def is_qat_model(model) -> bool:
    from edgevit.quantize.quantizers import ActivationQuantizer

    return any(isinstance(layer, ActivationQuantizer) for layer in _all_layers(model))


def quantize_model(model, calibration: np.ndarray | None = None, *, momentum: float = 0.99,
                   input_range: tuple[float, float] | None = None, batch_size: int = 16):
    """A quantization-aware copy of functional ``model`` (weights copied,
    BatchNorm folded). With ``calibration`` images, activation ranges are
    initialised from them (see :func:`calibrate`)."""
    import keras

    if is_qat_model(model):
        raise EdgevitError(f"{model.name} is already a quantization-aware model.")
    if not isinstance(model, keras.Model) or not hasattr(model, "_nodes_by_depth") \
            or type(model).__name__ not in ("Functional", "Model"):
        raise EdgevitError(f"QAT needs a functional Keras model; {model.name} is a {type(model).__name__}.")
    rules = {id(op): rule_for(op) for op in model.operations}
    bn_of_conv = {id(conv): bn for conv, bn in _conv_batchnorm_pairs(model)}
    folded = {id(bn) for bn in bn_of_conv.values()}
    for layer in model.operations:
        if rules[id(layer)].ranges == "folded" and id(layer) not in folded:
            raise EdgevitError(f"BatchNormalization {layer.name!r} does not directly follow a convolution "
                               "that feeds only it; QAT folds BatchNorm into that convolution.")
    fused = _fused_activations(model, bn_of_conv)
    ranges = _RangePlan(model, rules, bn_of_conv, momentum,
                        _preprocessing_range(model) if input_range is None else input_range, set(fused.values()))
    output_writers = _rounded_output_writers(model, ranges)
    rewrite = _Rewrite(model, rules, bn_of_conv, momentum,
                       {key: name + COMPUTED_SUFFIX for key, name in output_writers.items()})
    constant_operands: dict[int, object] = {}
    try:
        tensors, inputs = {}, []
        for t in model.inputs:
            inputs.append(keras.Input(batch_shape=t.shape, dtype=t.dtype, name=t.name))
            tensors[id(t)] = ranges.quantize(t, inputs[-1])
        for depth in sorted(model._nodes_by_depth, reverse=True):
            for node in model._nodes_by_depth[depth]:
                if node.is_input:
                    continue
                operands = tensors
                if ranges.mixes_constants(node):
                    operands = {**tensors, **{id(t): _constant_operand(t, tensors, constant_operands)
                                              for t in node.input_tensors if id(t) in ranges.constant}}
                args, kwargs = node.arguments.fill_in(operands)
                input_params = [ranges.params.get(id(t)) for t in keras.tree.flatten((args, kwargs))]
                outputs = keras.tree.flatten(rewrite(node.operation, args, kwargs, input_params))
                matmul = rewrite.output_matmul(node.operation, input_params)
                for old, new in zip(node.outputs, outputs):
                    accumulator = rewrite.accumulators.get(id(args[0]) if id(node.operation) in fused else id(new)) \
                        or _sum_operands(node, args, kwargs, input_params) \
                        or _softmax_operands(node, args, input_params)
                    tensors[id(old)] = ranges.quantize(old, new, input_params[0], matmul, accumulator)
        outputs = keras.tree.pack_sequence_as(model._outputs_struct, [
            keras.layers.Identity(name=output_writers[id(_producer(t))])(tensors[id(t)])
            if id(_producer(t)) in output_writers else tensors[id(t)] for t in model.outputs])
        qat = keras.Model(inputs if len(inputs) > 1 else inputs[0], outputs, name=model.name)
    except EdgevitError:
        raise
    except Exception as err:
        raise EdgevitError(f"Could not build the QAT model of {model.name}: {first_line(err)}") from err
    if calibration is not None:
        calibrate(qat, calibration, batch_size=batch_size)
    return qat


class _Rewrite:
    """Calls the quantization-aware form of each layer (one per float layer,
    shared by all its call sites); the outputs are quantized by _RangePlan."""

    def __init__(self, model, rules, bn_of_conv, momentum: float, renamed: dict[int, str]):
        self.rules, self.bn_of_conv, self.momentum = rules, bn_of_conv, momentum
        self.renamed = renamed   # id(float layer) -> the name of its quantization-aware form, where not its own
        self.sites = Counter(id(node.operation) for nodes in model._nodes_by_depth.values() for node in nodes
                             if not node.is_input)
        self.calls: Counter = Counter()
        self.replacements: dict = {}
        # id(output of a convolution or dense layer) -> (its input's [scale, zero point], its channel scales)
        self.accumulators: dict[int, tuple] = {}

    def output_matmul(self, layer, input_params):
        """[scale, zero point] of the operands of the BATCH_MATMUL that
        writes the output of ``layer``'s quantization-aware form, if one
        does: (lhs, rhs)."""
        new = self.replacements.get(id(layer))
        operands = getattr(new, "OUTPUT_MATMUL", None)
        if operands is None:
            return None
        return tuple(input_params[source] if isinstance(source, int) else _range_params(new.fixed_range(source))
                     for source in operands)

    def replacement(self, key, build):
        if key not in self.replacements:
            self.replacements[key] = build()
        return self.replacements[key]

    def __call__(self, layer, args, kwargs, input_params: list):
        """``input_params``: [scale, zero point] of each (flattened) input, or None."""

        from edgevit.quantize.multi_op_layers import QuantActivation
        from edgevit.quantize.quantizers import ActivationQuantizer

        rule = self.rules[id(layer)]
        site = self.calls[id(layer)]
        self.calls[id(layer)] += 1
        sites = self.sites[id(layer)]
        name = self.renamed.get(id(layer), layer.name)
        if rule.ranges == "folded":
            return args[0]
        if rule.ranges == "points":
            new = self.replacement(id(layer), lambda: rule.quantized_class.from_float(layer, self.momentum, sites,
                                                                                      name))
            if not new.accumulates_output(input_params):
                return new(*args, site=site, input_params=input_params, **kwargs)
            # every call of a layer returns the same structure (Keras maps a shared layer's outputs by position)
            out, accumulator = new(*args, site=site, input_params=input_params, with_accumulator=True, **kwargs)
            if any(params is not None for params in input_params):  # a call on constants: folded by the converter
                self.accumulators[id(out)] = accumulator
            return out
        kind = type(layer).__name__
        accumulator = None
        if kind in CONV_TYPES or kind == "Dense":
            build = (lambda: _quantized_conv(layer, self.bn_of_conv.get(id(layer)), name)) if kind in CONV_TYPES \
                else (lambda: _quantized_dense(layer, name))
            new = self.replacement(id(layer), build)
            out, kernel_scales = new(*args, input_params=input_params[0], with_kernel_scales=True, **kwargs)
            if input_params[0] is not None:
                accumulator = {"input_params": input_params[0], "kernel_scales": kernel_scales}
        else:
            out = self.replacement(id(layer), lambda: _clone(layer, name))(*args, **kwargs)
        activation = _activation(layer)
        if activation in (None, "linear"):
            if accumulator is not None:
                self.accumulators[id(out)] = accumulator
            return out
        fused = activation in FUSED_ACTIVATIONS
        if not fused:
            out = ActivationQuantizer(self.momentum, name=f"{layer.name}.quant" + (f".{site}" if site else ""))(
                out, **(accumulator or {}))
        act = self.replacement((id(layer), "act"), lambda: QuantActivation(
            activation, momentum=self.momentum, sites=sites, name=f"{layer.name}.act"))
        out = act(out, site=site)
        if fused and accumulator is not None:  # the activation's output quantizer rounds the accumulator
            self.accumulators[id(out)] = accumulator
        return out


class _RangePlan:
    """Where the rewritten graph gets an activation range, and which.

    Every tensor an op writes gets one (the model input the preprocessing's,
    fixed, and LiteRT's fixed output ranges stay fixed), except outputs that
    keep their input's scale ("input" rules) and a convolution output whose
    BatchNorm is folded in (the BatchNorm output has it). The tensors that
    LiteRT keeps at one scale (the inputs and output of a CONCATENATION,
    traced back through scale-keeping ops) share one quantizer, a slot each:
    with ranges of their own, the converter would requantize some of them
    with a kernel of its choice, and the int8 file would no longer compute
    what the QAT model computes.

    Constants of the graph (learned tokens and what is computed from them
    alone) get no range: the converter folds them in float. Where one meets
    the image's tensors, it is quantized as the converter quantizes the
    folded constant: over its own range, or at the scale of the
    CONCATENATION it joins.
    """

    def __init__(self, model, rules, bn_of_conv, momentum: float, input_range, unquantized: set[int]):
        self.momentum = momentum
        # the outputs of the convolutions and dense layers whose activation the converter fuses into them
        self.unquantized = unquantized
        self.needs_range: dict[int, tuple] = {}   # tensor id -> (name, fixed range or None)
        self.model_inputs = {id(t) for t in model.inputs}
        for t in model.inputs:
            self.needs_range[id(t)] = (f"{t.name or 'input'}.quant", tuple(input_range))
        self.rules = rules
        self.constant: set[int] = set()   # ids of the tensors that do not depend on the input's values
        node_counts: Counter = Counter()
        shared = []
        for depth in sorted(model._nodes_by_depth, reverse=True):
            for node in model._nodes_by_depth[depth]:
                layer = node.operation
                if node.is_input:
                    continue
                rule = rules[id(layer)]
                site = node_counts[id(layer)]
                node_counts[id(layer)] += 1
                constant_inputs = [id(t) in self.constant for t in node.input_tensors]
                if rule.constant_output:
                    constant_outputs = [True] * len(node.outputs)
                elif rule.quantized_class is not None and hasattr(rule.quantized_class, "constant_outputs"):
                    constant_outputs = rule.quantized_class.constant_outputs(constant_inputs, len(node.outputs))
                else:
                    constant_outputs = [all(constant_inputs)] * len(node.outputs)
                self.constant.update(id(t) for t, c in zip(node.outputs, constant_outputs) if c)
                if rule.ranges == "shared":
                    shared.append(node)
                if rule.ranges == "input" or id(layer) in bn_of_conv:
                    continue
                fixed = _output_fixed_range(layer, rule)
                # a Dense or Conv2D with an activation: its own output range is "NAME.quant"
                base = f"{layer.name}.act" if _activation(layer) not in (None, "linear") else layer.name
                for index, t in enumerate(node.outputs):
                    if id(t) in unquantized:
                        continue
                    name = f"{base}.quant" + (str(index) if len(node.outputs) > 1 else "") + \
                           (f".{site}" if site else "")
                    self.needs_range[id(t)] = (name, fixed)
        self.group_of: dict[int, int] = {}
        self.members: dict[int, list] = {}
        for node in shared:
            self._join([*(_scale_source(t, rules) for t in node.input_tensors), *node.outputs])
        with_image = {self._root(k) for k in self.needs_range if k not in self.constant}
        for key in [k for k in self.needs_range if k in self.constant and self._root(k) not in with_image]:
            del self.needs_range[key]
        self.quantizers: dict[int, object] = {}
        self.params: dict[int, object] = {}   # id(rewritten tensor) -> its [scale, zero point]

    def mixes_constants(self, node) -> bool:
        """Whether ``node`` is one op reading both constants and the image's
        tensors (a CONCATENATION's constants take its range instead, a layer
        with quantize points handles them itself)."""
        if self.rules[id(node.operation)].ranges != "output":
            return False
        constant = [id(t) in self.constant for t in node.input_tensors]
        return any(constant) and not all(constant)

    def _join(self, tensors):
        roots = {self._root(id(t)) for t in tensors}
        root = min(roots)
        for other in roots - {root}:
            self.group_of[other] = root

    def _root(self, key: int) -> int:
        while self.group_of.get(key, key) != key:
            key = self.group_of[key]
        return key

    def quantize(self, old, new, input_params=None, matmul=None, accumulator=None):
        """``new`` (the rewritten ``old``) with its range applied, if it has
        one; its [scale, zero point] go to ``params`` (those of the op's
        input, ``input_params``, where the op keeps them). ``matmul``: the
        operands' when a BATCH_MATMUL writes ``old``; ``accumulator``: the
        quantizer arguments when a convolution or dense layer does."""
        from edgevit.quantize.quantizers import ActivationQuantizer

        if id(old) not in self.needs_range:
            if input_params is not None and id(old) not in self.constant and id(old) not in self.unquantized:
                self.params[id(new)] = input_params
            return new
        root = self._root(id(old))
        if root not in self.quantizers:
            members = [k for k in self.needs_range if self._root(k) == root]
            name = self.needs_range[members[0]][0]
            fixed = next((self.needs_range[k][1] for k in members if self.needs_range[k][1] is not None), None)
            self.quantizers[root] = ActivationQuantizer(self.momentum, fixed_range=fixed, slots=len(members),
                                                        model_input=any(k in self.model_inputs for k in members),
                                                        name=name)
            self.members[root] = members
        lhs, rhs = matmul or (None, None)
        quantized, params = self.quantizers[root](new, slot=self.members[root].index(id(old)), with_params=True,
                                                  lhs=lhs, rhs=rhs, **(accumulator or {}))
        self.params[id(quantized)] = params
        return quantized


def _sum_operands(node, args, kwargs, input_params) -> dict | None:
    """The quantizer arguments for the output of a two-operand Add layer
    (see edgevit.quantize.kernel_arithmetic.sum_requantized)."""
    import keras

    operands = keras.tree.flatten((args, kwargs))
    if not isinstance(node.operation, keras.layers.Add) or len(operands) != 2 or \
            any(params is None for params in input_params):
        return None
    return {"addends": operands, "addend_params": list(input_params)}


def _softmax_operands(node, args, input_params) -> dict | None:
    """The quantizer arguments for the output of a Softmax layer over the
    last axis of an int8 tensor (see
    edgevit.quantize.kernel_arithmetic.arm64_softmax_requantized)."""
    import keras

    layer = node.operation
    if not isinstance(layer, keras.layers.Softmax) or layer.axis not in (-1, len(args[0].shape) - 1) or \
            input_params[0] is None:
        return None
    return {"logits": args[0], "logit_params": input_params[0]}


def _constant_operand(tensor, tensors: dict, quantized: dict):
    """The rewritten constant ``tensor``, quantized as a constant operand (once)."""
    from edgevit.quantize.quantizers import ConstantQuantizer

    if id(tensor) not in quantized:
        producer = tensor._keras_history.operation.name
        quantized[id(tensor)] = ConstantQuantizer(name=f"{producer}.constant{len(quantized)}")(tensors[id(tensor)])
    return quantized[id(tensor)]


def _scale_source(tensor, rules):
    """The tensor whose scale ``tensor`` has in LiteRT: back through ops
    that keep their input's scale."""
    while True:
        history = getattr(tensor, "_keras_history", None)
        if history is None:
            return tensor
        layer = history.operation
        node = layer._inbound_nodes[history.node_index]
        if rules.get(id(layer)) is None or rules[id(layer)].ranges not in ("input", "shared") \
                or len(node.input_tensors) != 1:
            return tensor
        tensor = node.input_tensors[0]


def _range_params(fixed_range) -> list[float]:
    """[scale, zero point, scale residual] of a fixed range (see
    edgevit.quantize.int8_ranges.quantization_params)."""
    from edgevit.quantize.int8_ranges import quantization_params

    return [float(v) for v in quantization_params(*fixed_range)]


def _activation(layer) -> str | None:
    """The name of the activation in ``layer``'s config, if it has one."""
    from edgevit.quantize.multi_op_layers import activation_name

    activation = layer.get_config().get("activation")
    return None if activation is None else activation_name(activation)


def _output_fixed_range(layer, rule):
    from edgevit.quantize.int8_ranges import FIXED_OUTPUT_RANGES

    activation = _activation(layer)
    return rule.fixed_range if activation is None else FIXED_OUTPUT_RANGES.get(activation)


def output_params(qat_model, index: int):
    """[scale, zero point, scale residual] of output ``index`` of
    ``qat_model``: its quantizer's, found back through the ops that keep
    their input's scale (a concatenation's inputs share one)."""
    from edgevit.quantize.quantizers import ActivationQuantizer

    tensor = qat_model.outputs[index]
    while True:
        layer, node_index, _ = tensor._keras_history
        if isinstance(layer, ActivationQuantizer):
            return layer.params()
        node = layer._inbound_nodes[node_index]
        if rule_of_quantized(layer) is not None or not node.input_tensors \
                or rule_for(layer).ranges not in ("input", "shared"):
            raise EdgevitError(f"Output {index} of {qat_model.name} is written by {layer.name!r}, "
                               "which gives it no int8 range of its own.")
        tensor = node.input_tensors[0]


def calibrate(qat_model, images: np.ndarray | Iterable, batch_size: int = 16, max_batches: int | None = None,
              on_batch: Callable[[], None] = lambda: None) -> int:
    """Initialise activation ranges: run ``images`` (an array or an iterable
    of batches) through the model with every quantizer observing (inputs pass
    unquantized, the layers in float), in inference mode, calling
    ``on_batch()`` after each.
    Returns the number of batches."""
    from edgevit.quantize.quantizers import ActivationQuantizer

    quantizers = [layer for layer in _all_layers(qat_model) if isinstance(layer, ActivationQuantizer)]
    if isinstance(images, np.ndarray):
        batches = [images[i:i + batch_size] for i in range(0, len(images), batch_size)]
    else:
        batches = images
    count = 0
    try:
        for quantizer in quantizers:
            quantizer.observing = True
        with fake_quant_only():
            for batch in batches:
                if isinstance(batch, (tuple, list)):
                    batch = batch[0]
                qat_model(batch, training=False)
                count += 1
                on_batch()
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
    from edgevit.quantize.quantizers import ActivationQuantizer

    ranges = {}
    for path, layer in _layer_paths(qat_model):
        if isinstance(layer, ActivationQuantizer):
            if layer.fixed_range is not None:
                ranges[path] = layer.fixed_range
            else:
                lo, hi = layer.quantization_range()
                ranges[path] = (float(lo), float(hi))
    return ranges


def per_channel_weights(qat_model) -> list[str]:
    """Paths of the weights that are int8 per output channel (every other
    weight is a per-tensor int8 constant)."""
    paths = {}
    for path, layer in _layer_paths(qat_model):
        rule = rule_of_quantized(layer)
        for attribute in rule.per_channel if rule else ():
            paths[f"{path}/{attribute.replace('.', '/')}"] = True
    return list(paths)


# --- graph helpers -----------------------------------------------------------------------------

def _layer_paths(model):
    """(path, layer) of every layer and nested layer of ``model``, once each;
    a path joins the layer names from the model down (``blocks.0.norm1/q_mean``)."""
    seen = set()

    def walk(layer, path):
        if id(layer) in seen:
            return
        seen.add(id(layer))
        yield path, layer
        for sub in getattr(layer, "_layers", []) or []:
            yield from walk(sub, f"{path}/{sub.name}")

    for layer in model.layers:
        yield from walk(layer, layer.name)


def _all_layers(model):
    return (layer for _, layer in _layer_paths(model))


def _producer(tensor):
    history = getattr(tensor, "_keras_history", None)
    return history.operation if history is not None else None


def _rounded_output_writers(model, ranges: _RangePlan) -> dict[int, str]:
    """id(layer) -> name of each layer that writes an output of ``model``
    which a quantizer rounds (the output then has the quantizer's name),
    where no other output has that name (and the output is not an input)."""
    names = Counter(model.output_names)
    return {id(_producer(t)): _producer(t).name for t in model.outputs
            if id(t) in ranges.needs_range and id(t) not in ranges.model_inputs and names[_producer(t).name] == 1}


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


def _fused_activations(model, bn_of_conv) -> dict[int, int]:
    """id(activation layer) -> id(the tensor it reads), for each ReLU or
    ReLU6 Activation layer that the converter fuses into the convolution or
    dense layer before it (through a folded BatchNorm): that op writes the
    activation's output on the activation's grid, rounded once, and the
    tensor before the activation has no range of its own (a range of its
    own would round the accumulator twice: a level off in about one element
    in five of DeepViT's ReLU stem)."""
    folded = {id(bn) for bn in bn_of_conv.values()}
    fused = {}
    for layer in model.operations:
        if type(layer).__name__ != "Activation" or _activation(layer) not in FUSED_ACTIVATIONS \
                or len(layer._inbound_nodes) != 1 or len(layer._inbound_nodes[0].input_tensors) != 1:
            continue
        tensor = layer._inbound_nodes[0].input_tensors[0]
        producer = _producer(tensor)
        if producer is None or len(producer._outbound_nodes) != 1 or len(producer._inbound_nodes) != 1:
            continue
        kind = type(producer).__name__
        writes = id(producer) in folded or (kind in (*CONV_TYPES, "Dense") and id(producer) not in bn_of_conv
                                            and _activation(producer) in (None, "linear"))
        if writes:
            fused[id(layer)] = id(tensor)
    return fused


def _input_shape(layer):
    return layer._inbound_nodes[0].input_tensors[0].shape


def _clone(layer, name: str):
    return type(layer).from_config({**layer.get_config(), "name": name})


def _quantized_conv(conv, bn, name: str):
    from edgevit.quantize.conv_dense_layers import QuantConv2D, QuantDepthwiseConv2D, fold_batchnorm

    config = conv.get_config()
    config.update(activation=None, name=name)
    depthwise = type(conv).__name__ == "DepthwiseConv2D"
    kernel = np.asarray(conv.kernel)
    bias = np.asarray(conv.bias) if conv.use_bias else None
    if bn is not None:
        shape = kernel.shape
        # a depthwise kernel's output channels are its last two axes (channel, multiplier)
        flat = kernel.reshape(*shape[:2], 1, shape[2] * shape[3]) if depthwise else kernel
        flat, bias = fold_batchnorm(flat, bias, bn)
        kernel = flat.reshape(shape)
        config["use_bias"] = True
    new = (QuantDepthwiseConv2D if depthwise else QuantConv2D).from_config(config)
    new.build(_input_shape(conv))
    new.set_weights([kernel] + ([bias] if config["use_bias"] else []))
    return new


def _quantized_dense(dense, name: str):
    from edgevit.quantize.conv_dense_layers import QuantDense

    config = dense.get_config()
    config.update(activation=None, name=name)
    new = QuantDense.from_config(config)
    new.build(_input_shape(dense))
    new.set_weights(dense.get_weights())
    return new


def _preprocessing_range(model) -> tuple[float, float]:
    try:
        from edgevit.registry import get_spec

        return get_spec(model.name).preprocessing.value_range
    except EdgevitError:
        return (0.0, 1.0)

