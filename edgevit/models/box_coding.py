"""Box arithmetic of the SSD detectors, in one place: encoding boxes
against anchors and decoding them, IoU, SSD matching (which anchor answers
for which box) and per-class non-maximum suppression, as Apple's cvnets
trains and evaluates its SSDLite models.

Conventions (those of TFLite_Detection_PostProcess and MediaPipe, which
read the exported files): a box is (ymin, xmin, ymax, xmax), an anchor
(ycenter, xcenter, height, width), both normalised to [0, 1]; a regression
is (ty, tx, th, tw) with the centre scaled by 1 / CENTER_VARIANCE and the
log-size by 1 / SIZE_VARIANCE. cvnets computes the same numbers in
(x, y) order.

:func:`encode`, :func:`decode` and :func:`iou` take numpy arrays or
TensorFlow tensors alike (the training loss matches in the graph,
evaluation decodes in numpy); :func:`match` is TensorFlow's, batched;
:func:`per_class_nms` numpy's.
"""
from __future__ import annotations

import numpy as np

CENTER_VARIANCE = 0.1
SIZE_VARIANCE = 0.2
# An anchor whose best IoU with a box is below this is background (cvnets' SSD recipes: --matcher.ssd.iou-threshold).
MATCH_IOU = 0.5
# Evaluation's post-processing (cvnets' SSD defaults): class probabilities above CONFIDENCE, at most TOP_K boxes a
# class before NMS at NMS_IOU, at most DETECTIONS boxes an image after it.
CONFIDENCE = 0.01
TOP_K = 400
NMS_IOU = 0.5
DETECTIONS = 200


def _xp(*arrays):
    """numpy, or TensorFlow's numpy API when any of ``arrays`` is a tensor."""
    if all(isinstance(a, (np.ndarray, np.generic, list, tuple, float, int)) for a in arrays):
        return np
    import tensorflow.experimental.numpy as tnp

    return tnp


def corners(anchors):
    """(ycenter, xcenter, height, width) -> (ymin, xmin, ymax, xmax)."""
    xp = _xp(anchors)
    centre, size = anchors[..., :2], anchors[..., 2:]
    return xp.concatenate([centre - size / 2, centre + size / 2], -1)


def centres(boxes):
    """(ymin, xmin, ymax, xmax) -> (ycenter, xcenter, height, width)."""
    xp = _xp(boxes)
    return xp.concatenate([(boxes[..., :2] + boxes[..., 2:]) / 2, boxes[..., 2:] - boxes[..., :2]], -1)


def encode(boxes, anchors):
    """Regressions (ty, tx, th, tw) of ``boxes`` [..., 4] against ``anchors`` [..., 4] (broadcast)."""
    xp = _xp(boxes, anchors)
    centred = centres(boxes)
    return xp.concatenate([(centred[..., :2] - anchors[..., :2]) / anchors[..., 2:] / CENTER_VARIANCE,
                           xp.log(centred[..., 2:] / anchors[..., 2:]) / SIZE_VARIANCE], -1)


def decode(regressions, anchors):
    """Boxes (ymin, xmin, ymax, xmax) of ``regressions`` [..., 4] against ``anchors`` [..., 4] (broadcast)."""
    xp = _xp(regressions, anchors)
    centre = regressions[..., :2] * CENTER_VARIANCE * anchors[..., 2:] + anchors[..., :2]
    size = xp.exp(regressions[..., 2:] * SIZE_VARIANCE) * anchors[..., 2:]
    return corners(xp.concatenate([centre, size], -1))


def iou(a, b):
    """IoU of boxes ``a`` [..., 4] and ``b`` [..., 4] (broadcast), corners
    (ymin, xmin, ymax, xmax); 0 where both are empty."""
    xp = _xp(a, b)
    low, high = xp.maximum(a[..., :2], b[..., :2]), xp.minimum(a[..., 2:], b[..., 2:])
    overlap = xp.prod(xp.maximum(high - low, 0), -1)
    area_a = xp.prod(xp.maximum(a[..., 2:] - a[..., :2], 0), -1)
    area_b = xp.prod(xp.maximum(b[..., 2:] - b[..., :2], 0), -1)
    union = area_a + area_b - overlap
    return xp.where(union > 0, overlap / xp.where(union > 0, union, 1), 0)


