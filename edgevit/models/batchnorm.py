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

    norms = [l for l in _all_layers(model) if isinstance(l, keras.layers.BatchNormalization)]
    if not norms:
        return 0
    dropouts = [l for l in _all_layers(model) if isinstance(l, keras.layers.Dropout)]
    saved_rates = [l.rate for l in dropouts]
    saved_momentum = [l.momentum for l in norms]
    sums = [[np.zeros(l.moving_mean.shape), np.zeros(l.moving_variance.shape)] for l in norms]
    batches = [images[i:i + batch_size] for i in range(0, len(images), batch_size)]
    try:
        for l in dropouts:
            l.rate = 0.0
        for l in norms:
            l.momentum = 0.0
        for batch in batches:
            model(batch, training=True)
            for acc, l in zip(sums, norms):
                acc[0] += np.asarray(l.moving_mean)
                acc[1] += np.asarray(l.moving_variance)
    finally:
        for l, rate in zip(dropouts, saved_rates):
            l.rate = rate
        for l, momentum in zip(norms, saved_momentum):
            l.momentum = momentum
    for (mean, var), l in zip(sums, norms):
        l.moving_mean.assign(mean / len(batches))
        l.moving_variance.assign(var / len(batches))
    return len(norms)


def _all_layers(model):
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers"):
            yield from _all_layers(layer)
