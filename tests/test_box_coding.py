"""SSD box arithmetic (edgevit.models.box_coding) and the multibox loss
(edgevit.train.objectives.Detection): by hand on small cases, and against
cvnets' own matching and hard negative mining where its mirror is here."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgevit.models import box_coding
from edgevit.train.objectives import Detection

CVNETS = Path("/work/.mirror/apple+ml-cvnets/repo")


def _anchors(rng, count=60):
    centre = rng.uniform(0.1, 0.9, (count, 2))
    size = rng.uniform(0.05, 0.6, (count, 2))
    return np.concatenate([centre, size], 1).astype(np.float32)


def _boxes(rng, count):
    low = rng.uniform(0, 0.7, (count, 2))
    return np.concatenate([low, low + rng.uniform(0.05, 0.3, (count, 2))], 1).astype(np.float32)


def test_encode_and_decode_invert_each_other_with_the_variances():
    anchors = np.array([[0.5, 0.5, 0.2, 0.4]], np.float32)
    box = np.array([[0.45, 0.2, 0.65, 0.6]], np.float32)          # centre (0.55, 0.4), size (0.2, 0.4)
    np.testing.assert_allclose(box_coding.encode(box, anchors), [[2.5, -2.5, 0.0, 0.0]], atol=1e-5)
    np.testing.assert_allclose(box_coding.decode(box_coding.encode(box, anchors), anchors), box, atol=1e-6)
    np.testing.assert_allclose(box_coding.decode(np.array([[0, 0, 5, 0]], np.float32), anchors),
                               [[0.5 - 0.1 * np.e, 0.3, 0.5 + 0.1 * np.e, 0.7]], atol=1e-6)


def test_iou_in_numpy_and_tensorflow_agree():
    import tensorflow as tf

    a = np.array([[0, 0, 1, 1], [0, 0, 0.5, 0.5], [0.2, 0.2, 0.2, 0.6]], np.float32)
    b = np.array([[0, 0, 0.5, 1], [0.25, 0.25, 0.75, 0.75], [0.2, 0.2, 0.2, 0.6]], np.float32)
    expected = [0.5, 0.0625 / (0.25 + 0.25 - 0.0625), 0.0]
    np.testing.assert_allclose(box_coding.iou(a, b), expected, atol=1e-6)
    np.testing.assert_allclose(box_coding.iou(tf.constant(a), tf.constant(b)).numpy(), expected, atol=1e-6)


def test_matching_forces_each_box_its_best_anchor_and_pads_nothing():
    anchors = np.array([[0.25, 0.25, 0.5, 0.5], [0.75, 0.75, 0.5, 0.5], [0.4, 0.4, 0.5, 0.5]], np.float32)
    boxes = np.zeros((1, 3, 4), np.float32)
    boxes[0, 0] = [0.0, 0.0, 0.5, 0.5]          # anchor 0 exactly; anchor 2 IoU 0.32 (< 0.5: background)
    boxes[0, 1] = [0.7, 0.7, 0.9, 0.9]          # IoU 0.16 with anchor 1: forced
    classes = np.array([[3, 1, 0]])             # the last row pads
    targets, labels = box_coding.match(boxes, classes, anchors)
    np.testing.assert_array_equal(labels.numpy(), [[3, 1, 0]])
    np.testing.assert_allclose(targets.numpy()[0, 0], 0, atol=1e-6)
    np.testing.assert_allclose(targets.numpy()[0, 1], box_coding.encode(boxes[0, 1], anchors[1]), atol=1e-5)
    _, none = box_coding.match(np.zeros((1, 2, 4)), np.zeros((1, 2)), anchors)
    assert not none.numpy().any()


CVNETS_MATCH = """
import sys, numpy as np, torch
source = sys.stdin.read()
scope = {}
exec(compile(source, "ssd_utils.py", "exec"), scope)
data = np.load(sys.argv[1])
boxes, labels = scope["assign_priors"](torch.from_numpy(data["boxes"]), torch.from_numpy(data["classes"]),
                                       torch.from_numpy(data["anchor_corners"]), 0.5)
