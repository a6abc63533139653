"""The input pipeline of `edgevit finetune`, `edgevit qat` and `edgevit eval`:
tf.data over a file list, so that memory does not grow with the number of
images and reading overlaps the step.

batch of file indices -> for each, read and decode -> stored square ->
random resized crop and mirror (training) or center crop (evaluation), a
batch per call, one call per core in parallel -> drop unreadable images ->
normalise -> prefetch.

The decoding and resizing are Pillow's (:mod:`edgevit.train.data`), called
through ``tf.numpy_function``: the pixels are exactly those of the
preprocessing the exported files describe and `edgevit convert --calib`
uses, which TensorFlow's own JPEG decoder and resize do not reproduce. Pillow
releases the GIL while it decodes and resamples, so the parallel calls run
on several cores. A call makes a whole batch: per image, tf.data's own work
around a call (its ops, the call, the batching) took as long as a third of
the image, and the pipeline ran 1.24-1.39x the single-thread rate on 2
cores where two plain threads ran 2.1x.

An epoch is a :class:`EpochPlan`: the resolution and global batch of each
step. The images of an epoch are a permutation of the file list computed
where each is needed (``index_shuffle``: no list of the order is held), and
the crop of each image is drawn from a counter-based generator keyed by the
epoch and its position, so a run resumed at an epoch, or spread over
several workers, reads the same images with the same crops. Worker ``w``'s
pipeline reads only the images of its own replicas.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from edgevit.data.images import UnreadableImage
from edgevit.registry import Preprocessing
from edgevit.train.data import SkipTally, Split, crop_box, evaluation_crop, stored_square, training_crop

EVAL_BATCH = 32
# Other images tried in a training batch for one that cannot be read, before its place is left empty.
SUBSTITUTES = 16


def parallel_calls() -> int:
    """Images read at once: one per core this process may use. AUTOTUNE ran
    more, which then wait for Python's interpreter lock between Pillow's
    calls (2-core host, busy: 81 images/s at 256 px, 178 with 2 calls)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def scaled_batch_size(base_batch: int, base_size: int, size: int) -> int:
    """Batch size at ``size`` keeping about ``base_batch * base_size**2`` pixels."""
    return max(1, int(round(base_batch * (base_size / size) ** 2)))


@dataclass
class EpochPlan:
    """Step ``t`` trains at ``sizes[t]`` px on ``counts[t]`` images from
    position ``offsets[t]`` of the epoch's image order, shared equally by
    the ``replicas`` (a last, smaller step as evenly as it can)."""
    sizes: np.ndarray
    counts: np.ndarray
    replicas: int = 1

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.sizes)


def plan_epoch(samples: int, batch_size: int, replicas: int, base_size: int, sizes: list[int],
               rng: np.random.Generator, steps: int | None = None) -> EpochPlan:
    """One epoch: every image once (the last batch smaller), or ``steps``
    full batches. With multi-scale ``sizes``, each step draws a resolution
    and scales its batch by ``(base_size / size) ** 2``. ``batch_size`` is the
    global batch at ``base_size``, shared by ``replicas`` equally; a last
    batch of fewer images than replicas is left out (a replica without
    images cannot run the model: TensorFlow's CPU convolution returns an
    empty batch unchanged), and those images come in another epoch's order."""
    per_replica_base = batch_size // replicas
    step_sizes, counts, position = [], [], 0
    while (samples - position >= replicas) if steps is None else (len(counts) < steps):
        size = int(rng.choice(sizes)) if sizes else base_size
        per = scaled_batch_size(per_replica_base, base_size, size)
        count = per * replicas if steps is not None else min(per * replicas, samples - position)
        step_sizes.append(size)
        counts.append(count)
        position += count
    return EpochPlan(np.asarray(step_sizes, np.int64), np.asarray(counts, np.int64), replicas)


