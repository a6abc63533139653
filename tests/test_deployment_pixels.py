"""A file is calibrated and validated on the pixels it will see: a
detector's calibration, validation and sample photos are the whole photo
resized as MediaPipe's ObjectDetector resizes a frame (what `edgevit eval`
reads), a classifier's the centre crop it always was."""
from __future__ import annotations

import numpy as np
from PIL import Image

from edgevit.data import sample_photos
from edgevit.data.decode import open_rgb
from edgevit.data.transforms import (CLASSIFICATION, DETECTION, center_crop, deployment_preprocessing,
                                     mediapipe_resize, normalise)
from edgevit.export.pipeline import ExportOptions, _image_sets
from edgevit.registry import get_spec

SIZE = 32


def _photos(folder, count: int = 11) -> None:
    """``count`` small photos, wide and tall, so that a centre crop and the whole image differ."""
    rng = np.random.default_rng(0)
    for i in range(count):
        shape = (30, 52, 3) if i % 2 else (47, 26, 3)
        Image.fromarray(rng.integers(0, 256, shape).astype(np.uint8)).save(folder / f"photo{i}.png")


def _sets(name: str, folder):
    spec = get_spec(name)
    opts = ExportOptions(calib_dir=str(folder), calib_samples=3, validation_samples=8)
    calib, val, _ = _image_sets(spec, SIZE, opts, need_calibration=True)
    return spec.preprocessing_at(SIZE), calib, val


def test_a_detectors_calibration_and_validation_images_are_the_mediapipe_resize_of_the_whole_photo(tmp_path):
    _photos(tmp_path)
    pre, calib, val = _sets("ssdlite_mobilevit_v1_xxs", tmp_path)
    assert (len(calib), len(val)) == (3, 8)
    for images in (calib, val):
        expected = [normalise(mediapipe_resize(np.asarray(open_rgb(path)), SIZE), pre) for path in images.items]
        np.testing.assert_array_equal(images[:], np.stack(expected))


def test_a_classifiers_calibration_images_are_still_the_centre_crop(tmp_path):
    _photos(tmp_path)
    pre, calib, val = _sets("mobilevit_v1_xxs", tmp_path)
    for images in (calib, val):
        expected = [normalise(np.asarray(center_crop(open_rgb(path), pre.resize_size, SIZE, pre.interpolation)), pre)
                    for path in images.items]
        np.testing.assert_array_equal(images[:], np.stack(expected))


def test_a_detectors_sample_photos_keep_the_photos_aspect_and_are_resized_as_mediapipe_does():
    pre = get_spec("ssdlite_mobilevit_v1_xxs").preprocessing_at(SIZE)
    views = sample_photos.sample_images(pre, 4, held_out=True, task=DETECTION)
    pixels = views[:]
    for (name, box, mirrored), got in zip(views.items, pixels):
        photo = open_rgb(sample_photos.photo_dir() / name)
        left, top, right, bottom = box
        assert abs((right - left) / photo.size[0] - (bottom - top) / photo.size[1]) < 0.01
        view = np.asarray(photo.crop(box))
        view = view[:, ::-1] if mirrored else view
        np.testing.assert_array_equal(got, normalise(mediapipe_resize(np.ascontiguousarray(view), SIZE), pre))
    squares = sample_photos.sample_images(pre, 4, held_out=True, task=CLASSIFICATION).items
    assert all(right - left == bottom - top for _, (left, top, right, bottom), _ in squares)


def test_a_detectors_metadata_states_mediapipes_bilinear_resize_whatever_its_weights_were_trained_with():
    trained = get_spec("ssdlite_mobilevit_v2_050").preprocessing_at(SIZE)
    assert trained.interpolation == "bicubic"  # the published weights' recipe, unchanged
    stated = deployment_preprocessing(trained, DETECTION)
    assert (stated.interpolation, stated.resize_size, stated.mean, stated.std) == (
        "bilinear", SIZE, trained.mean, trained.std)
    assert deployment_preprocessing(trained, CLASSIFICATION) is trained
