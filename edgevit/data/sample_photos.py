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

from edgevit.data.images import load_images, open_rgb, to_model_input
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


def _views(img: Image.Image, count: int, rng: np.random.Generator, pre: Preprocessing):
    """``count`` square crops covering 35-100% of the shorter side, some mirrored."""
    w, h = img.size
    for _ in range(count):
        side = int(min(w, h) * rng.uniform(0.35, 1.0))
        left, top = rng.integers(0, w - side + 1), rng.integers(0, h - side + 1)
        view = img.crop((left, top, left + side, top + side))
        if rng.random() < 0.5:
            view = view.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        view = view.resize((pre.input_size, pre.input_size), Image.Resampling.BILINEAR)
        yield to_model_input(view, pre)


def sample_batch(pre: Preprocessing, count: int, held_out: bool = False, seed: int = 0) -> np.ndarray:
    """``count`` preprocessed [H, W, 3] views of the default photos, as one
    batch; ``held_out`` draws from photos never used for calibration."""
    names = list(HELD_OUT_PHOTOS if held_out else CALIBRATION_PHOTOS)
    rng = np.random.default_rng(seed + (1 if held_out else 0))
    per_photo = -(-count // len(names))
    views = []
    for name in names:
        views.extend(_views(open_rgb(photo_dir() / name), per_photo, rng, pre))
    order = rng.permutation(len(views))[:count]
    return np.stack([views[i] for i in order]).astype(np.float32)


def held_out_photos(pre: Preprocessing) -> tuple[list[str], np.ndarray]:
    """The held-out photos whole, as the model evaluates them (resize,
    centre crop): (file names, [N, H, W, 3] batch)."""
    names = list(HELD_OUT_PHOTOS)
    batch, _ = load_images([photo_dir() / name for name in names], pre)
    return names, batch.astype(np.float32)