class ImageStream:
    """The images of a split, made when the pipeline reads them, from
    ``side``-pixel stored squares (see :mod:`edgevit.train.data`).
    Unreadable files are counted in ``tally`` (shared by the streams of a run)."""

    def __init__(self, split: Split, pre: Preprocessing, side: int, tally: SkipTally | None = None):
        self.files, self.labels = split.files, np.asarray(split.labels, np.int64)
        self.pre, self.side = pre, side
        self.tally = tally if tally is not None else SkipTally()

    def __len__(self) -> int:
        return len(self.files)

    def subset(self, indices) -> ImageStream:
        return ImageStream(Split([self.files[i] for i in indices], self.labels[np.asarray(indices, np.int64)]),
                           self.pre, self.side, self.tally)

    # -- a batch, in a pipeline thread -----------------------------------------------------------
    def _square(self, index: int):
        try:
            return stored_square(self.files[index], self.side, self.pre.interpolation)
        except UnreadableImage as err:
            self.tally.add(err)
            return None

    def _training_pixels(self, index, draws, size):
        index, size = int(index), int(size)
        # an unreadable image's place goes to another one, far off in the file list (another class folder)
        stride = max(1, int(len(self.files) * 0.618)) | 1
        for candidate in range(SUBSTITUTES + 1):
            square = self._square((index + candidate * stride) % len(self.files))
            if square is not None:
                index = (index + candidate * stride) % len(self.files)
                break
        else:
            return np.zeros((size, size, 3), np.uint8), self.labels[index], False
        crop, x0, y0 = crop_box(self.side, draws)
        return training_crop(square, crop, x0, y0, size, bool(draws[3] < 0.5)), self.labels[index], True

    def _evaluation_pixels(self, index, size):
        index, size = int(index), int(size)
        square = self._square(index) if index >= 0 else None  # -1: a place padding a shard
        if square is None:
            return np.zeros((size, size, 3), np.uint8), np.int64(0), False
        return evaluation_crop(square, self.pre, size), self.labels[index], True

    def _training_batch(self, indices, draws, size):
        return _stacked([self._training_pixels(index, draw, size) for index, draw in zip(indices, draws)], size)

    def _evaluation_batch(self, indices, size):
        return _stacked([self._evaluation_pixels(index, size) for index in indices], size)

    # -- datasets ---------------------------------------------------------------------------------
    def training_dataset(self, plan: EpochPlan, epoch_seed: int, pipeline: int = 0, local_replicas: int = 1):
        """The batches of ``plan`` that the ``local_replicas`` replicas of
        input pipeline ``pipeline`` train on, in the order they take them."""
        import tensorflow as tf

        starts, counts, sizes = [], [], []
        replicas = plan.replicas
        for offset, count, size in zip(plan.offsets, plan.counts, plan.sizes):
            for replica in range(pipeline * local_replicas, (pipeline + 1) * local_replicas):
                first, end = (count * replica) // replicas, (count * (replica + 1)) // replicas
                starts.append(offset + first)
                counts.append(end - first)
                sizes.append(size)
        samples = len(self.files)

        def image_draws(position):
            order = tf.stack([tf.constant(epoch_seed, tf.int64), position // samples])  # a permutation per pass
            return (tf.random.experimental.index_shuffle(position % samples, order, samples - 1),
                    crop_draws(epoch_seed, position))

        def batch(start, count, size):
            indices, draws = tf.map_fn(image_draws, start + tf.range(count),
                                       fn_output_signature=(tf.int64, tf.float64))
            return _batch_outputs(tf.numpy_function(self._training_batch, [indices, draws, size],
                                                    [tf.uint8, tf.int64, tf.bool], stateful=False))

        ds = tf.data.Dataset.from_tensor_slices((np.asarray(starts, np.int64), np.asarray(counts, np.int64),
                                                 np.asarray(sizes, np.int64)))
        return self._finished(ds.map(batch, num_parallel_calls=parallel_calls()), normalise=False)

    def evaluation_dataset(self, size: int, batch_size: int = EVAL_BATCH, pipelines: int = 1, pipeline: int = 0,
                           length: int | None = None, kept: bool = True):
        """Every image (of input pipeline ``pipeline``'s shard), center-cropped
        at ``size``, in batches of ``batch_size``; ``length``: the shard padded
        to that many images with empty places. ``kept``: unreadable images and
        empty places left out of the batches; else batches keep their size
        and come with whether each image is one: (inputs, labels, real)."""
        import tensorflow as tf

        def batch(indices):
            return _batch_outputs(tf.numpy_function(self._evaluation_batch, [indices, size],
                                                    [tf.uint8, tf.int64, tf.bool], stateful=False), size)

        ds = tf.data.Dataset.range(len(self.files)).shard(pipelines, pipeline)
        if length is not None:
            ds = ds.concatenate(tf.data.Dataset.from_tensors(tf.constant(-1, tf.int64)).repeat(
                length - len(range(pipeline, len(self.files), pipelines))))
        return self._finished(ds.batch(batch_size).map(batch, num_parallel_calls=parallel_calls()), kept)

    def _finished(self, ds, kept: bool = True, normalise: bool = True):
        """Unreadable images out (``kept``), pixels normalised (else left
        uint8 for the consumer to normalise: :meth:`normalised`), batches
        prefetched."""
        import tensorflow as tf

        def only_kept(pixels, labels, ok):
            pixels = tf.ensure_shape(tf.boolean_mask(pixels, ok), [None, None, None, 3])
            return (self.normalised(pixels) if normalise else pixels), tf.boolean_mask(labels, ok)

        def all_places(pixels, labels, ok):
            return self.normalised(pixels), labels, ok

        return ds.map(only_kept if kept else all_places, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
            tf.data.AUTOTUNE)

    def normalised(self, pixels):
        """uint8 pixels as the model's input. Training batches leave the
        pipeline as uint8 and the training step normalises them: on 2 cores
        the float normalisation of each batch (4 ops over 4 bytes a value) in
        the pipeline cut its rate from 1.62x one thread's to 1.16x."""
        import tensorflow as tf

        mean, std = np.asarray(self.pre.mean, np.float32), np.asarray(self.pre.std, np.float32)
        return (tf.cast(pixels, tf.float32) / 255.0 - mean) / std

    def read_all(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Every readable image at once, center-cropped at ``size``, and its
        label: for the small sets of tests and benchmarks."""
        read = list(self.batches(size))
        return np.concatenate([x for x, _ in read]), np.concatenate([y for _, y in read])

    def batches(self, size: int, batch_size: int = EVAL_BATCH):
        """(inputs, labels) as numpy, a batch at a time: what calibration,
        BatchNorm estimation and evaluation read."""
        for x, y in self.evaluation_dataset(size, batch_size):
            if len(y):
                yield x.numpy(), y.numpy()


def crop_draws(epoch_seed: int, position):
    """Four uniform draws in [0, 1) for the image at ``position`` of an
    epoch's order: its crop box (see :func:`edgevit.train.data.crop_box`)
    and whether it is mirrored (the last below 0.5). Counter-based: the same
    for the same epoch and position, in whichever thread or worker."""
    import tensorflow as tf

    return tf.random.stateless_uniform([4], tf.stack([tf.constant(epoch_seed, tf.int64),
                                                      tf.cast(position, tf.int64)]), dtype=tf.float64)


def _stacked(images: list, size) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pixels [N, size, size, 3], labels [N], readable [N]) of a batch's images."""
    if not images:
        return np.zeros((0, int(size), int(size), 3), np.uint8), np.zeros(0, np.int64), np.zeros(0, bool)
    pixels, labels, ok = zip(*images)
    return np.stack(pixels), np.asarray(labels, np.int64), np.asarray(ok, bool)


def _batch_outputs(outputs, size=None):
    """A batch ``tf.numpy_function``'s outputs with their shapes (``size``:
    the pixels' side where it is fixed)."""
    pixels, labels, ok = outputs
    pixels.set_shape([None, size, size, 3])
    labels.set_shape([None])
    ok.set_shape([None])
    return pixels, labels, ok
