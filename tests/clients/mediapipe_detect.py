"""Detect objects with MediaPipe Tasks' ObjectDetector, as an app does.

Usage: python mediapipe_detect.py MODEL.tflite IMAGES.npy OUT.json [SCORE_THRESHOLD MAX_RESULTS]
IMAGES: uint8 [N, H, W, 3] RGB (.npy), or images of their own sizes (.npz of
arr_0, arr_1, ... as numpy.savez writes them). OUT: per image, the detections as
[category index, category name, score, ymin, xmin, ymax, xmax], the box
normalised by the image's size (MediaPipe gives pixels), best first. By
default every detection is kept (score threshold 0, no limit), so that the
caller compares all of them; SCORE_THRESHOLD and MAX_RESULTS set the
options an app sets. A refusal exits 3 with MediaPipe's message on stderr.
"""
import json
import sys

import numpy as np


def main(model: str, images_path: str, out_path: str, score_threshold: str = "0", max_results: str = "-1") -> int:
    import mediapipe as mp
    from mediapipe.tasks.python import BaseOptions, vision

    options = vision.ObjectDetectorOptions(base_options=BaseOptions(model_asset_path=model),
                                           score_threshold=float(score_threshold), max_results=int(max_results))
    try:
        detector = vision.ObjectDetector.create_from_options(options)
    except (RuntimeError, ValueError) as err:
        print(f"refused: {err}", file=sys.stderr)
        return 3
    results = []
    with detector:
        for pixels in load_images(images_path):
            height, width = pixels.shape[:2]
            image = mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(pixels))
            found = []
            for detection in detector.detect(image).detections:
                box, category = detection.bounding_box, detection.categories[0]
                found.append([category.index, category.category_name, float(category.score),
                              box.origin_y / height, box.origin_x / width, (box.origin_y + box.height) / height,
                              (box.origin_x + box.width) / width])
            results.append(found)
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


def load_images(path: str) -> list:
    """The images of an .npy array or of an .npz of arrays, in order."""
    loaded = np.load(path)
    return list(loaded) if isinstance(loaded, np.ndarray) else [loaded[f"arr_{i}"] for i in range(len(loaded.files))]


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
