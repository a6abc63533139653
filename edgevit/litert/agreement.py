"""How closely a converted model follows its Keras original."""
from __future__ import annotations

import numpy as np


def agreement(reference: np.ndarray, candidate: np.ndarray) -> dict:
    """Top-1 agreement, logit cosine (mean/min) and max abs logit error over a
    batch of [N, classes] outputs. Over a segmenter's maps, [N, h, w,
    classes], each pixel is a row: ``top1_agreement`` is the argmax's
    agreement over pixels and the cosines are the pixels' logit vectors'
    (``pixels`` counts them; ``samples`` the images)."""
    if reference.ndim == 4:
        return {**agreement(reference.reshape(-1, reference.shape[-1]), candidate.reshape(-1, candidate.shape[-1])),
                "samples": int(len(reference)), "pixels": int(np.prod(reference.shape[:3]))}
    ref, cand = reference.astype(np.float64), candidate.astype(np.float64)
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    # two all-zero rows agree (an int8 file's logits can be exactly zero where the model's are); one is no direction
    both_zero = ~ref.any(axis=1) & ~cand.any(axis=1)
    cosine = np.where(norms > 0, (ref * cand).sum(axis=1) / np.maximum(norms, 1e-30), both_zero.astype(np.float64))
    top5_ref = np.argsort(-ref, axis=1)[:, :5]
    top5_cand = np.argsort(-cand, axis=1)[:, :5]
    top5_overlap = (top5_ref[:, :, None] == top5_cand[:, None, :]).any(axis=2).mean()
    return {
        "samples": int(len(ref)),
        "top1_agreement": float(np.mean(ref.argmax(1) == cand.argmax(1))),
        "top5_overlap": float(top5_overlap),
        "cosine_mean": float(cosine.mean()),
        "cosine_min": float(cosine.min()),
        "max_abs_logit_error": float(np.abs(ref - cand).max()),
        "reference_logit_range": [float(ref.min()), float(ref.max())],
    }


def per_image(outputs: np.ndarray, images: int) -> np.ndarray:
    """A run's outputs of ``images`` images as :func:`agreement` compares
    them: a map per image where each one's output is a segmenter's ([1, h,
    w, classes]), so that pixels are compared; a row per image otherwise."""
    if outputs.ndim >= 4 and int(np.prod(outputs.shape[-3:])) * images == outputs.size:
        return outputs.reshape(images, *outputs.shape[-3:])
    return outputs.reshape(images, -1)


def probability_agreement(reference: np.ndarray, candidate: np.ndarray) -> dict:
    """Top-1 agreement and probability errors of a file that outputs
    probabilities, against the Keras model's softmax, over [N, classes].
    ``top1_ties``: images whose top-1 differs where the file holds the Keras
    model's top class within one output step (1/256 in int8) of its own top
    class: a tie at the file's resolution."""
    ref, cand = reference.astype(np.float64), candidate.astype(np.float64)
    picked, wanted = cand.argmax(1), ref.argmax(1)
    rows = np.arange(len(ref))
    differ = picked != wanted
    ties = differ & (cand[rows, picked] - cand[rows, wanted] <= 1.0 / 256 + 1e-9)
    return {
        "samples": int(len(ref)),
        "top1_agreement": float(np.mean(~differ)),
        "top1_ties": int(ties.sum()),
        "max_abs_probability_error": float(np.abs(ref - cand).max()),
        "top1_probability_mean": [float(ref[rows, wanted].mean()), float(cand[rows, picked].mean())],
    }
