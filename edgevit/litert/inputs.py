"""What to run a .tflite file on when checking it on other kernels (the GPU
accelerator, the Arm64 build): held-out sample photos preprocessed as the
file's embedded metadata says; photos in [0, 1] for an image input without
metadata; seeded random values for any other input. And the values a file's
input tensor takes for normalised model inputs: the same values, or, for a
file that takes the camera's bytes (``edgevit.litert.camera_input``), the
pixels they came from."""
from __future__ import annotations

import numpy as np

from edgevit.litert.flatbuffer import read
from edgevit.litert.metadata import TAKES_NORMALISED, TAKES_RGB_BYTES, read_embedded, takes_of


def file_inputs(content: bytes, inputs: np.ndarray, metadata: dict | None = None) -> np.ndarray:
    """The real values ``content``'s input takes for the normalised model
    ``inputs`` (float [N, H, W, C]): the inputs themselves; the pixels in
    [0, 1] they came from; or for a file that takes the camera's bytes, each
    pixel's byte in the input's quantization (so that quantizing them gives
    back the bytes). ``metadata``: the file's embedded edgevit metadata, read
    from ``content`` when not given."""
    metadata = read_embedded(content) if metadata is None else metadata
    takes = takes_of(metadata)
    if takes == TAKES_NORMALISED:
        return inputs
    pre = metadata["preprocessing"]
    unit = (inputs * np.asarray(pre["std"], np.float32) + np.asarray(pre["mean"], np.float32)).astype(np.float32)
    if takes != TAKES_RGB_BYTES:
        return unit
    pixels = np.clip(np.round(unit * 255.0), 0, 255)
    graph = read(content)
    image = graph.tensors[graph.inputs[0]]
    return ((pixels - image.zero_point) * image.scale).astype(np.float32)


def inputs_for_file(content: bytes, count: int) -> tuple[np.ndarray, str]:
    """(inputs [count, ...] in the values the file's input takes, what they are)."""
    from edgevit.data import sample_photos
    from edgevit.registry import Preprocessing

    graph = read(content)
    shape = graph.tensors[graph.inputs[0]].shape
    preprocessing = (read_embedded(content) or {}).get("preprocessing")
    if preprocessing:
        pre = Preprocessing(preprocessing["input_size"], preprocessing["resize_size"],
                            preprocessing["interpolation"], tuple(preprocessing["mean"]), tuple(preprocessing["std"]))
        return (file_inputs(content, sample_photos.sample_batch(pre, count, held_out=True)),
                f"{count} held-out sample photos, preprocessed as the file's metadata says")
    if len(shape) == 4 and shape[0] == 1 and shape[1] == shape[2] and shape[3] == 3:
        pre = Preprocessing(shape[1], shape[1])
        return (sample_photos.sample_batch(pre, count, held_out=True),
                f"{count} held-out sample photos in [0, 1] (the file has no edgevit metadata)")
    inputs = np.random.default_rng(0).normal(size=(count, *shape[1:])).astype(np.float32)
    return inputs, f"{count} random inputs (the input {list(shape)} is not an image)"
