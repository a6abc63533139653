"""Seeded random weights and inputs of the cvnets SSDLite references
(tests/data/<variant>_cvnets.npz): the official model ran once on them
outside the project, and only its tensor names and shapes and its outputs
are kept. numpy only: the reference scripts import this file."""
from __future__ import annotations

import numpy as np

CLASSES = 5  # few classes keep the stored outputs small
SEED = 55
# variant -> input size. v1-XXS at 192 (levels of 12, 6, 3, 2, 1 and the
# pooled 1: 1168 anchors), not 128: there its layer 3 has 64 patches of 64
# channels, and cvnets' LayerNorm then takes the patch axis for the channel
# axis (cvnets/layers/normalization/layer_norm.py guesses channel-first).
SIZES = {"ssdlite_mobilevit_v1_xxs": 192, "ssdlite_mobilevit_v2_050": 128}


def random_state_dict(shapes: dict[str, tuple]) -> dict[str, np.ndarray]:
    """Weights scaled so activations stay O(1) through the network: kernels
    ~ N(0, 1 / fan_in), norm scales near 1, biases and means near 0,
    variances in [0.5, 1.5]; drawn in sorted-name order."""
    rng = np.random.default_rng(SEED)
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("running_var"):
            value = rng.uniform(0.5, 1.5, shape)
        elif len(shape) >= 2:
            value = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
        elif name.endswith("weight"):
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        else:  # biases, running means
            value = 0.1 * rng.standard_normal(shape)
        out[name] = value.astype(np.float32)
    return out


def random_image(size: int) -> np.ndarray:
    """[1, 3, size, size] in [0, 1] (NCHW, as cvnets takes it)."""
    return np.random.default_rng(SEED + 1).uniform(0, 1, (1, 3, size, size)).astype(np.float32)
