"""What the export does differently for an SSD detector (a model with the
two outputs of edgevit.models.ssdlite: box regressions and class logits).

The file computes each class's softmax score and leaves the background
(class 0) out, so its scores [1, A, C - 1] are what MediaPipe's
ObjectDetector shows as they are (the metadata tells it not to apply a
sigmoid) and every label is an object: MediaPipe keeps each anchor's best
column, and a background column would win most anchors. A score calibration
over raw logits cannot do this: it maps each logit alone, and a softmax
needs every class's. In int8 the softmax writes its 1/256 grid, which the
uint8 output keeps exactly.

Two forms: the raw one (default; Model Maker's): the boxes and scores, the
anchors and the box decoding in the metadata, every op on the delegates;
with ``add_postprocessing_op`` the detection post-processing op appended
(:mod:`edgevit.litert.detection_postprocess`), what the TFLite Task Library
requires, run by LiteRT's CPU kernel.
"""
from __future__ import annotations

import numpy as np

from edgevit.data.labels import default_labels
from edgevit.litert.agreement import agreement
from edgevit.litert.detection_postprocess import POSTPROCESS_OP, Suppression, with_postprocess
from edgevit.litert.metadata import BOX_ENCODINGS, DETECTION_BOXES
from edgevit.litert.standard_metadata import NMS_FORM, RAW_FORM
from edgevit.saving import class_names_of

# The post-processing op's options `edgevit convert --add-postprocessing-op` writes.
SUPPRESSION = Suppression()
# The background's column of a detector's class logits (the contract of edgevit.models.ssdlite).
BACKGROUND = 0
# What the file's scores are, as the metadata's detection block says
SCORES = "softmax over the model's classes, the background (class 0) left out"


def anchors_of(model) -> np.ndarray:
    """The model's anchors, [A, 4] (ycenter, xcenter, height, width) normalised."""
    from edgevit.models.ssdlite import anchor_boxes

    return anchor_boxes(model)


def box_scales() -> tuple[float, float, float, float]:
    """(y, x, h, w): what the box regressions are divided by before decoding
    (the inverse of the variances they were encoded with)."""
    from edgevit.models.box_coding import CENTER_VARIANCE, SIZE_VARIANCE

    return 1 / CENTER_VARIANCE, 1 / CENTER_VARIANCE, 1 / SIZE_VARIANCE, 1 / SIZE_VARIANCE


def object_labels(model) -> list[str]:
    """The names of the classes the file scores: the model's without the background."""
    names = class_names_of(model)
    if names:
        return [name for i, name in enumerate(names) if i != BACKGROUND]
    return default_labels(int(model.outputs[1].shape[-1]) - 1)


def with_form(content: bytes, model, add_postprocessing_op: bool, suppression: Suppression = SUPPRESSION) -> bytes:
    """The raw file as it is, or with the detection post-processing op."""
    if not add_postprocessing_op:
        return content
    return with_postprocess(content, anchors_of(model), box_scales(), suppression)


def detection_block(model, add_postprocessing_op: bool, graph_outputs: list[dict],
                    suppression: Suppression = SUPPRESSION) -> dict:
    """edgevit's metadata document's ``detection`` block: the file's form,
    every output in order, and how its boxes are coded."""
    block = {
        "form": NMS_FORM if add_postprocessing_op else RAW_FORM,
        "outputs": graph_outputs,
        "anchors": int(len(anchors_of(model))),
        "box_order": "ty, tx, th, tw",
        "box_scales": list(box_scales()),
        "scores": SCORES,
    }
    if add_postprocessing_op:
        block["postprocessing"] = {"op": POSTPROCESS_OP, "runs_on": "CPU (no delegate takes it)",
                                   "max_detections": suppression.max_detections,
                                   "iou_threshold": suppression.iou_threshold,
                                   "score_threshold": suppression.score_threshold,
                                   "use_regular_nms": False}
    return block


def output_kind(add_postprocessing_op: bool) -> str:
    return DETECTION_BOXES if add_postprocessing_op else BOX_ENCODINGS


