"""Segment images with MediaPipe Tasks' ImageSegmenter, as an app does.

Usage: python mediapipe_segment.py MODEL.tflite IMAGES.npy OUT.npz
IMAGES: uint8 [N, H, W, 3] RGB (the crops the caller compares on). OUT:
``category`` uint8 [N, H, W] (the category masks), ``confidence`` float32
[N, classes, H, W] (the confidence masks) and ``labels`` (the segmenter's
labels, as it read them from the file). A refusal exits 3 with MediaPipe's
message on stderr.
"""
import sys

import numpy as np


def main(model: str, images_path: str, out_path: str) -> int:
    import mediapipe as mp
    from mediapipe.tasks.python import BaseOptions, vision

    options = vision.ImageSegmenterOptions(base_options=BaseOptions(model_asset_path=model),
                                           output_category_mask=True, output_confidence_masks=True)
    try:
        segmenter = vision.ImageSegmenter.create_from_options(options)
    except (RuntimeError, ValueError) as err:
        print(f"refused: {err}", file=sys.stderr)
        return 3
    categories, confidences = [], []
    with segmenter:
        labels = list(segmenter.labels)
        for pixels in np.load(images_path):
            image = mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(pixels))
            result = segmenter.segment(image)
            categories.append(result.category_mask.numpy_view()[..., 0].copy())
            confidences.append(np.stack([m.numpy_view()[..., 0].copy() for m in result.confidence_masks]))
    np.savez(out_path, category=np.stack(categories), confidence=np.stack(confidences), labels=np.array(labels))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
