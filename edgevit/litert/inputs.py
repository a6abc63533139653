"""What to run a .tflite file on when checking it on other kernels (the GPU
accelerator, the Arm64 build): held-out sample photos preprocessed as the
file's embedded metadata says; photos in [0, 1] for an image input without
metadata; seeded random values for any other input."""
from __future__ import annotations

import numpy as np

from edgevit.litert.flatbuffer import read
from edgevit.litert.metadata import read_embedded


def inputs_for_file(content: bytes, count: int) -> tuple[np.ndarray, str]:
    """(float inputs [count, ...], what they are)."""
    from edgevit.data import sample_photos
    from edgevit.registry import Preprocessing

    graph = read(content)
    shape = graph.tensors[graph.inputs[0]].shape
    preprocessing = (read_embedded(content) or {}).get("preprocessing")
    if preprocessing:
        pre = Preprocessing(preprocessing["input_size"], preprocessing["resize_size"],
                            preprocessing["interpolation"], tuple(preprocessing["mean"]), tuple(preprocessing["std"]))
        return (sample_photos.sample_batch(pre, count, held_out=True),
                f"{count} held-out sample photos, preprocessed as the file's metadata says")
    if len(shape) == 4 and shape[0] == 1 and shape[1] == shape[2] and shape[3] == 3:
        pre = Preprocessing(shape[1], shape[1])
        return (sample_photos.sample_batch(pre, count, held_out=True),
                f"{count} held-out sample photos in [0, 1] (the file has no edgevit metadata)")
    inputs = np.random.default_rng(0).normal(size=(count, *shape[1:])).astype(np.float32)
    return inputs, f"{count} random inputs (the input {list(shape)} is not an image)"