def match(boxes, classes, anchors, threshold: float = MATCH_IOU):
    """SSD matching of a batch, in TensorFlow (cvnets' ``assign_priors``):
    each anchor takes the box it overlaps most, and each box takes the
    anchor that overlaps it most whatever the IoU (a later box wins an
    anchor two boxes choose); an anchor whose IoU stays below ``threshold``
    is background (class 0).

    ``boxes`` [N, M, 4] corners, ``classes`` [N, M] int (>= 1 for a box,
    0 for a padding row), ``anchors`` [A, 4] centre form -> (regression
    targets [N, A, 4], classes [N, A] int32)."""
    import tensorflow as tf

    boxes, anchors = tf.cast(boxes, tf.float32), tf.cast(anchors, tf.float32)
    classes = tf.cast(classes, tf.int32)
    real = classes > 0                                                     # [N, M]
    overlaps = iou(corners(anchors)[None, :, None, :], boxes[:, None, :, :])  # [N, A, M]
    overlaps = tf.where(real[:, None, :], overlaps, -1.0)
    best_box = tf.argmax(overlaps, -1, output_type=tf.int32)              # [N, A]
    best_iou = tf.reduce_max(overlaps, -1)
    anchor_count = tf.shape(anchors)[0]
    best_anchor = tf.argmax(overlaps, 1, output_type=tf.int32)            # [N, M]
    chosen = tf.logical_and(tf.equal(tf.range(anchor_count)[None, :, None], best_anchor[:, None, :]),
                            real[:, None, :])                              # [N, A, M]
    order = tf.range(1, tf.shape(boxes)[1] + 1)[None, None, :]
    forced = tf.reduce_max(tf.where(chosen, order, 0), -1)                # the last box that chose each anchor, 1-based
    best_box = tf.where(forced > 0, forced - 1, best_box)
    best_iou = tf.where(forced > 0, 2.0, best_iou)
    matched = tf.gather(classes, best_box, batch_dims=1)
    matched = tf.where(best_iou < threshold, 0, matched)
    targets = encode(tf.gather(boxes, best_box, batch_dims=1), anchors[None])
    # a background anchor's target is never read; a padding row's zero box would give log(0)
    return tf.where(matched[..., None] > 0, targets, 0.0), matched


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float = NMS_IOU) -> np.ndarray:
    """Indices of ``boxes`` [K, 4] kept by greedy NMS, highest score first: a
    box goes when its IoU with a kept, higher-scoring one exceeds ``threshold``."""
    order = np.argsort(-scores, kind="stable")
    overlaps = iou(boxes[order][:, None], boxes[order][None])
    suppressed = np.zeros(len(order), bool)
    for i in range(len(order)):
        if not suppressed[i]:
            suppressed[i + 1:] |= overlaps[i, i + 1:] > threshold
    return order[~suppressed]


def per_class_nms(boxes: np.ndarray, probabilities: np.ndarray, confidence: float = CONFIDENCE, top_k: int = TOP_K,
                  threshold: float = NMS_IOU, detections: int = DETECTIONS):
    """One image's detections as cvnets evaluates its SSD models: for each
    class but the background (0), the boxes whose probability exceeds
    ``confidence``, its ``top_k`` best, NMS within the class; then the
    ``detections`` best of all classes. ``boxes`` [A, 4] decoded corners,
    ``probabilities`` [A, classes] -> (boxes [D, 4], scores [D], classes [D])."""
    kept_boxes, kept_scores, kept_classes = [], [], []
    for cls in range(1, probabilities.shape[1]):
        candidates = np.flatnonzero(probabilities[:, cls] > confidence)
        if not len(candidates):
            continue
        candidates = candidates[np.argsort(-probabilities[candidates, cls], kind="stable")[:top_k]]
        keep = candidates[nms(boxes[candidates], probabilities[candidates, cls], threshold)]
        kept_boxes.append(boxes[keep])
        kept_scores.append(probabilities[keep, cls])
        kept_classes.append(np.full(len(keep), cls, np.int64))
    if not kept_boxes:
        return np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64)
    boxes, scores, classes = (np.concatenate(v) for v in (kept_boxes, kept_scores, kept_classes))
    best = np.argsort(-scores, kind="stable")[:detections]
    return boxes[best], scores[best], classes[best]


def best_class_nms(boxes: np.ndarray, probabilities: np.ndarray, confidence: float = CONFIDENCE,
                   threshold: float = NMS_IOU, detections: int = DETECTIONS):
    """One image's detections as TFLite_Detection_PostProcess's fast NMS and
    MediaPipe's ObjectDetector on a raw file find them: each anchor's best
    class but the background (0) and its probability, the anchors whose
    probability exceeds ``confidence``, one NMS over all classes (a box goes
    when it overlaps a better one of any class by more than ``threshold``),
    then the ``detections`` best. Arguments and result as :func:`per_class_nms`."""
    classes = probabilities[:, 1:].argmax(1) + 1
    scores = probabilities[np.arange(len(classes)), classes]
    candidates = np.flatnonzero(scores > confidence)
    keep = candidates[nms(boxes[candidates], scores[candidates], threshold)][:detections]
    return boxes[keep].astype(np.float32), scores[keep].astype(np.float32), classes[keep].astype(np.int64)
