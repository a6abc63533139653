"""The trace of a QAT model for the TFLite converter.

While the converter traces the model (:func:`exporting`), the quantizers
emit only the fake-quant ops whose ranges the converter turns into each
int8 tensor's scale and zero point, with those ranges as constants, and
none of the emulation of LiteRT's kernel arithmetic: the converter would
turn that emulation into ops of the file. Everything else in this package
asks this module whether such a trace is running.
"""
from __future__ import annotations

import contextlib
import contextvars

import keras
import numpy as np

_EXPORTING = contextvars.ContextVar("edgevit_qat_exporting", default=None)


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


def is_exporting() -> bool:
    return _EXPORTING.get() is not None


def float_while_exporting(op: str) -> bool:
    return is_exporting() and op in _EXPORTING.get().float_ops


def without_fake_quant() -> bool:
    return is_exporting() and not _EXPORTING.get().fake_quant


def traced_constant(owner, what: str, compute):
    """``compute()``, as a constant while exporting (see :class:`_Export`)."""
    export = _EXPORTING.get()
    return compute() if export is None else export.constant(owner, what, compute)


def traced_weight_constant(value, what: str, compute):
    """``compute()``, as a constant while exporting when ``value`` is a
    weight variable (not a tensor computed in the traced graph)."""
    return traced_constant(value, what, compute) if isinstance(value, keras.Variable) else compute()
