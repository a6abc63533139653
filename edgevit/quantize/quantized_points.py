"""How a layer of several int8 ops places its int8 tensors.

A float layer marks each op output with a ``quantize_point`` tag (see
``edgevit.layers.quantize_points``); its quantization-aware twin mixes in
:class:`QuantizedPoints`, whose class attributes say, tag by tag, which
range LiteRT gives that tensor (tracked, fixed by the op, a constant's own)
and which of LiteRT's kernels writes it (BATCH_MATMUL, MUL, ADD, MEAN,
FULLY_CONNECTED), so that its quantizer rounds as that kernel does (see
:mod:`edgevit.quantize.kernel_arithmetic`).
"""
from __future__ import annotations

import functools
import inspect

import keras
from keras import ops

from edgevit.errors import EdgevitError
from edgevit.quantize.export_trace import float_while_exporting, is_exporting, kernel_arithmetic_applies
from edgevit.quantize.int8_ranges import PARAMS_SIZE, constant_params, part, weight_scales
from edgevit.quantize.kernel_arithmetic import on_levels
from edgevit.quantize.quantizers import (DEFAULT_MOMENTUM, ActivationQuantizer, fake_quant_constant, kernel_bound,
                                         round_kernel_to_grid)


class QuantizedPoints:
    """Mixin for the quantization-aware form of a layer with
    ``quantize_point`` hooks (see ``edgevit.layers.quantize_points``).

    Every tag is one of:

    - an op output (``TAGS``): a tracked range, or the fixed range LiteRT
      gives that op (``FIXED``: LOGISTIC, SOFTMAX);
    - a constant operand (``CONSTANTS``: a LayerNorm's gamma, a position
      embedding): per-tensor int8 with the range of its own values and zero,
      which is how the converter quantizes a constant operand of MUL or ADD;
    - a constant matrix that the converter turns into FULLY_CONNECTED
      weights (``KERNELS``, with the axes its output channels do not run
      along): the per-output-channel grid of a Dense kernel.

    ``MATMULS`` names, for each op output that is a BATCH_MATMUL of two
    activations, where its operands' scales come from (a tag, or the index
    of a layer input), so that its quantizer rounds as that kernel does;
    ``OUTPUT_MATMUL`` the same for a layer output; ``SOFTMAXES``, for each
    SOFTMAX output, the tag whose grid its input lies on. The layer's own
    outputs are not among the tags: the QAT rewrite gives every layer
    output its range.

    A layer called at several places of a model (one LayerNorm over a class
    token group and a patch group) produces separate int8 tensors at each
    call, so each call site ``site`` has its own ranges; weights are shared.
    """

    TAGS: tuple[str, ...] = ()
    FIXED: dict[str, tuple[float, float]] = {}
    CONSTANTS: tuple[str, ...] = ()
    KERNELS: dict[str, tuple[int, ...]] = {}
    MATMULS: dict[str, tuple[str | int, str | int]] = {}
    # tag -> the op that writes it, where both that op and the op reading the
    # tag can stay in float (``--int8-mixed``: BATCH_MATMUL, SOFTMAX): then
    # the tag has no range, and the converter leaves both ops in float.
    FLOAT_WHEN_MIXED: dict[str, str] = {}
    # The layer's last ops, in order, as (op output tag they read, constant
    # weight operand, the value that makes the op an identity: 1 for MUL, 0
    # for ADD). Where every op after a tag is an identity (untrained weights
    # quantize to exactly 1 or 0), the converter folds them away, and the
    # tag's own range would meet the layer's output range: the tag has none.
    IDENTITY_TAIL: tuple[tuple[str, str, float], ...] = ()
    OUTPUT_MATMUL: tuple[str | int, str | int] | None = None
    # internal Dense -> what it reads: the layer's input i, or the tag of an internal op output
    DENSE_INPUTS: dict[str, int | str] = {}
    # op output tag -> the internal Dense that writes it, and the internal
    # Dense that writes the layer's output: their quantizers round the int32
    # accumulator as XNNPACK does (see accumulator_requantized)
    DENSE_OUTPUTS: dict[str, str] = {}
    OUTPUT_DENSE: str | None = None
    # op output tag -> the operands (a tag or an input index) of the MUL
    # that writes it; XNNPACK requantizes their integer product as it does an
    # accumulator. OUTPUT_PRODUCT: the same for the layer's output.
    PRODUCTS: dict[str, tuple[str | int, str | int]] = {}
    OUTPUT_PRODUCT: tuple[str | int, str | int] | None = None
    # op output tag -> the operands (a tag or an input index) of the ADD
    # (sign 1) or SUB (sign -1) that writes it, and the sign: XNNPACK sums
    # their levels with fixed-point multipliers (see sum_requantized)
    SUMS: dict[str, tuple[str | int, str | int, float]] = {}
    # op output tag -> the operand (a tag or an input index) of the MEAN
    # that writes it and the axes it reduces: XNNPACK rescales the integer
    # sum of the levels (see mean_requantized)
    MEANS: dict[str, tuple[str | int, tuple[int, ...]]] = {}
    # the same for the ADD or SUB that writes the layer's output
    OUTPUT_SUM: tuple[str | int, str | int, float] | None = None
    # op output tag -> the tag (or input index) whose int8 grid the input of
    # the SOFTMAX that writes it lies on: on Arm64 kernels, the quantizer
    # rounds it from those levels (see arm64_softmax_requantized)
    SOFTMAXES: dict[str, str | int] = {}

    def __init__(self, *args, momentum: float = DEFAULT_MOMENTUM, sites: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.momentum, self.sites = momentum, int(sites)
        self.site, self.input_params, self.constant, self.training_call = 0, None, False, False
        # this call's inputs and quantized op outputs by tag (the operands of
        # SUMS and MEANS), and its constants' [scale, zero point]
        self.operands: dict[str | int, object] = {}
        # this call's SOFTMAX inputs by the tag of their output
        self.softmax_logits: dict[str, object] = {}
        self.constant_params: dict[str, object] = {}
        # XNNPACK runs an int8 BATCH_MATMUL only when its second operand has zero point 0
        symmetric = {rhs for _, rhs in (*self.MATMULS.values(), *filter(None, [self.OUTPUT_MATMUL]))}
        for site in range(self.sites):
            for tag in self.point_tags():
                name = self.quantizer_name(tag, site)
                setattr(self, name, ActivationQuantizer(momentum, fixed_range=self.fixed_range(tag),
                                                        symmetric=tag in symmetric, name=name))
        for dense, source in self.DENSE_INPUTS.items():
            if hasattr(self, dense):
                getattr(self, dense).input_params_source = functools.partial(self.params_of, source)

    def params_of(self, source):
        """[scale, zero point] of the layer's input ``source`` (an index) or
        of its internal op output ``source`` (a tag); None if unknown."""
        if isinstance(source, str):
            return self.constant_params[source] if source in self.CONSTANTS else self.quantizer(source).params()
        return self.input_params[source] if self.input_params else None

    def point_tags(self) -> tuple[str, ...]:
        """The op-output tags this configuration of the layer reaches."""
        return self.TAGS

    def fixed_range(self, tag: str):
        return self.FIXED.get(tag)

    def output_range(self):
        """The range LiteRT fixes for the layer's output (None: tracked)."""
        return None

    @staticmethod
    def quantizer_name(tag: str, site: int) -> str:
        return f"q_{tag}" if site == 0 else f"q{site}_{tag}"

    @classmethod
    def from_float(cls, layer, momentum: float, sites: int, name: str):
        """The quantization-aware twin of float ``layer`` with its weights, named ``name``."""
        new = cls.from_config({**layer.get_config(), "momentum": momentum, "sites": sites, "name": name})
        new.build_like(layer)
        copy_weights(layer.weights, own_weights(new), layer.name)
        return new

    def build_like(self, layer):
        self.build(layer._build_shapes_dict and next(iter(layer._build_shapes_dict.values())))

    def call(self, inputs, training=None, site: int = 0, input_params=None, with_accumulator: bool = False):
        """``input_params``: [scale, zero point] of each (flattened) input,
        for the int32 biases of the Dense layers that read them
        (``DENSE_INPUTS``) and the BATCH_MATMULs (``MATMULS``); None for an
        input that is a constant of the graph (see :meth:`constant_outputs`).
        A call on constants only computes in float: the converter folds it.
        ``with_accumulator``: also return the arguments for the quantizer of
        the layer's output, which an internal Dense or MUL writes
        (:meth:`output_accumulator`)."""
        self.site, self.input_params, self.training_call = site, input_params, bool(training)
        self.operands = dict(enumerate(keras.tree.flatten(inputs)))
        self.softmax_logits = {}
        self.constant = bool(input_params) and all(p is None for p in input_params)
        outputs = self.float_call(inputs, training)
        return (outputs, self.output_accumulator()) if with_accumulator else outputs

    def output_product(self):
        return self.OUTPUT_PRODUCT

    def accumulates_output(self, input_params) -> bool:
        """Whether the layer's output, given its inputs' [scale, zero point]
        ``input_params``, is written by an internal Dense or MUL whose
        rounding the output's quantizer follows (the QAT rewrite then asks
        for :meth:`call`'s ``with_accumulator``)."""
        if self.OUTPUT_DENSE is not None:
            return True
        operands = self.output_product() or (self.OUTPUT_SUM[:2] if self.OUTPUT_SUM else None)
        return operands is not None and all(not isinstance(source, int) or
                                            (source < len(input_params) and input_params[source] is not None)
                                            for source in operands)

    def output_accumulator(self) -> dict:
        if self.OUTPUT_DENSE is not None:
            return self.accumulator_of(self.OUTPUT_DENSE)
        if self.OUTPUT_SUM is not None:
            return self.sum_of(*self.OUTPUT_SUM)
        return self.product_of(*self.output_product())

    def compute_output_spec(self, *args, with_accumulator: bool = False, **kwargs):
        spec = super().compute_output_spec(*args, **kwargs)
        if not with_accumulator:
            return spec

        def params():  # one symbolic tensor each: the functional graph maps values by tensor
            return keras.KerasTensor((PARAMS_SIZE,), "float32")

        if self.OUTPUT_DENSE is not None:
            channels = getattr(self, self.OUTPUT_DENSE).units
            return spec, {"input_params": params(), "kernel_scales": keras.KerasTensor((channels,), "float32")}
        if self.OUTPUT_SUM is not None:
            return spec, {"addends": [keras.KerasTensor(spec.shape, spec.dtype),
                                      keras.KerasTensor(self.output_sum_shape(), spec.dtype)],
                          "addend_params": [params(), params()]}
        return spec, {"factor_params": [params(), params()]}

    def output_sum_shape(self) -> tuple[int, ...]:
        """The shape of the second operand of ``OUTPUT_SUM``."""
        raise NotImplementedError(f"{type(self).__name__} has no output sum")

    def product_of(self, first, second) -> dict | None:
        """The quantizer arguments for a MUL of two int8 operands (a tag or
        an input index each); None where one is not an int8 tensor."""
        params = [self.params_of(first), self.params_of(second)]
        if any(p is None for p in params):
            return None
        return {"square_params": params[0]} if first == second else {"factor_params": params}

    def sum_of(self, first, second, sign: float) -> dict | None:
        """The quantizer arguments for an ADD (``sign`` 1) or SUB (-1) of
        two int8 operands (a tag or an input index each); None where one is
        not an int8 tensor. A SUB is XNNPACK's ADD with the second
        operand's multiplier negated: its levels negated here."""
        params = [self.params_of(first), self.params_of(second)]
        if any(p is None for p in params):
            return None
        second_operand = self.operands[second] if sign == 1.0 else ops.multiply(self.operands[second], sign)
        return {"addends": [self.operands[first], second_operand], "addend_params": params}

    def mean_of(self, source, axes: tuple[int, ...]) -> dict | None:
        """The quantizer arguments for a MEAN over ``axes`` of an int8
        operand (a tag or an input index); None where it is not one."""
        params = self.params_of(source)
        if params is None:
            return None
        return {"summands": self.operands[source], "summand_params": params, "axes": tuple(axes)}

    def accumulator_of(self, dense: str, start: int = 0, stop: int | None = None) -> dict:
        """The quantizer arguments for the output channels [start, stop) of
        the internal Dense ``dense`` (see accumulator_requantized)."""
        kernel = getattr(self, dense).kernel
        return {"input_params": self.params_of(self.DENSE_INPUTS[dense]),
                "kernel_scales": weight_scales(kernel_bound(round_kernel_to_grid(kernel), -1))[start:stop]}

    def dense_output(self, tag: str) -> dict:
        """The quantizer arguments for op output ``tag`` written by an internal Dense."""
        return self.accumulator_of(self.DENSE_OUTPUTS[tag])

    @classmethod
    def constant_outputs(cls, constant_inputs: list[bool], outputs: int) -> list[bool]:
        """Which outputs are constants of the graph, given which inputs are."""
        return [bool(constant_inputs) and all(constant_inputs)] * outputs

    def float_call(self, inputs, training):
        float_call = super().call
        if "training" in inspect.signature(float_call).parameters:
            return float_call(inputs, training=training)
        return float_call(inputs)

    def softmax_point(self, tag: str, logits):
        self.softmax_logits[tag] = logits
        return super().softmax_point(tag, logits)

    def softmax_logit_params(self, tag: str):
        """[scale, zero point] of the input of the SOFTMAX that writes ``tag``."""
        return self.params_of(self.SOFTMAXES[tag])

    def quantize_point(self, tag: str, x):
        if tag in self.CONSTANTS:
            self.constant_params[tag] = constant_params(x)
        quantized = self.quantized_point(tag, x)
        self.operands[tag] = quantized
        return quantized

    def quantized_point(self, tag: str, x):
        if self.constant or (tag in self.FLOAT_WHEN_MIXED and float_while_exporting(self.FLOAT_WHEN_MIXED[tag])):
            return x
        if tag in self.CONSTANTS:
            return fake_quant_constant(x)
        if tag in self.KERNELS:
            return round_kernel_to_grid(x, self.KERNELS[tag])
        tail_tags = [t for t, _, _ in self.IDENTITY_TAIL]
        if tag in tail_tags:
            return self.unless_identity_follows(self.IDENTITY_TAIL[tail_tags.index(tag):], x)
        return self.quantizer(tag)(x, **(self.kernel_arithmetic(tag) or {}))

    def matmul(self, tag, a, b):
        """On the int8 levels, as :class:`IntegerAccumulation` computes
        convolutions: the BATCH_MATMUL's int32 accumulator exactly (a
        float32 product of the dequantized operands of an attention layer
        misses it by a step now and then)."""
        operands = self.OUTPUT_MATMUL if tag is None else self.MATMULS.get(tag)
        params = None if operands is None or self.constant or not kernel_arithmetic_applies(self.training_call) \
            else [self.params_of(s) for s in operands]
        if params is None or any(p is None for p in params):
            return super().matmul(tag, a, b)
        lhs_scale, rhs_scale = part(params[0], 0), part(params[1], 0)
        return super().matmul(tag, on_levels(a, lhs_scale), on_levels(b, rhs_scale)) * (lhs_scale * rhs_scale)

    def kernel_arithmetic(self, tag: str) -> dict | None:
        """The quantizer arguments with which op output ``tag`` is rounded
        as LiteRT's kernel computes it; None where the op has no such rule
        or an operand is not an int8 tensor, and where the arithmetic does
        not apply (see :func:`kernel_arithmetic_applies`)."""
        if not kernel_arithmetic_applies(self.training_call):
            return None
        operands = self.MATMULS.get(tag)
        if operands is not None:
            return {"lhs": self.params_of(operands[0]), "rhs": self.params_of(operands[1])}
        if tag in self.SUMS:
            return self.sum_of(*self.SUMS[tag])
        if tag in self.MEANS:
            return self.mean_of(*self.MEANS[tag])
        if tag in self.PRODUCTS:
            return self.product_of(*self.PRODUCTS[tag])
        if tag in self.SOFTMAXES and tag in self.softmax_logits:
            params = self.softmax_logit_params(tag)
            return None if params is None else {"logits": self.softmax_logits[tag], "logit_params": params}
        arguments = self.dense_output(tag) if tag in self.DENSE_OUTPUTS else None
        return arguments if arguments is not None and arguments["input_params"] is not None else None

    def unless_identity_follows(self, tail, x):
        """``x`` quantized at the first tag of ``tail``, or as it is where
        every op of ``tail`` is an identity (see ``IDENTITY_TAIL``)."""
        def identity(weight, value):
            return ops.all(ops.equal(fake_quant_constant(getattr(self, weight)), value))

        tag = tail[0][0]
        quantized = self.quantizer(tag)(x, **(self.kernel_arithmetic(tag) or {}))
        if is_exporting():  # the converter sees the weights as constants: decide while tracing
            import tensorflow as tf

            with tf.init_scope():
                return x if all(bool(identity(w, v)) for _, w, v in tail) else quantized
        folded = identity(*tail[0][1:])
        for _, weight, value in tail[1:]:
            folded = ops.logical_and(folded, identity(weight, value))
        return ops.where(folded, x, quantized)

    def quantizer(self, tag: str):
        return getattr(self, self.quantizer_name(tag, self.site))

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "sites": self.sites}


def unquantized(tag: str, x):
    """The ``quantize_point`` of a float layer, for a layer's exact path."""
    return x


def with_gradient_of(exact, quantized):
    """``quantized`` forward, the gradient of ``exact`` backward: a
    straight-through estimator over a whole chain of ops, for layers whose
    rounded chain has gradients that explode (an RSQRT or EXP evaluated at
    rounded, near-zero operands)."""
    return exact + ops.stop_gradient(quantized - exact)


def own_weights(layer) -> list:
    """``layer``'s weights without those of its quantizers."""
    quantizer_weights = {id(w) for sub in layer._flatten_layers() if isinstance(sub, ActivationQuantizer)
                         for w in sub.weights}
    return [w for w in layer.weights if id(w) not in quantizer_weights]


def copy_weights(source: list, target: list, name: str) -> None:
    if [tuple(w.shape) for w in source] != [tuple(w.shape) for w in target]:
        raise EdgevitError(f"The quantization-aware form of layer {name!r} does not hold its weights.")
    for src, dst in zip(source, target):
        dst.assign(src)
