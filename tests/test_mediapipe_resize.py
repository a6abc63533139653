"""A detector's evaluation pixels are the ones MediaPipe's ObjectDetector
feeds the model: edgevit.data.transforms.mediapipe_resize against
MediaPipe's own image preprocessing, and `edgevit eval`'s detection stream
using it."""
import numpy as np
import pytest
from PIL import Image

from edgevit.data.transforms import mediapipe_resize
from tests.standard_clients import embed, missing

SIZE = 32
# (height, width) of test frames: downscales and upscales, either aspect; 75 x 100 has no rounding ties at 32 px
FRAMES = ((75, 100), (37, 53), (100, 37), (9, 13), (333, 500))


def identity_model(path, size: int):
    """A .tflite whose output (float32 [1, size * size * 3]) is its uint8 input's pixels."""
    import tensorflow as tf

    class Identity(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, size, size, 3], tf.uint8)])
        def pixels(self, x):
            return tf.reshape(tf.cast(x, tf.float32), [1, size * size * 3])

    module = Identity()
    path.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions(
        [module.pixels.get_concrete_function()], module).convert())
    return path


def rounding_ties(side: int, size: int) -> np.ndarray:
    """Which of ``size`` output positions sample a ``side``-px axis exactly
    half-way between two 1/32-px steps (position * 32 = k + 1/2)."""
    return (np.arange(size) * side * 64) % (2 * size) == size


def test_the_resize_is_opencvs_warp_within_one_level():
    """Against OpenCV's warpPerspective of the whole frame onto the square,
    as MediaPipe's ImageToTensor calls it (cv2 comes with pip mediapipe, a
    test dependency): OpenCV 5's warp samples at exact positions where
    MediaPipe's rounds them to 1/32 px, so values differ by one level at
    most, on a few percent of them, even on random pixels."""
    cv2 = pytest.importorskip("cv2")
    rng = np.random.default_rng(0)
    for height, width in FRAMES:
        frame = rng.integers(0, 256, (height, width, 3), np.uint8)
        corners = np.float32([[0, height], [0, 0], [width, 0], [width, height]])
        square = np.float32([[0, SIZE], [0, 0], [SIZE, 0], [SIZE, SIZE]])
        theirs = cv2.warpPerspective(frame, cv2.getPerspectiveTransform(corners, square), (SIZE, SIZE),
                                     flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        difference = np.abs(mediapipe_resize(frame, SIZE).astype(np.int32) - theirs)
        assert difference.max() <= 1 and (difference > 0).mean() < 0.05, (height, width)


@pytest.mark.slow
@pytest.mark.skipif(missing("mediapipe") is not None, reason="pip mediapipe is not installed")
def test_the_resize_is_mediapipes_but_at_rounding_ties(tmp_path):
    """Random pixels (the worst case: a 1/32-px shift changes a value by up
    to 13) of frames smaller and larger than the input: every pixel equals
    MediaPipe's except on the rows and columns whose sample position is a
    rounding tie, which MediaPipe's floating-point warp matrix breaks either way."""
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (h, w, 3), np.uint8) for h, w in FRAMES]
    found = embed(identity_model(tmp_path / "identity.tflite", SIZE), frames, tmp_path)
    assert not isinstance(found, str), found
    theirs = np.rint(found).astype(np.uint8).reshape(len(frames), SIZE, SIZE, 3)
    for frame, their_pixels in zip(frames, theirs):
        ours = mediapipe_resize(frame, SIZE)
        ties = rounding_ties(frame.shape[0], SIZE)[:, None] | rounding_ties(frame.shape[1], SIZE)[None, :]
        differ = (ours != their_pixels).any(-1)
        assert not (differ & ~ties).any(), f"{frame.shape}: differs off the rounding ties"
        if not ties.any():
            np.testing.assert_array_equal(ours, their_pixels)
    assert not rounding_ties(75, SIZE).any() and not rounding_ties(100, SIZE).any()


def test_a_uniform_frame_stays_uniform_and_edges_are_replicated():
    frame = np.full((7, 11, 3), 200, np.uint8)
    np.testing.assert_array_equal(mediapipe_resize(frame, 32), np.full((32, 32, 3), 200, np.uint8))
    ramp = np.broadcast_to(np.arange(0, 250, 25, dtype=np.uint8)[None, :, None], (4, 10, 3)).copy()
    row = mediapipe_resize(ramp, 20)[0, :, 0]
    # output column j samples 10 / 20 * j: every even column a source pixel, every odd one half-way; the last
    # samples 9.5, past the last pixel's centre: the edge is replicated
    np.testing.assert_array_equal(row[::2], np.arange(0, 250, 25))
    np.testing.assert_array_equal(row[1:-1:2], np.arange(0, 225, 25) + 13)
    assert row[-1] == 225


def test_eval_streams_a_detectors_images_through_the_mediapipe_resize(tmp_path):
    """What `edgevit eval` of a detector reads (ImageStream.batches of a
    detection split, as edgevit.evaluate's detection report runs it): the
    decoded image resized by mediapipe_resize, not Pillow's antialiased resize."""
    from edgevit.data.boxes import find_detection_dataset
    from edgevit.data.stream import ImageStream
    from edgevit.registry import Preprocessing
    from tests.test_detection_data import make_detection_folder

    folder = find_detection_dataset(make_detection_folder(tmp_path / "shapes", per_split=2))
    pre = Preprocessing(input_size=32, resize_size=32, mean=(0, 0, 0), std=(1, 1, 1), interpolation="bicubic")
    inputs, _ = next(ImageStream(folder.val, pre).batches(32))
    for path, pixels in zip(folder.val.files, np.rint(inputs * 255).astype(np.uint8)):  # mean 0, std 1
        decoded = np.asarray(Image.open(path).convert("RGB"))
        np.testing.assert_array_equal(pixels, mediapipe_resize(decoded, 32))
        assert not np.array_equal(pixels, np.asarray(Image.fromarray(decoded).resize((32, 32), Image.BILINEAR)))
