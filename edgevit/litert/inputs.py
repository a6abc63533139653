"""What to run a .tflite file on when checking it on other kernels (the GPU
accelerator, the Arm64 build): held-out sample photos preprocessed as the
file's embedded metadata says; photos in [0, 1] for an image input without
metadata; seeded random values for any other input. And the values a file's
input tensor takes for normalised model inputs: the same values, or, for a
file that takes the camera's bytes (``edgevit.litert.camera_input``), the
pixels they came from."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgevit.litert.flatbuffer import read
from edgevit.litert.metadata import (TAKES_NORMALISED, TAKES_RGB_BYTES, preprocessing_of, read_embedded, takes_of,
                                     task_of)


def file_inputs(content: bytes, inputs: np.ndarray, metadata: dict | None = None) -> np.ndarray:
    """The real values ``content``'s input takes for the normalised model
    ``inputs`` (float [N, H, W, C]): see :func:`file_input_values`."""
    return file_input_values(content, metadata)(inputs)


def file_input_values(content: bytes, metadata: dict | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """The function from normalised model inputs (float [N, H, W, C]) to the
    real values ``content``'s input takes: the inputs themselves; the pixels
    in [0, 1] they came from; or for a file that takes the camera's bytes,
    each pixel's byte in the input's quantization (so that quantizing them
    gives back the bytes). ``metadata``: the file's embedded edgevit
    metadata, read from ``content`` when not given. The file is read once,
    here, for every batch the function is applied to."""
    metadata = read_embedded(content) if metadata is None else metadata
    takes = takes_of(metadata)
    if takes == TAKES_NORMALISED:
        return lambda inputs: inputs
    pre = metadata["preprocessing"]
    mean, std = np.asarray(pre["mean"], np.float32), np.asarray(pre["std"], np.float32)
    if takes != TAKES_RGB_BYTES:
        return lambda inputs: (inputs * std + mean).astype(np.float32)
    graph = read(content)
    image = graph.tensors[graph.inputs[0]]

    def byte_values(inputs: np.ndarray) -> np.ndarray:
        pixels = np.clip(np.round((inputs * std + mean).astype(np.float32) * 255.0), 0, 255)
        return ((pixels - image.zero_point) * image.scale).astype(np.float32)

    return byte_values


def inputs_for_file(content: bytes, count: int) -> tuple[np.ndarray, str]:
    """(inputs [count, ...] in the values the file's input takes, what they
    are); metadata that contradicts the file is not used."""
    from edgevit.data import sample_photos
    from edgevit.litert.metadata_check import trusted_metadata
    from edgevit.registry import Preprocessing

    graph = read(content)
    shape = graph.tensors[graph.inputs[0]].shape
    metadata = trusted_metadata(content)
    if metadata:
        pre = preprocessing_of(metadata)
        photos = sample_photos.sample_batch(pre, count, held_out=True, task=task_of(metadata))
        return (file_inputs(content, photos, metadata),
                f"{count} held-out sample photos, preprocessed as the file's metadata says")
    if len(shape) == 4 and shape[0] == 1 and shape[1] == shape[2] and shape[3] == 3:
        pre = Preprocessing(shape[1], shape[1])
        return (sample_photos.sample_batch(pre, count, held_out=True),
                f"{count} held-out sample photos in [0, 1] (the file has no edgevit metadata to trust)")
    inputs = np.random.default_rng(0).normal(size=(count, *shape[1:])).astype(np.float32)
    return inputs, f"{count} random inputs (the input {list(shape)} is not an image)"
