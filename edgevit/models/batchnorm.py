"""BatchNorm statistics re-estimated on real images.

A randomly initialised network has BatchNorm moving statistics (0, 1) that do
not describe its activations; under int8 the activations of such a model can
shrink towards zero and the output goes constant. Re-estimating the
statistics on real images gives realistic activation ranges without training.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgevit.data.images import batches


# Images per forward pass. Statistics are pooled over all batches, so the
# batch sets only the memory the pass needs, which TensorFlow then keeps for
# the whole process: for mobilevit_v3_xs at 256 px, 0.1 GB traced with 2
# images, 0.2 GB with 4, 5.6 GB eagerly with 32 (docs/profiling.md, Memory).
BATCH_SIZE = 2


def recalibrate_batchnorm(model, images, batch_size: int = BATCH_SIZE,
                          on_batch: Callable[[int], None] = lambda count: None) -> int:
    """Set every BatchNormalization layer's moving mean/variance to the
    statistics of its inputs over ``images`` (an array, or an
    :class:`~edgevit.data.images.ImageSet` read ``batch_size`` at a time);
    returns how many layers changed. ``on_batch(images in it)`` after each
    forward pass.

    Runs in training mode with momentum 0 so each layer takes the statistics
    of the batch, with dropout switched off so later layers see inference-like
    inputs. The per-batch means and mean squares are pooled into the
    statistics of the whole set, whatever the batch size.
    """
    import keras
    import tensorflow as tf

    norms = [layer for layer in _all_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]
    if not norms:
        return 0
    dropouts = [layer for layer in _all_layers(model) if isinstance(layer, keras.layers.Dropout)]
    saved_rates = [layer.rate for layer in dropouts]
    saved_momentum = [layer.momentum for layer in norms]
    means = [np.zeros(layer.moving_mean.shape) for layer in norms]
    squares = [np.zeros(layer.moving_variance.shape) for layer in norms]
    # one graph for every batch (a ragged last batch included): traced, the
    # pass reuses its buffers; eagerly each op allocates its own
    forward = tf.function(lambda batch: model(batch, training=True), reduce_retracing=True, autograph=False)
    try:
        for layer in dropouts:
            layer.rate = 0.0
        for layer in norms:
            layer.momentum = 0.0
        for batch in batches(images, batch_size):
            forward(tf.constant(batch))
            for mean, square, layer in zip(means, squares, norms):
                batch_mean = np.asarray(layer.moving_mean, np.float64)
                mean += batch_mean * len(batch)
                square += (np.asarray(layer.moving_variance, np.float64) + batch_mean ** 2) * len(batch)
            on_batch(len(batch))
    finally:
        for layer, rate in zip(dropouts, saved_rates):
            layer.rate = rate
        for layer, momentum in zip(norms, saved_momentum):
            layer.momentum = momentum
    for mean, square, layer in zip(means, squares, norms):
        mean /= len(images)
        layer.moving_mean.assign(mean)
        layer.moving_variance.assign(np.maximum(square / len(images) - mean ** 2, 0.0))
    return len(norms)


def _all_layers(model):
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers"):
            yield from _all_layers(layer)
