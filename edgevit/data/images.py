"""Sets of model inputs read from image files, a batch at a time: the
calibration and validation images of `edgevit convert` and the sample photos.

Files are listed by :mod:`edgevit.data.listing`, opened by
:mod:`edgevit.data.decode` and placed and normalised by the evaluation
transform of :mod:`edgevit.data.transforms`: the same pixels ``edgevit eval``
and validation during training read. Files that cannot be read are skipped
and counted by reason, never a traceback.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from edgevit.data.decode import UnreadableImage, UnreadableTally, open_rgb
from edgevit.data.transforms import CLASSIFICATION, deployment_pixels, normalise
from edgevit.errors import EdgevitError
from edgevit.registry import Preprocessing


def to_model_input(img: Image.Image, pre: Preprocessing) -> np.ndarray:
    """An RGB image already at input size -> float32 [H, W, 3] model input."""
    return normalise(np.asarray(img), pre)


def read_pixels(paths, pre: Preprocessing, task: str = CLASSIFICATION):
    """For each of ``paths``, lazily and in order: the uint8 pixels a file
    of ``task`` sees for it (:func:`deployment_pixels`), or the
    :class:`UnreadableImage` saying why the file cannot be read."""
    for path in paths:
        try:
            img = open_rgb(path)
        except UnreadableImage as err:
            yield err
            continue
        yield deployment_pixels(img, pre, task)


class ImageSet:
    """Model inputs made when they are read: ``images[i:j]`` opens and
    preprocesses those images then, as a float32 [j - i, H, W, 3] array, and
    nothing keeps them, so a stage that reads a batch at a time holds one
    batch whatever the set's size. ``items`` say which images (file paths,
    views of photos), ``read`` makes the inputs of a list of them."""

    def __init__(self, items: list, read: Callable[[list], np.ndarray]):
        self.items, self._read = list(items), read

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int | slice) -> np.ndarray:
        if isinstance(index, slice):
            return self._read(self.items[index])
        return self._read([self.items[index]])[0]

    def __iter__(self):
        for batch in batches(self, READ_BATCH):
            yield from batch

    def map(self, function: Callable[[np.ndarray], np.ndarray]) -> ImageSet:
        """These images, each batch passed through ``function`` when read."""
        return ImageSet(self.items, lambda items: function(self._read(items)))


# Images an ImageSet opens together when iterated one by one.
READ_BATCH = 8


def batches(images, size: int):
    """``images`` (an array or an :class:`ImageSet`), ``size`` at a time."""
    for start in range(0, len(images), size):
        yield images[start:start + size]


def readable_images(paths, limit: int | None = None) -> list[Path]:
    """The first ``limit`` of ``paths`` that open as images; unreadable files
    are skipped with one warning that counts them by reason."""
    paths = [Path(p) for p in paths]
    used, skipped = [], UnreadableTally()
    for path in paths if limit is None or limit > 0 else []:
        try:
            open_rgb(path)
        except UnreadableImage as err:
            skipped.add(err)
            continue
        used.append(path)
        if limit is not None and len(used) >= limit:
            break  # files beyond the limit are neither read nor counted as unreadable
    if not used:
        raise EdgevitError(f"None of the {len(paths)} images could be read"
                           + (f": {skipped.summary()}." if skipped else "."))
    if skipped:
        warnings.warn(skipped.summary(), stacklevel=2)
    return used


def image_set(paths, pre: Preprocessing, limit: int | None = None, task: str = CLASSIFICATION) -> ImageSet:
    """The first ``limit`` readable images of ``paths`` (see
    :func:`readable_images`), each read with ``pre`` when a batch of them is,
    placed as a file of ``task`` sees it."""
    def read(batch_paths: list[Path]) -> np.ndarray:
        inputs = np.empty((len(batch_paths), pre.input_size, pre.input_size, 3), np.float32)
        for row, (path, pixels) in enumerate(zip(batch_paths, read_pixels(batch_paths, pre, task))):
            if isinstance(pixels, UnreadableImage):
                raise EdgevitError(f"{path} could be read before and not now ({pixels.reason}): "
                                   "was it changed or removed during the run?")
            inputs[row] = normalise(pixels, pre)
        return inputs

    return ImageSet(readable_images(paths, limit), read)


def load_images(paths, pre: Preprocessing, limit: int | None = None) -> tuple[np.ndarray, list[Path]]:
    """Up to ``limit`` readable images as one [N, H, W, 3] array (see
    :func:`image_set`), and their paths."""
    images = image_set(paths, pre, limit)
    return images[:], images.items
