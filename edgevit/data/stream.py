"""The input pipeline of `edgevit finetune`, `edgevit qat` and `edgevit eval`:
tf.data over a file list, so that memory does not grow with the number of
images and reading overlaps the step.

batch of file indices -> for each, open, decode and place (the training or
evaluation transform of :mod:`edgevit.data.transforms`), a batch per call,
one call per core in parallel -> prefetch. Every dataset yields one batch
shape: ``(pixels, targets, real)``, uint8 pixels ``[N, size, size, 3]``, a
target per image and whether each place holds an image (an unreadable
image or a place padding a shard does not); the step that consumes a batch
normalises it (:func:`edgevit.data.transforms.normalise`) and counts only
the real places.

Evaluation images are decoded and resized by Pillow, called through
``tf.numpy_function``: their pixels are exactly those of the preprocessing
the exported files describe and `edgevit convert --calib` uses, which
TensorFlow's own JPEG decoder and resize do not reproduce. A training
batch's whole, upright JPEGs are decoded and cropped by TensorFlow's
decoder (each header read in Python first, 0.07 ms, to choose: see
:func:`edgevit.data.transforms.tensorflow_box`), the rest by Pillow, which
releases the GIL while it decodes and resamples, so the parallel calls run
on several cores. A call makes a whole batch: per image, tf.data's own
work around a call (its ops, the call, the batching) took as long as a
third of the image.

An epoch is a :class:`EpochPlan`: the resolution and global batch of each
step. The images of an epoch are a permutation of the file list computed
where each is needed (``index_shuffle``: no list of the order is held), and
the crop of each image is drawn from a counter-based generator keyed by the
epoch and its position, so a run resumed at an epoch, or spread over
several workers, reads the same images with the same crops. Worker ``w``'s
pipeline reads only the images of its own replicas.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, replace

import numpy as np

from edgevit.data.decode import UnreadableImage, UnreadableTally
from edgevit.data.boxes import BoxSplit
from edgevit.data.folders import Split
from edgevit.data.masks import MaskSplit
from edgevit.data.targets import targets_of
from edgevit.data.transforms import crop_draws, normalise, tensorflow_box, tensorflow_crop, transform
from edgevit.registry import Preprocessing

# Images a batch of evaluation, calibration or validation holds.
BATCH_SIZE = 32

# Other images tried in a training batch for one that cannot be read, before its place is left empty.
SUBSTITUTES = 16


def parallel_calls() -> int:
    """Images read at once: one per core this process may use. AUTOTUNE ran
    more, which then wait for Python's interpreter lock between Pillow's
    calls (2-core host, busy: 81 images/s at 256 px, 178 with 2 calls)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def scaled_batch_size(base_batch: int, base_size: int, size):
    """Batch size at ``size`` (a number, or an array of them) keeping about
    ``base_batch * base_size**2`` pixels."""
    return np.maximum(1, np.round(base_batch * (base_size / np.asarray(size)) ** 2)).astype(np.int64)


# Steps whose resolutions a plan draws at once (one generator per block, so that any step's is found alone).
DRAW_BLOCK = 4096


