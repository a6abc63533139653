"""Segment images with the TFLite Task Library's ImageSegmenter
(tflite-support), as an app does. Runs in its own virtual environment
(see task_library_classify.py).

Usage: python task_library_segment.py MODEL.tflite IMAGES.npy OUT.npz
IMAGES: uint8 [N, H, W, 3] RGB. OUT: ``category`` uint8 [N, h, w] (the
category masks, at the model's output size: the Task Library leaves
upsampling to the app), ``confidence`` float32 [N, classes, h, w] and
``labels`` (the category names it read from the file). A refusal exits 3
with the Task Library's message on stderr.
"""
import sys

import numpy as np


def main(model: str, images_path: str, out_path: str) -> int:
    from tflite_support.task import core, processor, vision

    def segmenter(output_type):
        options = vision.ImageSegmenterOptions(base_options=core.BaseOptions(file_name=model),
                                               segmentation_options=processor.SegmentationOptions(
                                                   output_type=output_type))
        return vision.ImageSegmenter.create_from_options(options)

    try:  # one segmenter per mask kind: the Task Library gives one kind per run
        by_category, by_confidence = (segmenter(processor.OutputType.CATEGORY_MASK),
                                      segmenter(processor.OutputType.CONFIDENCE_MASK))
    except (RuntimeError, ValueError) as err:
        print(f"refused: {err}", file=sys.stderr)
        return 3
    categories, confidences, labels = [], [], []
    for pixels in np.load(images_path):
        image = vision.TensorImage.create_from_array(np.ascontiguousarray(pixels))
        segmentation = by_category.segment(image).segmentations[0]
        categories.append(segmentation.category_mask.copy())
        labels = [label.category_name for label in segmentation.colored_labels]
        masks = by_confidence.segment(image).segmentations[0].confidence_masks
        confidences.append(np.stack([np.asarray(m.value, np.float32) for m in masks]))
    np.savez(out_path, category=np.stack(categories), confidence=np.stack(confidences), labels=np.array(labels))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
