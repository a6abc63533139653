"""What an image is paired with in a stream, and how a batch holds it: a
class label (:class:`Labels`), a segmentation mask (:class:`Masks`) or
boxes (:class:`Boxes`).

The input pipeline (:mod:`edgevit.data.stream`) asks a stream's targets
for the target of an image (what the transforms place with it), for the
target of an empty place, and how a batch of them is typed and shaped; it
knows nothing else of the task.
"""
from __future__ import annotations

import numpy as np

from edgevit.data.boxes import MAX_BOXES, BoxSplit, ImageBoxes
from edgevit.data.folders import Split
from edgevit.data.masks import IGNORE_INDEX, MaskFile, MaskSplit


class Labels:
    """A class index an image: a batch holds ``[N]`` int64."""
    label_only = True        # nothing but a number travels with the image (its decoder may scale it)
    dtype = np.int64

    def __init__(self, labels):
        self.values = np.asarray(labels, np.int64)

    def __getitem__(self, index: int):
        return self.values[index]

    def subset(self, indices) -> Labels:
        return Labels(self.values[np.asarray(indices, np.int64)])

    def empty(self, size: int):
        return np.int64(0)

    @staticmethod
    def batch_shape(size):
        return [None]


class Masks:
    """A mask file an image (:class:`~edgevit.data.masks.MaskFile`): a
    batch holds ``[N, size, size]`` uint8 class indices, 255 where no class
    counts (an empty place counts nowhere)."""
    label_only = False
    dtype = np.uint8

    def __init__(self, paths: list[str], classes: int):
        self.paths, self.classes = list(paths), classes

    def __getitem__(self, index: int) -> MaskFile:
        return MaskFile(self.paths[index], self.classes)

    def subset(self, indices) -> Masks:
        return Masks([self.paths[i] for i in indices], self.classes)

    def empty(self, size: int) -> np.ndarray:
        return np.full((size, size), IGNORE_INDEX, np.uint8)

    @staticmethod
    def batch_shape(size):
        return [None, size, size]


class Boxes:
    """An image's boxes (:class:`~edgevit.data.boxes.ImageBoxes`): a batch
    holds ``[N, MAX_BOXES, 5]`` float32, a row a box placed with its image
    (:func:`~edgevit.data.boxes.batch_boxes`), class 0 where none is."""
    label_only = False
    dtype = np.float32

    def __init__(self, split: BoxSplit):
        self.split = split

    def __getitem__(self, index: int) -> ImageBoxes:
        return self.split.boxes_of(index)

    def subset(self, indices) -> Boxes:
        indices = np.asarray(indices, np.int64)
        rows = [np.arange(self.split.starts[i], self.split.starts[i + 1]) for i in indices]
        taken = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        starts = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        return Boxes(BoxSplit([self.split.files[i] for i in indices], self.split.corners[taken],
                              self.split.box_classes[taken], starts, self.split.classes))

    def empty(self, size: int) -> np.ndarray:
        return np.zeros((MAX_BOXES, 5), np.float32)

    @staticmethod
    def batch_shape(size):
        return [None, MAX_BOXES, 5]


def targets_of(split: Split | MaskSplit | BoxSplit) -> Labels | Masks | Boxes:
    if isinstance(split, BoxSplit):
        return Boxes(split)
    if isinstance(split, MaskSplit):
        return Masks(split.masks, split.classes)
    return Labels(split.labels)
