"""A default image set for calibration and validation when the user has none.

The photos ship inside the scikit-image wheel (a dependency) and carry no
copyright restrictions: each is public domain or CC0, as scikit-image's
``skimage.data`` documents. Crops at several scales and mirror images turn
a dozen photos into enough varied inputs for int8 range calibration.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from edgevit.data.decode import open_rgb
from edgevit.data.images import ImageSet, load_images, to_model_input
from edgevit.data.transforms import CLASSIFICATION, DETECTION, mediapipe_resize
from edgevit.registry import Preprocessing

# file name in skimage/data -> licence stated by scikit-image
CALIBRATION_PHOTOS = {
    "astronaut.png": "public domain (NASA)",
    "rocket.jpg": "public domain (SpaceX)",
    "hubble_deep_field.jpg": "public domain (NASA)",
    "retina.jpg": "CC0",
    "grass.png": "CC0",
    "gravel.png": "CC0",
    "coins.png": "no known copyright restrictions",
    "ihc.png": "no known copyright restrictions",
}
HELD_OUT_PHOTOS = {
    "chelsea.png": "CC0 (Stefan van der Walt)",
    "coffee.png": "CC0 (Rachel Michetti)",
    "camera.png": "CC0 (Lav Varshney)",
    "brick.png": "CC0",
}
SOURCE_NOTE = ("scikit-image sample photos (public domain / CC0), "
               "random crops and mirror images")
# Said where a trained model is calibrated on them: eight photos check that
# the file still recognises things, but a deployed model's ranges should come
# from the images it will see.
FEW_PHOTOS_NOTE = (f"{len(CALIBRATION_PHOTOS)} photos: enough to check the file; for the best int8 ranges "
                   "calibrate on 100+ images of your own domain (--calib DIR)")


def photo_dir() -> Path:
    import skimage

    return Path(skimage.__file__).parent / "data"


def sample_images(pre: Preprocessing, count: int, held_out: bool = False, seed: int = 0,
                  task: str = CLASSIFICATION) -> ImageSet:
    """``count`` views of the default photos: crops covering 35-100% of the
    shorter side, some mirrored, resized to the input size; ``held_out``
    draws from photos never used for calibration. A classifier's or
    segmenter's views are squares resized bilinearly; a detector's keep the
    photo's aspect and are resized to the square as MediaPipe's
    ObjectDetector resizes a frame (:func:`mediapipe_resize`), the pixels its
    file will see. The views are drawn here and made when read (the set
    keeps the few photos decoded)."""
    names = list(HELD_OUT_PHOTOS if held_out else CALIBRATION_PHOTOS)
    rng = np.random.default_rng(seed + (1 if held_out else 0))
    per_photo = -(-count // len(names))
    photos = {name: open_rgb(photo_dir() / name) for name in names}
    views = []
    for name, photo in photos.items():
        w, h = photo.size
        for _ in range(per_photo):
            fraction = rng.uniform(0.35, 1.0)
            crop_w, crop_h = (int(w * fraction), int(h * fraction)) if task == DETECTION else \
                (int(min(w, h) * fraction),) * 2
            left, top = rng.integers(0, w - crop_w + 1), rng.integers(0, h - crop_h + 1)
            views.append((name, (left, top, left + crop_w, top + crop_h), rng.random() < 0.5))
    order = rng.permutation(len(views))[:count]

    def resized(view: Image.Image) -> np.ndarray:
        if task == DETECTION:
            return mediapipe_resize(np.asarray(view), pre.input_size)
        return np.asarray(view.resize((pre.input_size, pre.input_size), Image.Resampling.BILINEAR))

    def read(batch_views: list) -> np.ndarray:
        inputs = np.empty((len(batch_views), pre.input_size, pre.input_size, 3), np.float32)
        for row, (name, box, mirrored) in enumerate(batch_views):
            view = photos[name].crop(box)
            if mirrored:
                view = view.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            inputs[row] = to_model_input(resized(view), pre)
        return inputs

    return ImageSet([views[i] for i in order], read)


def sample_batch(pre: Preprocessing, count: int, held_out: bool = False, seed: int = 0,
                 task: str = CLASSIFICATION) -> np.ndarray:
    """:func:`sample_images` as one [count, H, W, 3] array."""
    return sample_images(pre, count, held_out, seed, task)[:]


def held_out_photos(pre: Preprocessing) -> tuple[list[str], np.ndarray]:
    """The held-out photos whole, as a classifier evaluates them (resize,
    centre crop): (file names, [N, H, W, 3] batch)."""
    names = list(HELD_OUT_PHOTOS)
    batch, _ = load_images([photo_dir() / name for name in names], pre)
    return names, batch.astype(np.float32)
