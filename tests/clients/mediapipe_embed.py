"""Embed images with MediaPipe Tasks' ImageEmbedder, unnormalised and unquantised.

Usage: python mediapipe_embed.py MODEL.tflite IMAGES.npz OUT.npy
IMAGES: images of their own sizes (.npz of arr_0, arr_1, ... as numpy.savez
writes them). OUT: float32 [N, D], each image's embedding as the model
outputs it. With a model whose output is its input's pixels, the pixels
MediaPipe's image preprocessing (the ObjectDetector's too) feeds a model.
A refusal exits 3 with MediaPipe's message on stderr.
"""
import sys

import numpy as np
from mediapipe_detect import load_images


def main(model: str, images_path: str, out_path: str) -> int:
    import mediapipe as mp
    from mediapipe.tasks.python import BaseOptions, vision

    options = vision.ImageEmbedderOptions(base_options=BaseOptions(model_asset_path=model), l2_normalize=False,
                                          quantize=False)
    try:
        embedder = vision.ImageEmbedder.create_from_options(options)
    except (RuntimeError, ValueError) as err:
        print(f"refused: {err}", file=sys.stderr)
        return 3
    with embedder:
        embeddings = [embedder.embed(mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(pixels)))
                      .embeddings[0].embedding for pixels in load_images(images_path)]
    np.save(out_path, np.asarray(embeddings, np.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
