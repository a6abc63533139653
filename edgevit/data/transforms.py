"""What becomes of an image, and of its target, before a model sees it.

One factory, :func:`transform`, with a training flag:

- evaluation (``is_training=False``): the shorter side resized to the
  preprocessing's resize size for the input size, the centre square of the
  input size kept (:func:`center_crop`); the pixels the exported files
  describe in their metadata, and what calibration, validation and
  ``edgevit eval`` read (:func:`deployment_pixels`); a detector's: the
  whole image resized to the square as MediaPipe's ObjectDetector resizes
  it (below), its metadata stating that bilinear resize
  (:func:`deployment_preprocessing`);
- training: a random resized crop of the image's centre square, mirrored
  or not, from four uniform draws (:func:`crop_draws`, counter-based: the
  same for the same epoch and position in whichever thread or worker). The
  crop's box is taken in the upright image's pixels and resized once,
  bilinear. A whole, upright RGB or grayscale JPEG (most training sets) is
  decoded and cropped by TensorFlow's decoder, which decodes the box alone
  and needs no Python: :func:`tensorflow_box`, :func:`tensorflow_crop`
  (on 2 cores Pillow's path took 3.6 ms of CPU an image, TensorFlow's
  2.3, and Python's lock capped Pillow's threads); every other image, and
  a JPEG at least twice the size the crop needs (decoded by Pillow at 1/2,
  1/4 or 1/8 scale, far less work), takes Pillow's path. The two resample
  the same box a little differently; training crops are random already,
  and a classifier's or segmenter's evaluation, whose pixels the exported
  files describe, is Pillow's alone.

A detector is evaluated (and validated while it trains) on the whole
image resized to the square as MediaPipe's ObjectDetector resizes a frame
(:func:`mediapipe_resize`, :class:`WholeImage`): the app's client feeds the
model those pixels, not Pillow's antialiased ones, and its mAP is what
``edgevit eval`` predicts. Its training crops stay Pillow's: trained on
MediaPipe's resize, short runs measured no gain beyond their run-to-run
spread, and Pillow resizes as fast or faster (docs/benchmarks.md).

A :class:`Placement` says where the model's input comes from in the
upright image; a target travels with its image through the same placement:
a class label unchanged, a mask placed with the nearest-neighbour filter,
boxes moved and clipped (:meth:`Placement.boxes`).

Normalisation is one formula, :func:`normalise`, for numpy arrays and
TensorFlow tensors alike: batches leave the input pipeline as uint8 and
the step that consumes them normalises them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from edgevit.data.boxes import ImageBoxes, batch_boxes
from edgevit.data.decode import open_rgb
from edgevit.data.jpeg_header import read_jpeg_header
from edgevit.data.masks import MaskFile, read_mask
from edgevit.registry import CLASSIFICATION, DETECTION, Preprocessing

PIL_FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
}
# the resampling filters a preprocessing recipe may name
INTERPOLATIONS = tuple(PIL_FILTERS)
# Up to this aspect ratio (16:1) the evaluation resize makes the whole
# resized image (at 288 px: 1.3 M pixels, 4 MB) and crops it, as the
# reference code does; beyond, it resizes the cropped part alone, which
# rounds a pixel value or two differently.
MAX_RESIZED_SIDES = 16
# The random resized crop keeps this fraction of the centre square's area at least (the MobileViT recipes' 0.35).
MIN_CROP_AREA = 0.35
# A detector's training crop keeps this fraction of the whole image's area at least, its aspect unchanged (SSD
# recipes crop with IoU constraints around the boxes; a plain crop keeps most boxes whole at these sizes).
MIN_DETECTION_CROP_AREA = 0.3
# Uniform draws a training crop takes: its area, its x and y position, and whether it is mirrored.
DRAWS = 4
# MediaPipe's ImageToTensor on the CPU resizes with OpenCV's warp (INTER_LINEAR): sample positions rounded to
# 1/2**5 px (OpenCV's INTER_BITS), the four neighbours' weights in fixed point.
WARP_POSITION_BITS = 5


def center_crop(img: Image.Image, resize_size: int, crop_size: int, interpolation: str) -> Image.Image:
    """Resize the shorter side to ``resize_size`` then center-crop a
    ``crop_size`` square. Where the resized image would be more than
    MAX_RESIZED_SIDES times the square of ``resize_size`` (a 20000x1 strip
    resized to 288 px high: 5.8 M x 288 pixels, 5 GB), only the part the crop
    keeps is resized, straight from the original (Pillow's resize box)."""
    return CenterCrop(resize_size, crop_size).apply(img, PIL_FILTERS[interpolation])


def mediapipe_resize(pixels: np.ndarray, size: int) -> np.ndarray:
    """uint8 ``pixels`` [H, W, C] resized to a ``size`` square as MediaPipe
    Tasks' ObjectDetector resizes a frame on the CPU (ImageToTensor's OpenCV
    converter: the frame's corners on the square's corners, a bilinear warp,
    no antialiasing, edges replicated). Output pixel (i, j) samples the frame
    at (i * H / size, j * W / size), not at pixel centres, each position
    rounded to the nearest 1/32 px, its four neighbours weighted in fixed
    point as OpenCV does. Equal to MediaPipe's pixels but where a position
    falls exactly half-way between two 1/32 steps: MediaPipe's warp matrix,
    solved and inverted in floating point, breaks those ties either way."""
    height, width = pixels.shape[:2]
    steps = 1 << WARP_POSITION_BITS
    rows, row_weights = _warp_taps(height, size, steps)
    columns, column_weights = _warp_taps(width, size, steps)
    # OpenCV weights each neighbour by row weight x column weight (1/32 steps each) and rounds the sum once.
    # Summed over the rows first (int16: at most 255 x 32), then the columns, the integer total is the same; its
    # table's 15-bit weights (x 2**5) and rounding, (total * 2**5 + 2**14) >> 15, are (total + 2**9) >> 10.
    along_rows = sum(pixels[taps] * weights.astype(np.int16)[:, None, None] for taps, weights in zip(rows, row_weights))
    along_rows = along_rows.astype(np.int32)
    total = sum(np.take(along_rows, taps, axis=1) * weights[:, None] for taps, weights in zip(columns, column_weights))
    shift = 2 * WARP_POSITION_BITS
    return ((total + (1 << (shift - 1))) >> shift).astype(np.uint8)


def _warp_taps(side: int, size: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The two source indices [2, size] (edges replicated) of each output
    position along a ``side``-px axis resized to ``size``, and their weights
    in 1/``steps`` units (summing to ``steps``)."""
    position = np.rint(np.arange(size, dtype=np.float64) * (side / size) * steps).astype(np.int64)
    first, fraction = position // steps, (position % steps).astype(np.int32)
    indices = np.clip(np.stack([first, first + 1]), 0, side - 1)
    return indices, np.stack([steps - fraction, fraction])


def deployment_pixels(img: Image.Image, pre: Preprocessing, task: str = CLASSIFICATION) -> np.ndarray:
    """uint8 [input size, input size, 3]: the pixels a deployed file of
    ``task`` sees for the upright ``img``, as ``edgevit eval`` places them
    (:meth:`Transform.placement`): a detector's the whole image resized as
    MediaPipe's ObjectDetector resizes it, other tasks' the centre crop.
    Calibration, validation and the sample photos read these, so a file's
    int8 ranges come from the pixels it will see."""
    placement = transform(pre).placement(img.size, whole=task == DETECTION)
    return np.asarray(placement.apply(img, PIL_FILTERS[pre.interpolation]), np.uint8)


def deployment_preprocessing(pre: Preprocessing, task: str) -> Preprocessing:
    """The recipe a deployed file of ``task`` states in its metadata: a
    detector's resize is MediaPipe's bilinear one of the whole image
    (:func:`mediapipe_resize`), whichever filter its weights were trained
    with (``pre``, the registry's, unchanged); other tasks' ``pre``."""
    if task != DETECTION:
        return pre
    return Preprocessing(pre.input_size, pre.input_size, "bilinear", pre.mean, pre.std)


def evaluation_resize(pre: Preprocessing, size: int) -> int:
    """The shorter side the evaluation transform resizes to for ``size`` px
    crops (the preprocessing's resize-to-crop ratio)."""
    return pre.resize_size if size == pre.input_size else round(size * pre.resize_size / pre.input_size)


def normalise(pixels, pre: Preprocessing):
    """uint8 RGB pixels ``[..., H, W, 3]`` -> float32 model input: scaled to
    [0, 1], then ``(x - mean) / std``. A numpy array (or anything array-like)
    gives a numpy array, a TensorFlow tensor a tensor, by the same formula."""
    mean, std = np.asarray(pre.mean, np.float32), np.asarray(pre.std, np.float32)
    if hasattr(pixels, "__array_interface__") or isinstance(pixels, (list, tuple)):
        x = np.asarray(pixels, dtype=np.float32)
    else:
        import tensorflow as tf

        x = tf.cast(pixels, tf.float32)
    return (x / 255.0 - mean) / std


def crop_draws(epoch_seed: int, position):
    """The DRAWS uniform draws in [0, 1) of the image at ``position`` of an
    epoch's order (see :meth:`Transform.placement`). Counter-based: the same
    for the same epoch and position, in whichever thread or worker."""
    import tensorflow as tf

    return tf.random.stateless_uniform([DRAWS], tf.stack([tf.constant(epoch_seed, tf.int64),
                                                          tf.cast(position, tf.int64)]), dtype=tf.float64)


def crop_box(side: int, draws) -> tuple[int, int, int]:
    """(crop, x0, y0) of a random resized crop of a ``side`` square from
    three uniform draws in [0, 1): an area of MIN_CROP_AREA to 1 of the
    square, anywhere in it."""
    crop = max(1, int(side * math.sqrt(MIN_CROP_AREA + (1.0 - MIN_CROP_AREA) * float(draws[0]))))
    span = side - crop + 1
    return crop, min(int(float(draws[1]) * span), span - 1), min(int(float(draws[2]) * span), span - 1)


@dataclass(frozen=True)
class BoxCrop:
    """The ``box`` (left, top, right, bottom, in the upright image's pixels)
    resized to a ``size`` square, mirrored when ``mirror``: a training crop."""
    box: tuple[float, float, float, float]
    size: int
    mirror: bool = False

    def apply(self, img: Image.Image, resample) -> Image.Image:
        placed = img.resize((self.size, self.size), resample, box=self.box)
        return placed.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if self.mirror else placed

    def affine(self, image_size: tuple[int, int]) -> tuple[float, float, float, float]:
        """(scale x, scale y, offset x, offset y): output = input * scale + offset, before mirroring."""
        left, top, right, bottom = self.box
        sx, sy = self.size / (right - left), self.size / (bottom - top)
        return sx, sy, -left * sx, -top * sy


@dataclass(frozen=True)
class CenterCrop:
    """The shorter side resized to ``resize``, the centre ``size`` square kept: the evaluation transform."""
    resize: int
    size: int

    def _geometry(self, image_size: tuple[int, int]):
        w, h = image_size
        scale = self.resize / min(w, h)
        new_w, new_h = max(self.size, round(w * scale)), max(self.size, round(h * scale))
        return new_w, new_h, (new_w - self.size) // 2, (new_h - self.size) // 2

    def apply(self, img: Image.Image, resample) -> Image.Image:
        new_w, new_h, left, top = self._geometry(img.size)
        if new_w * new_h <= MAX_RESIZED_SIDES * self.resize ** 2:
            img = img.resize((new_w, new_h), resample)
            return img.crop((left, top, left + self.size, top + self.size))
        x_step, y_step = img.size[0] / new_w, img.size[1] / new_h
        box = (left * x_step, top * y_step, (left + self.size) * x_step, (top + self.size) * y_step)
        return img.resize((self.size, self.size), resample, box=box)

    def affine(self, image_size: tuple[int, int]) -> tuple[float, float, float, float]:
        new_w, new_h, left, top = self._geometry(image_size)
        sx, sy = new_w / image_size[0], new_h / image_size[1]
        return sx, sy, -float(left), -float(top)

    mirror = False


@dataclass(frozen=True)
class WholeImage:
    """The whole image resized to a ``size`` square by :func:`mediapipe_resize`
    (whichever filter the recipe names): the pixels MediaPipe's
    ObjectDetector feeds a detector, its evaluation."""
    size: int

    mirror = False

    def apply(self, img: Image.Image, resample) -> Image.Image:
        return Image.fromarray(mediapipe_resize(np.asarray(img), self.size))

    def affine(self, image_size: tuple[int, int]) -> tuple[float, float, float, float]:
        return self.size / image_size[0], self.size / image_size[1], 0.0, 0.0


Placement = BoxCrop | CenterCrop | WholeImage


def placed_boxes(placement: Placement, image_size: tuple[int, int], boxes: np.ndarray) -> np.ndarray:
    """``boxes`` [N, 4] (x0, y0, x1, y1 in the upright image's pixels) where
    ``placement`` puts them in the model's input, clipped to it. A box whose
    centre the crop leaves out becomes empty (all zero), as cvnets' SSD crop
    drops it: clipped, it would teach a sliver of an object as the object."""
    sx, sy, ox, oy = placement.affine(image_size)
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    moved = boxes * [sx, sy, sx, sy] + [ox, oy, ox, oy]
    if placement.mirror:
        moved = np.stack([placement.size - moved[:, 2], moved[:, 1], placement.size - moved[:, 0], moved[:, 3]], 1)
    centres = (moved[:, :2] + moved[:, 2:]) / 2
    inside = ((centres > 0) & (centres < placement.size)).all(1)
    return np.where(inside[:, None], np.clip(moved, 0, placement.size), 0).astype(np.float32)


@dataclass(frozen=True)
class Transform:
    """An image file and its target -> the model's uint8 input at ``size`` px
    and the target placed with it (see the module docstring)."""
    pre: Preprocessing
    size: int
    is_training: bool

    def placement(self, image_size: tuple[int, int], draws=None, whole: bool = False) -> Placement:
        """Where the input comes from in an upright image of ``image_size``
        (``draws``: a training crop's DRAWS uniform draws). ``whole``: a
        detector's, whose objects reach the image's edges: the whole image
        resized to the square as MediaPipe's ObjectDetector feeds it (the SSD
        recipes evaluate the whole image too), a training crop of it keeping
        its aspect."""
        w, h = image_size
        if whole:
            if not self.is_training:
                return WholeImage(self.size)
            scale = math.sqrt(MIN_DETECTION_CROP_AREA + (1.0 - MIN_DETECTION_CROP_AREA) * float(draws[0]))
            crop_w, crop_h = w * scale, h * scale
            left, top = (w - crop_w) * float(draws[1]), (h - crop_h) * float(draws[2])
            return BoxCrop((left, top, left + crop_w, top + crop_h), self.size, bool(float(draws[3]) < 0.5))
        if not self.is_training:
            return CenterCrop(evaluation_resize(self.pre, self.size), self.size)
        side = min(w, h)
        crop, x0, y0 = crop_box(side, draws)
        left, top = (w - side) // 2 + x0, (h - side) // 2 + y0
        return BoxCrop((left, top, left + crop, top + crop), self.size, bool(float(draws[3]) < 0.5))

    def draft_size(self, draws) -> tuple[int, int] | None:
        """The least size whose centre square still gives this crop at least
        ``size`` pixels (a JPEG is decoded no smaller: see :func:`open_rgb`)."""
        if not self.is_training:
            return None  # evaluation reads every pixel, as the exported file's preprocessing describes
        need = math.ceil(self.size / math.sqrt(MIN_CROP_AREA + (1.0 - MIN_CROP_AREA) * float(draws[0]))) + 1
        return need, need

    def __call__(self, path, target=None, draws=None):
        """(uint8 [size, size, 3] pixels, target placed with them) of the file
        at ``path``; :class:`~edgevit.data.decode.UnreadableImage` when it
        cannot be read. A target is a class label (unchanged), a mask
        (a PIL image of the image's size, or a :class:`MaskFile` read here:
        placed with the nearest filter, returned as a uint8 array) or boxes
        ([N, 4] array: moved, clipped; :class:`ImageBoxes`: placed in the
        whole image, as a batch holds them: :func:`~edgevit.data.boxes.batch_boxes`)."""
        # a mask or boxes are in the pixels of the whole image: decoded at full scale with them
        label_only = target is None or isinstance(target, (int, np.integer))
        img = open_rgb(path, self.draft_size(draws) if draws is not None and label_only else None)
        placement = self.placement(img.size, draws, whole=isinstance(target, ImageBoxes))
        pixels = np.asarray(placement.apply(img, self._image_filter()), np.uint8)
        return pixels, self._placed_target(target, placement, img.size)

    def _image_filter(self):
        return PIL_FILTERS["bilinear" if self.is_training else self.pre.interpolation]

    @staticmethod
    def _placed_target(target, placement: Placement, image_size: tuple[int, int]):
        if isinstance(target, MaskFile):
            target = read_mask(target.path, image_size, target.classes)
        if isinstance(target, Image.Image):
            if target.size != image_size:
                raise ValueError(f"a mask of {target.size[0]}x{target.size[1]} for an image of "
                                 f"{image_size[0]}x{image_size[1]}")
            return np.asarray(placement.apply(target, Image.Resampling.NEAREST), np.uint8)
        if isinstance(target, np.ndarray) and target.ndim == 2:
            return placed_boxes(placement, image_size, target)
        if isinstance(target, ImageBoxes):
            placed = placed_boxes(placement, image_size, target.corners) / placement.size
            return batch_boxes(placed, target.classes)
        return target


def tensorflow_box(path: str, place: Transform, draws) -> tuple[int, int, int, int, bool] | None:
    """(top, left, height, width, mirror) of the training crop of the image at
    ``path`` when TensorFlow's decoder gives it (see the module docstring):
    a JPEG in YCbCr or grayscale, upright, ending in its end-of-image marker
    (a truncated file goes to Pillow, which counts it as damaged), and not
    large enough for Pillow's scaled decoding (twice the training
    transform's :meth:`~Transform.draft_size`); None otherwise. Reads the
    header alone (:mod:`edgevit.data.jpeg_header`)."""
    header = read_jpeg_header(path)
    if header is None or header.components not in (1, 3) or header.orientation != 1 or not header.whole:
        return None
    if min(header.width, header.height) >= 2 * place.draft_size(draws)[0]:
        return None
    placement = place.placement((header.width, header.height), draws)
    left, top, right, bottom = (int(v) for v in placement.box)
    return top, left, bottom - top, right - left, placement.mirror


def tensorflow_crop(contents, box, size: int):
    """uint8 [size, size, 3]: the (top, left, height, width, mirror) ``box``
    of the JPEG ``contents`` decoded alone and resized, bilinear."""
    import tensorflow as tf

    pixels = tf.io.decode_and_crop_jpeg(contents, box[:4], channels=3)
    pixels = tf.image.resize(pixels, (size, size), method="bilinear")
    pixels = tf.cast(tf.clip_by_value(tf.round(pixels), 0, 255), tf.uint8)
    return tf.cond(box[4] > 0, lambda: tf.reverse(pixels, [1]), lambda: pixels)


def transform(pre: Preprocessing, size: int | None = None, is_training: bool = False) -> Transform:
    """The training or evaluation transform of ``pre`` at ``size`` px (default: its input size)."""
    return Transform(pre, pre.input_size if size is None else int(size), is_training)