@dataclass(frozen=True)
class EpochPlan:
    """The steps of an epoch, made as they are asked for (no list of every
    step is held: ``--steps-per-epoch 1000000000`` costs what 8 steps do).
    Step ``t`` trains at :meth:`size_at` px on the ``count`` images that
    follow the previous steps' in the epoch's image order, shared equally by
    the ``replicas`` (a last, smaller step as evenly as it can); iterating
    the plan gives each step's (offset, count, size)."""
    samples: int
    per_replica_base: int     # each replica's batch at base_size
    replicas: int
    base_size: int
    choices: tuple[int, ...]  # the multi-scale resolutions, () for base_size alone
    seed: int
    fixed_steps: int | None   # None: every image once
    length: int

    def __len__(self) -> int:
        return self.length

    def _block(self, block: int) -> np.ndarray:
        """The resolutions of the steps of draw block ``block``."""
        if not self.choices:
            return np.full(DRAW_BLOCK, self.base_size, np.int64)
        draws = np.random.default_rng([self.seed, block]).integers(len(self.choices), size=DRAW_BLOCK)
        return np.asarray(self.choices, np.int64)[draws]

    def _full_count(self, sizes: np.ndarray) -> np.ndarray:
        """The global batch of a step at each of ``sizes`` before the epoch's end cuts it."""
        return scaled_batch_size(self.per_replica_base, self.base_size, sizes) * self.replicas

    def size_and_count(self, step) -> tuple[np.int64, np.int64]:
        """(resolution, full global batch) of step ``step``."""
        size = self._block(int(step) // DRAW_BLOCK)[int(step) % DRAW_BLOCK]
        return np.int64(size), np.int64(self._full_count(size))

    @property
    def sizes(self):
        """The resolution of every step, in order, a block at a time."""
        for block in range(0, self.length, DRAW_BLOCK):
            yield from self._block(block // DRAW_BLOCK)[:self.length - block].tolist()

    def __iter__(self):
        offset = 0
        for size in self.sizes:
            count = int(self._full_count(size))
            if self.fixed_steps is None:
                count = min(count, self.samples - offset)
            yield offset, count, size
            offset += count


def plan_epoch(samples: int, batch_size: int, replicas: int, base_size: int, sizes: list[int],
               rng: np.random.Generator, steps: int | None = None) -> EpochPlan:
    """One epoch: every image once (the last batch smaller), or ``steps``
    full batches. With multi-scale ``sizes``, each step draws a resolution
    (from ``rng``'s seed) and scales its batch by ``(base_size / size) ** 2``.
    ``batch_size`` is the global batch at ``base_size``, shared by
    ``replicas`` equally; a last batch of fewer images than replicas is left
    out (a replica without images cannot run the model: TensorFlow's CPU
    convolution returns an empty batch unchanged), and those images come in
    another epoch's order. Its length is found a block of steps at a time
    when it reads every image (at most ``samples / replicas`` steps), and is
    ``steps`` otherwise."""
    plan = EpochPlan(samples, batch_size // replicas, replicas, base_size, tuple(sorted(set(sizes))),
                     int(rng.integers(2**62)), steps, steps or 0)
    if steps is not None:
        return plan
    position, block = 0, 0
    while True:
        counts = plan._full_count(plan._block(block))
        starts = position + np.cumsum(counts) - counts
        ended = np.flatnonzero(samples - starts < replicas)
        if len(ended):
            return replace(plan, length=block * DRAW_BLOCK + int(ended[0]))
        position, block = int(starts[-1] + counts[-1]), block + 1


class ImageStream:
    """The images of a split, made when the pipeline reads them with the
    transforms of ``pre``. Unreadable files are counted in ``tally``
    (shared by the streams of a run)."""

    def __init__(self, split: Split | MaskSplit | BoxSplit, pre: Preprocessing, tally: UnreadableTally | None = None):
        self.files, self.targets = split.files, targets_of(split)
        self.pre = pre
        self.tally = tally if tally is not None else UnreadableTally()

    def __len__(self) -> int:
        return len(self.files)

    def subset(self, indices) -> ImageStream:
        """These images at ``indices``, counting unreadable ones in the same tally."""
        stream = copy.copy(self)
        stream.files, stream.targets = [self.files[i] for i in indices], self.targets.subset(indices)
        return stream

    # -- a batch, in a pipeline thread -----------------------------------------------------------
    def _placed(self, index: int, place, draws=None):
        """(pixels, target) of image ``index``, or None when it cannot be read (counted)."""
        try:
            return place(self.files[index], self.targets[index], draws)
        except UnreadableImage as err:
            self.tally.add(err)
            return None

    def _routes(self, indices, draws, size):
        """Which decoder gives each training crop of a batch (see
        :func:`edgevit.data.transforms.tensorflow_box`): (paths, boxes
        [N, 5], labels, whether TensorFlow's) of the images TensorFlow's
        decoder crops, the others' places and draws left to Pillow."""
        place = transform(self.pre, int(size), is_training=True)
        paths, boxes, labels, by_tensorflow = [], [], [], []
        for index, draw in zip(indices, draws):
            # a mask is Pillow's to read and place with its image
            box = tensorflow_box(self.files[int(index)], place, draw) if self.targets.label_only else None
            by_tensorflow.append(box is not None)
            if box is not None:
                paths.append(self.files[int(index)].encode("utf-8", "surrogateescape"))
                boxes.append(box)
                labels.append(self.targets[int(index)])
        return (np.asarray(paths, object).reshape(-1), np.asarray(boxes, np.int32).reshape(-1, 5),
                np.asarray(labels, self.targets.dtype).reshape(-1, *self.targets.batch_shape(int(size))[1:]),
                np.asarray(by_tensorflow, bool))

    def _training_batch(self, indices, draws, size):
        """Pillow's training crops of a batch's images (an unreadable one's
        place taken by another image)."""
        place, size = transform(self.pre, int(size), is_training=True), int(size)
        # an unreadable image's place goes to another one, far off in the file list (another class folder)
        stride = max(1, int(len(self.files) * 0.618)) | 1
        images = []
        for index, draw in zip(indices, draws):
            for candidate in range(SUBSTITUTES + 1):
                placed = self._placed((int(index) + candidate * stride) % len(self.files), place, draw)
                if placed is not None:
                    images.append((*placed, True))
                    break
            else:
                images.append((np.zeros((size, size, 3), np.uint8), self.targets.empty(size), False))
        return self._stacked(images, size)

    def _evaluation_batch(self, indices, size):
        place, size = transform(self.pre, int(size)), int(size)
        images = []
        for index in indices:
            placed = self._placed(int(index), place) if index >= 0 else None  # -1: a place padding a shard
            images.append((*placed, True) if placed is not None else
                          (np.zeros((size, size, 3), np.uint8), self.targets.empty(size), False))
        return self._stacked(images, size)

    def _stacked(self, images: list, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pixels [N, size, size, 3], targets, readable [N]) of a batch's images."""
        if not images:
            return (np.zeros((0, size, size, 3), np.uint8),
                    np.zeros([0, *self.targets.batch_shape(size)[1:]], self.targets.dtype), np.zeros(0, bool))
        pixels, targets, ok = zip(*images)
        return np.stack(pixels), np.stack(targets).astype(self.targets.dtype), np.asarray(ok, bool)

    def _outputs(self, outputs, size=None):
        """A batch ``tf.numpy_function``'s outputs with their shapes (``size``:
        the pixels' side where it is fixed)."""
        pixels, targets, ok = outputs
        pixels.set_shape([None, size, size, 3])
        targets.set_shape(self.targets.batch_shape(size))
        ok.set_shape([None])
        return pixels, targets, ok

    def _target_type(self):
        import tensorflow as tf

        return tf.as_dtype(self.targets.dtype)

    # -- datasets ---------------------------------------------------------------------------------
    def training_dataset(self, plan: EpochPlan, epoch_seed: int, pipeline: int = 0, local_replicas: int = 1):
        """The batches of ``plan`` that the ``local_replicas`` replicas of
        input pipeline ``pipeline`` train on, in the order they take them."""
        import tensorflow as tf

        samples, replicas = len(self.files), plan.replicas
        cut = plan.fixed_steps is None  # the last step of an every-image epoch takes what is left
        local = tf.range(pipeline * local_replicas, (pipeline + 1) * local_replicas, dtype=tf.int64)

        def size_and_count(step):
            size, count = tf.numpy_function(plan.size_and_count, [step], [tf.int64, tf.int64], stateful=False)
            return tf.ensure_shape(size, []), tf.ensure_shape(count, [])

        def placed(offset, size_count):
            size, count = size_count
            count = tf.minimum(count, plan.samples - offset) if cut else count
            return offset + count, (offset, count, size)

        def replicas_shares(offset, count, size):
            first, end = (count * local) // replicas, (count * (local + 1)) // replicas
            return tf.data.Dataset.from_tensor_slices((offset + first, end - first, tf.fill(tf.shape(local), size)))

        def image_draws(position):
            order = tf.stack([tf.constant(epoch_seed, tf.int64), position // samples])  # a permutation per pass
            return (tf.random.experimental.index_shuffle(position % samples, order, samples - 1),
                    crop_draws(epoch_seed, position))

        target_type = self._target_type()

        def batch(start, count, size):
            indices, draws = tf.map_fn(image_draws, start + tf.range(count),
                                       fn_output_signature=(tf.int64, tf.float64))
            paths, boxes, tf_labels, by_tensorflow = tf.numpy_function(
                self._routes, [indices, draws, size], [tf.string, tf.int32, target_type, tf.bool], stateful=False)
            boxes.set_shape([None, 5])
            no_images = tf.zeros(tf.stack([0, size, size, 3]), tf.uint8)
            decoded = tf.cond(  # map_fn cannot stack no image of an unknown size
                tf.size(paths) > 0,
                lambda: tf.map_fn(lambda item: tensorflow_crop(tf.io.read_file(item[0]), item[1], size),
                                  (paths, boxes), fn_output_signature=tf.TensorSpec([None, None, 3], tf.uint8)),
                lambda: no_images)
            others = tf.where(tf.logical_not(by_tensorflow))[:, 0]
            pixels, labels, real = self._outputs(tf.cond(  # Python only when some image needs Pillow
                tf.size(others) > 0,
                lambda: tf.numpy_function(self._training_batch, [tf.gather(indices, others),
                                                                 tf.gather(draws, others), size],
                                          [tf.uint8, target_type, tf.bool], stateful=False),
                lambda: [no_images, tf.zeros(tf.stack([0, *self.targets.batch_shape(size)[1:]]), target_type),
                         tf.zeros([0], tf.bool)]))
            mine = tf.cast(tf.where(by_tensorflow)[:, 0], tf.int32)
            theirs = tf.cast(others, tf.int32)
            return (tf.dynamic_stitch([mine, theirs], [tf.ensure_shape(decoded, [None, None, None, 3]), pixels]),
                    tf.dynamic_stitch([mine, theirs], [tf_labels, labels]),
                    tf.dynamic_stitch([mine, theirs], [tf.ones_like(mine, tf.bool), real]))

        # Each step's place in the image order is the sum of the batches before it: a scan, step by step.
        ds = (tf.data.Dataset.range(len(plan)).map(size_and_count).scan(tf.constant(0, tf.int64), placed)
              .flat_map(replicas_shares))
        return ds.map(batch, num_parallel_calls=parallel_calls()).prefetch(tf.data.AUTOTUNE)

    def evaluation_dataset(self, size: int, batch_size: int = BATCH_SIZE, pipelines: int = 1, pipeline: int = 0,
                           length: int | None = None):
        """Every image (of input pipeline ``pipeline``'s shard) placed by the
        evaluation transform at ``size``, in batches of ``batch_size``;
        ``length``: the shard padded to that many places."""
        import tensorflow as tf

        def batch(indices):
            return self._outputs(tf.numpy_function(self._evaluation_batch, [indices, size],
                                                   [tf.uint8, self._target_type(), tf.bool], stateful=False), size)

        ds = tf.data.Dataset.range(len(self.files)).shard(pipelines, pipeline)
        if length is not None:
            ds = ds.concatenate(tf.data.Dataset.from_tensors(tf.constant(-1, tf.int64)).repeat(
                length - len(range(pipeline, len(self.files), pipelines))))
        return ds.batch(batch_size).map(batch, num_parallel_calls=parallel_calls()).prefetch(tf.data.AUTOTUNE)

    def batches(self, size: int, batch_size: int = BATCH_SIZE):
        """(normalised inputs, targets) of the readable images as numpy, a
        batch at a time: what calibration, BatchNorm estimation and
        evaluation read."""
        for pixels, labels, real in self.evaluation_dataset(size, batch_size):
            real = real.numpy()
            if real.any():
                yield normalise(pixels.numpy()[real], self.pre), labels.numpy()[real]

    def read_all(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Every readable image at once, as :meth:`batches`: for the small
        sets of tests and benchmarks."""
        read = list(self.batches(size))
        return np.concatenate([x for x, _ in read]), np.concatenate([y for _, y in read])