loss = torch.from_numpy(data["background_loss"])
mask = scope["hard_negative_mining"](loss.clone(), torch.from_numpy(data["labels"]), 3)
np.savez(sys.argv[2], boxes=boxes.numpy(), labels=labels.numpy(), mask=mask.numpy())
"""


@pytest.mark.skipif(not CVNETS.is_dir(), reason="needs the ml-cvnets mirror")
def test_matching_and_hard_negatives_match_cvnets(tmp_path):
    pytest.importorskip("torch")
    import tensorflow as tf

    rng = np.random.default_rng(3)
    anchors, boxes = _anchors(rng, 300), _boxes(rng, 6)
    classes = rng.integers(1, 5, 6)
    background_loss = rng.uniform(0, 5, (2, 300)).astype(np.float32)
    targets, labels = box_coding.match(boxes[None], classes[None], anchors)
    both_labels = np.concatenate([labels.numpy(), np.roll(labels.numpy(), 7, 1)])
    np.savez(tmp_path / "in.npz", boxes=boxes, classes=classes.astype(np.int64),
             anchor_corners=box_coding.corners(anchors), background_loss=background_loss, labels=both_labels)
    source = subprocess.run(["git", "--git-dir", str(CVNETS), "show", "HEAD:cvnets/misc/third_party/ssd_utils.py"],
                            capture_output=True, text=True, check=True).stdout
    subprocess.run([sys.executable, "-c", CVNETS_MATCH, str(tmp_path / "in.npz"),
                    str(tmp_path / "out.npz")], input=source, text=True, check=True)
    theirs = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(labels.numpy()[0], theirs["labels"])
    positive = theirs["labels"] > 0
    assert positive.sum() >= 6
    np.testing.assert_allclose(targets.numpy()[0][positive],
                               box_coding.encode(theirs["boxes"][positive], anchors[positive]), atol=1e-4)
    # the loss's hard negatives: the same anchors as cvnets' hard_negative_mining
    objective = Detection(5, anchors)
    logits = np.zeros((2, 300, 5), np.float32)
    logits[..., 0] = -background_loss                       # background loss = log(sum exp) - logit_0, ranked alike
    counted = objective.counted(tf.constant(logits), tf.constant(both_labels, tf.int32)).numpy()
    np.testing.assert_array_equal(counted, theirs["mask"])


def test_the_multibox_loss_by_hand():
    import tensorflow as tf

    anchors = np.array([[0.25, 0.25, 0.5, 0.5], [0.75, 0.75, 0.5, 0.5], [0.25, 0.75, 0.5, 0.5],
                        [0.75, 0.25, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0]], np.float32)
    targets = np.zeros((1, 2, 5), np.float32)
    targets[0, 0] = [0.0, 0.0, 0.5, 0.5, 2]                 # anchor 0 exactly (IoU with anchor 4: 0.25)
    objective = Detection(3, anchors)
    regressions = np.zeros((1, 5, 4), np.float32)
    regressions[0, 0] = [0.5, -2.0, 0, 0]                   # smooth L1: 0.125 + 1.5
    logits = np.zeros((1, 5, 3), np.float32)
    logits[0, 1:, 0] = [3.0, 2.0, 1.0, 0.0]                 # background losses fall: with 1 positive, 3 negatives
    logits[0, 0, 2] = 1.0
    loss = objective.loss_sum([tf.constant(regressions), tf.constant(logits)], tf.constant(targets)).numpy()
    ce = [np.log(np.exp(row).sum()) - row[label] for row, label in zip(logits[0], [2, 0, 0, 0, 0])]
    expected = 0.125 + 1.5 + ce[0] + sum(sorted(ce[1:], reverse=True)[:3])
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert objective.units(tf.constant(targets)).numpy() == 1
    assert objective.hits([tf.constant(regressions), tf.constant(logits)], tf.constant(targets)).numpy() == 1
    counts = objective.counts([tf.constant(regressions), tf.constant(logits)], tf.constant(targets),
                              tf.constant([False])).numpy()
    assert counts.tolist() == [0, 0, 0]


def test_per_class_nms_keeps_the_best_of_overlapping_boxes_within_a_class():
    boxes = np.array([[0, 0, 0.5, 0.5], [0.01, 0, 0.5, 0.5], [0.6, 0.6, 0.9, 0.9], [0, 0, 0.5, 0.5]], np.float32)
    probabilities = np.array([[0.1, 0.8, 0.1], [0.1, 0.85, 0.05], [0.5, 0.495, 0.005], [0.2, 0.1, 0.7]], np.float32)
    kept_boxes, scores, classes = box_coding.per_class_nms(boxes, probabilities)
    np.testing.assert_allclose(scores, [0.85, 0.7, 0.495])
    np.testing.assert_array_equal(classes, [1, 2, 1])
    np.testing.assert_array_equal(kept_boxes[0], boxes[1])
    assert box_coding.per_class_nms(boxes, probabilities, confidence=0.9)[0].shape == (0, 4)


def test_best_class_nms_suppresses_across_classes_each_anchor_as_its_best_class():
    """The boxes of the per-class case: the class-2 box over the same place
    as two class-1 boxes goes (one NMS over all classes); anchor 2 stands
    for class 1 (its background 0.5 is never a detection); the threshold,
    the confidence and the count cut as they say."""
    boxes = np.array([[0, 0, 0.5, 0.5], [0.01, 0, 0.5, 0.5], [0.6, 0.6, 0.9, 0.9], [0, 0, 0.5, 0.5],
                      [0.15, 0.1, 0.6, 0.6]], np.float32)
    probabilities = np.array([[0.1, 0.8, 0.1], [0.1, 0.85, 0.05], [0.5, 0.495, 0.005], [0.2, 0.1, 0.7],
                              [0.3, 0.05, 0.65]], np.float32)
    kept_boxes, scores, classes = box_coding.best_class_nms(boxes, probabilities, threshold=0.3)
    np.testing.assert_allclose(scores, [0.85, 0.495])
    np.testing.assert_array_equal(classes, [1, 1])
    np.testing.assert_array_equal(kept_boxes, boxes[[1, 2]])
    # box 4 overlaps box 1 by IoU 0.42: kept at 0.5, suppressed at 0.3
    assert box_coding.best_class_nms(boxes, probabilities, threshold=0.5)[1].tolist() == pytest.approx(
        [0.85, 0.65, 0.495])
    assert box_coding.best_class_nms(boxes, probabilities, threshold=0.5, detections=2)[2].tolist() == [1, 2]
    assert box_coding.best_class_nms(boxes, probabilities, confidence=0.9)[0].shape == (0, 4)
