"""Classify images with the TFLite Task Library's ImageClassifier
(tflite-support), as an app does. Runs in its own virtual environment:
tflite-support pins protobuf < 4, which TensorFlow 2.21 cannot share.

Usage: python task_library_classify.py MODEL.tflite IMAGES.npy OUT.json
(as mediapipe_classify.py).
"""
import json
import sys

import numpy as np


def main(model: str, images_path: str, out_path: str) -> int:
    from tflite_support.task import core, processor, vision

    options = vision.ImageClassifierOptions(base_options=core.BaseOptions(file_name=model),
                                            classification_options=processor.ClassificationOptions(max_results=5))
    try:
        classifier = vision.ImageClassifier.create_from_options(options)
    except (RuntimeError, ValueError) as err:
        print(f"refused: {err}", file=sys.stderr)
        return 3
    results = []
    for pixels in np.load(images_path):
        categories = classifier.classify(vision.TensorImage.create_from_array(np.ascontiguousarray(pixels)))
        results.append([[c.index, c.category_name, float(c.score)] for c in categories.classifications[0].categories])
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
