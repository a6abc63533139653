"""Inputs of the cvnets SSDLite references (tests/data/cvnets_<variant>.npz):
the official model ran once outside the project on these and on
:func:`tests.official_checkpoints.seeded_tensor` weights, and only its
tensor names and shapes and its outputs are kept."""
from __future__ import annotations

import numpy as np

CLASSES = 5  # few classes keep the stored outputs small
SEED = 55
# variant -> input size. v1-XXS at 192 (levels of 12, 6, 3, 2, 1 and the
# pooled 1: 1168 anchors), not 128: there its layer 3 has 64 patches of 64
# channels, and cvnets' LayerNorm then takes the patch axis for the channel
# axis (cvnets/layers/normalization/layer_norm.py guesses channel-first).
SIZES = {"ssdlite_mobilevit_v1_xxs": 192, "ssdlite_mobilevit_v2_050": 128}


def random_image(size: int) -> np.ndarray:
    """[1, 3, size, size] in [0, 1] (NCHW, as cvnets takes it)."""
    return np.random.default_rng(SEED + 1).uniform(0, 1, (1, 3, size, size)).astype(np.float32)
