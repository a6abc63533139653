"""Classify images with MediaPipe Tasks' ImageClassifier, as an app does.

Usage: python mediapipe_classify.py MODEL.tflite IMAGES.npy OUT.json
IMAGES: uint8 [N, H, W, 3] RGB at the model's input size (the crop the
caller compares on). OUT: per image, the top-5 [index, category name, score].
A refusal exits 3 with MediaPipe's message on stderr.
"""
import json
import sys

import numpy as np


def main(model: str, images_path: str, out_path: str) -> int:
    import mediapipe as mp
    from mediapipe.tasks.python import BaseOptions, vision

    options = vision.ImageClassifierOptions(base_options=BaseOptions(model_asset_path=model), max_results=5)
    try:
        classifier = vision.ImageClassifier.create_from_options(options)
    except (RuntimeError, ValueError) as err:
        print(f"refused: {err}", file=sys.stderr)
        return 3
    results = []
    with classifier:
        for pixels in np.load(images_path):
            image = mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(pixels))
            categories = classifier.classify(image).classifications[0].categories
            results.append([[c.index, c.category_name, float(c.score)] for c in categories])
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
