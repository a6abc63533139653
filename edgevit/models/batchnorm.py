"""BatchNorm statistics re-estimated on real images.

A randomly initialised network has BatchNorm moving statistics (0, 1) that do
not describe its activations; under int8 the activations of such a model can
shrink towards zero and the output goes constant. Re-estimating the
statistics on real images gives realistic activation ranges without training.
"""
from __future__ import annotations

import numpy as np


def recalibrate_batchnorm(model, images: np.ndarray, batch_size: int = 32) -> int:
    """Set every BatchNormalization layer's moving mean/variance to the
    statistics of its inputs over ``images``; returns how many layers changed.

    Runs in training mode with momentum 0 so each layer takes the statistics
    of the batch, with dropout switched off so later layers see inference-like
    inputs. Statistics of several batches are averaged.
    """
    import keras

    norms = [layer for layer in _all_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]
    if not norms:
        return 0
    dropouts = [layer for layer in _all_layers(model) if isinstance(layer, keras.layers.Dropout)]
    saved_rates = [layer.rate for layer in dropouts]
    saved_momentum = [layer.momentum for layer in norms]
    sums = [[np.zeros(layer.moving_mean.shape), np.zeros(layer.moving_variance.shape)] for layer in norms]
    batches = [images[i:i + batch_size] for i in range(0, len(images), batch_size)]
    try:
        for layer in dropouts:
            layer.rate = 0.0
        for layer in norms:
            layer.momentum = 0.0
        for batch in batches:
            model(batch, training=True)
            for acc, layer in zip(sums, norms):
                acc[0] += np.asarray(layer.moving_mean)
                acc[1] += np.asarray(layer.moving_variance)
    finally:
        for layer, rate in zip(dropouts, saved_rates):
            layer.rate = rate
        for layer, momentum in zip(norms, saved_momentum):
            layer.momentum = momentum
    for (mean, var), layer in zip(sums, norms):
        layer.moving_mean.assign(mean / len(batches))
        layer.moving_variance.assign(var / len(batches))
    return len(norms)


def _all_layers(model):
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers"):
            yield from _all_layers(layer)
