"""Detect objects with the TFLite Task Library's ObjectDetector
(tflite-support), as an app does. Runs in its own virtual environment:
tflite-support pins protobuf < 4, which TensorFlow 2.21 cannot share.

Usage: python task_library_detect.py MODEL.tflite IMAGES.npy OUT.json [SCORE_THRESHOLD MAX_RESULTS]
(as mediapipe_detect.py).
"""
import json
import sys

import numpy as np


def load_images(path: str) -> list:
    """The images of an .npy array or of an .npz of arrays, in order."""
    loaded = np.load(path)
    return list(loaded) if isinstance(loaded, np.ndarray) else [loaded[f"arr_{i}"] for i in range(len(loaded.files))]


def main(model: str, images_path: str, out_path: str, score_threshold: str = "0", max_results: str = "-1") -> int:
    from tflite_support.task import core, processor, vision

    detection = processor.DetectionOptions(score_threshold=float(score_threshold), max_results=int(max_results))
    options = vision.ObjectDetectorOptions(base_options=core.BaseOptions(file_name=model), detection_options=detection)
    try:
        detector = vision.ObjectDetector.create_from_options(options)
    except (RuntimeError, ValueError) as err:
        print(f"refused: {err}", file=sys.stderr)
        return 3
    results = []
    for pixels in load_images(images_path):
        height, width = pixels.shape[:2]
        found = []
        for detection in detector.detect(vision.TensorImage.create_from_array(np.ascontiguousarray(pixels))).detections:
            box, category = detection.bounding_box, detection.categories[0]
            found.append([category.index, category.category_name, float(category.score), box.origin_y / height,
                          box.origin_x / width, (box.origin_y + box.height) / height,
                          (box.origin_x + box.width) / width])
        results.append(found)
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