def keras_scores(logits: np.ndarray) -> np.ndarray:
    """The Keras model's class logits as the file scores them."""
    z = np.exp(logits.astype(np.float64) - logits.max(axis=-1, keepdims=True))
    return np.delete(z / z.sum(axis=-1, keepdims=True), BACKGROUND, axis=-1)


def raw_agreement(keras_boxes: np.ndarray, keras_logits: np.ndarray, file_boxes: np.ndarray,
                  file_scores: np.ndarray, anchors: np.ndarray) -> dict:
    """The raw outputs of a file against the Keras model's ([N, A, 4] boxes,
    [N, A, C] scores): each anchor's top class (``top1_agreement``); each
    image's score map and box regressions as one vector, their cosine
    (``cosine_*``: what the verdict reads; an anchor whose scores are all
    near zero makes its own cosine noise) and largest error; and whether the
    two find the same confident detections (:func:`same_detections`)."""
    expected = keras_scores(keras_logits)
    classes = file_scores.shape[-1]
    top1 = agreement(expected.reshape(-1, classes), file_scores.reshape(-1, classes))["top1_agreement"]
    scores = agreement(expected.reshape(len(expected), -1), file_scores.reshape(len(file_scores), -1))
    boxes = agreement(keras_boxes.reshape(len(keras_boxes), -1), file_boxes.reshape(len(file_boxes), -1))
    found = [[confident_detections(regressions, probabilities, anchors) for regressions, probabilities in pairs]
             for pairs in zip(zip(keras_boxes, expected), zip(file_boxes, file_scores))]
    return {"samples": int(len(file_boxes)), "anchors": int(file_boxes.shape[1]),
            "top1_agreement": top1, "cosine_mean": scores["cosine_mean"],
            "cosine_min": scores["cosine_min"], "max_abs_score_error": scores["max_abs_logit_error"],
            "box_cosine_mean": boxes["cosine_mean"], "box_cosine_min": boxes["cosine_min"],
            "max_abs_box_error": boxes["max_abs_logit_error"],
            "detections_same": float(np.mean([same_detections(k, f) for k, f in found])),
            "detections": [sum(len(k[1]) for k, _ in found), sum(len(f[1]) for _, f in found)],
            "detection_score": CONFIDENT}


# A detection an app shows (its score at least this) is compared between the
# Keras model and the file; below it, int8's rounding of near-equal scores
# decides which of many weak boxes survive the suppression.
CONFIDENT = 0.5
# Two detections are the same when their classes are and their boxes overlap this much.
SAME_BOX_IOU = 0.5


def confident_detections(regressions: np.ndarray, probabilities: np.ndarray, anchors: np.ndarray):
    """One image's detections (boxes, classes) scoring at least CONFIDENT, as
    evaluation suppresses them (edgevit.models.box_coding, per class);
    ``probabilities`` without the background."""
    from edgevit.models.box_coding import decode, per_class_nms

    with_background = np.concatenate([np.zeros_like(probabilities[:, :1]), probabilities], axis=1)
    boxes, scores, classes = per_class_nms(decode(regressions, anchors), with_background)
    keep = scores >= CONFIDENT
    return boxes[keep], classes[keep]


def same_detections(expected, found) -> bool:
    """Whether two images' detections (boxes, classes) pair up one to one,
    each pair of one class with boxes overlapping at least SAME_BOX_IOU."""
    from edgevit.models.box_coding import iou

    (boxes, classes), (other_boxes, other_classes) = expected, found
    if len(classes) != len(other_classes):
        return False
    free = np.ones(len(other_classes), bool)
    for box, cls in zip(boxes, classes):
        candidates = np.flatnonzero(free & (other_classes == cls))
        overlaps = iou(box[None], other_boxes[candidates]).reshape(-1) if len(candidates) else np.zeros(0)
        if not len(candidates) or overlaps.max() < SAME_BOX_IOU:
            return False
        free[candidates[overlaps.argmax()]] = False
    return True
