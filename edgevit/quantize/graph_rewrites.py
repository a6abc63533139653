"""A QAT model's graphs run as traced, without TF's graph optimizer.

Grappler rewrites a function graph the first time it runs. A QAT graph has
tens of thousands of nodes, and rewriting them costs more than it gains.
Measured on mobilevit_v3_xxs at 128 px, 2-core host, batches of 32:

- the inference graph: its first call took 28 to 45 s with Grappler and
  11 s without; a batch then ran in 0.76 and 0.79 s; outputs bit-identical;
- the training step: its first call took 17 s with Grappler and 7 s
  without; a step then ran in 0.70 and 0.68 s (the mean of four
  alternating runs of 8 steps each: within their spread).

A float model keeps Grappler: its graphs are small (it added 4 s to the
first call of the float mobilevit_v3_xxs's training step), and its steady
speed was not measured here.

The option is part of the config a function is instantiated with, so every
call of one of these functions must run with it (:func:`without_grappler`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable


@contextlib.contextmanager
def grappler_off():
    """Functions first called inside are instantiated without Grappler."""
    import tensorflow as tf

    before = tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False)
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": before})


def without_grappler(function: Callable) -> Callable:
    """``function`` (a tf.function) called with Grappler off, every time:
    called with another config, TF would instantiate it again."""

    def call(*args, **kwargs):
        with grappler_off():
            return function(*args, **kwargs)

    call.graph_function = function  # the tf.function itself
    return call


def for_model(model, function: Callable) -> Callable:
    """``function``, a graph of ``model``, run as :func:`without_grappler`
    where ``model`` is a QAT model, else as it is."""
    from edgevit.quantize.qat import is_qat_model

    return without_grappler(function) if is_qat_model(model) else function
