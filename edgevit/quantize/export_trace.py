"""The traces of a QAT model: for the TFLite converter, and for training.

While the converter traces the model (:func:`exporting`), the quantizers
emit only the fake-quant ops whose ranges the converter turns into each
int8 tensor's scale and zero point, with those ranges as constants, and
none of the emulation of LiteRT's kernel arithmetic: the converter would
turn that emulation into ops of the file. Everything else in this package
asks this module whether such a trace is running.

In any other trace (a training step, an evaluation), a value that several
layers read (a quantizer's scale and zero point, a kernel's grid) is
computed once per graph and shared (:func:`traced_constant`): tracing
costs about half a millisecond of Python a graph node, and the copies were
most of a QAT graph's nodes.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref

import keras
import numpy as np

_EXPORTING = contextvars.ContextVar("edgevit_qat_exporting", default=None)
_FAKE_QUANT_ONLY = contextvars.ContextVar("edgevit_qat_fake_quant_only", default=False)
# graph -> {(thread, id(owner), what): (owner, value)}: the values computed once per graph (see
# traced_constant); the thread keeps the replicas of a distributed step, each traced in its own, apart
_GRAPH_VALUES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Export:
    """What one trace for the converter shares: the op kinds left in float,
    and each quantizer's [lo, hi] and [scale, zero point], read from its
    variables once and written into the graph as constants (the converter
    would fold the ops computing them anyway; tracing them costs more than
    the rest of the model)."""

    def __init__(self, float_ops, fake_quant: bool):
        self.float_ops = frozenset(float_ops)
        self.fake_quant = fake_quant
        self.constants: dict[tuple[int, str], object] = {}

    def constant(self, owner, what: str, compute):
        key = (id(owner), what)
        if key not in self.constants:
            import tensorflow as tf

            with tf.init_scope():
                self.constants[key] = tf.nest.map_structure(lambda v: np.asarray(v, np.float32), compute())
        return self.constants[key]


@contextlib.contextmanager
def exporting(float_ops: tuple[str, ...] = (), fake_quant: bool = True):
    """While a QAT model is traced for the TFLite converter: quantizers emit
    only the fake-quant ops the converter reads ranges from, with constant
    ranges and without the emulation of LiteRT's kernel arithmetic (which
    would convert to ops). The outputs of ``float_ops`` ("BATCH_MATMUL",
    "SOFTMAX") get no range: the converter leaves those ops in float
    (``--int8-mixed``). Without ``fake_quant`` the model computes in float
    with its trained weights as they are (a float file of a QAT model)."""
    token = _EXPORTING.set(_Export(float_ops, fake_quant))
    try:
        yield
    finally:
        _EXPORTING.reset(token)


@contextlib.contextmanager
def fake_quant_only():
    """While a model is called or traced inside, its QAT layers use the
    fake-quant ops alone, without LiteRT's kernel arithmetic: range
    calibration (whose quantizers observe float layers) and a training
    run's evaluations (see :func:`kernel_arithmetic_applies`)."""
    token = _FAKE_QUANT_ONLY.set(True)
    try:
        yield
    finally:
        _FAKE_QUANT_ONLY.reset(token)


def kernel_arithmetic_applies(training) -> bool:
    """Whether the layers compute LiteRT's int8 kernel arithmetic now (see
    :mod:`edgevit.quantize.kernel_arithmetic`): at inference, where the QAT
    model and the int8 file agree value for value; not in a training step
    (it has no gradient, and tracing it was most of a step's cost), inside
    :func:`fake_quant_only`, or while the converter traces the model."""
    return not (training or is_exporting() or _FAKE_QUANT_ONLY.get())


def is_exporting() -> bool:
    return _EXPORTING.get() is not None


def float_while_exporting(op: str) -> bool:
    return is_exporting() and op in _EXPORTING.get().float_ops


def without_fake_quant() -> bool:
    return is_exporting() and not _EXPORTING.get().fake_quant


def traced_constant(owner, what: str, compute):
    """``compute()``: a constant while exporting (see :class:`_Export`);
    in any other graph, computed on the first call for ``owner`` and
    ``what`` and shared by the later ones (``what`` must name everything
    the value depends on besides the graph's variables as they are when it
    is first read); eagerly, computed on every call."""
    export = _EXPORTING.get()
    if export is not None:
        return export.constant(owner, what, compute)
    import tensorflow as tf

    if tf.executing_eagerly():
        return compute()
    values = _GRAPH_VALUES.setdefault(tf.compat.v1.get_default_graph(), {})
    key = (threading.get_ident(), id(owner), what)
    if key not in values:
        values[key] = (owner, compute())  # the owner held: its id names no other object while the graph lives
    return values[key][1]


def traced_weight_constant(value, what: str, compute):
    """``compute()`` from ``value``, a weight variable or a tensor: see
    :func:`traced_constant` (a tensor computed in the traced graph is no
    constant while exporting, but is shared in any other graph)."""
    if isinstance(value, keras.Variable) or not is_exporting():
        return traced_constant(value, what, compute)
    return compute()
