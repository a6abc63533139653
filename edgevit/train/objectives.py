"""What a training step minimises and what validation counts, by task.

The training loop (:mod:`edgevit.train.loop`) and validation
(:mod:`edgevit.train.validation`) know a task only through its objective:

- ``units(targets)``: what the loss is the mean over (images, the pixels
  a mask counts, or the anchors matched to a box), summed across replicas
  by the step;
- ``loss_sum(logits, targets)`` and ``hits(logits, targets)``: the summed
  loss and the units predicted right, on one replica;
- ``counts(logits, targets, real)`` and ``metrics(counts)``: what
  validation sums across replicas and what it reports (``metric`` names
  the figure a run keeps and compares epochs by).
"""
from __future__ import annotations

from edgevit.data.masks import IGNORE_INDEX


class Classification:
    """Cross-entropy with label smoothing on one label an image; top-1."""
    metric = "val_top1"
    train_metric = "train_top1"

    def __init__(self, classes: int, label_smoothing: float = 0.1):
        self.classes, self.smoothing = classes, label_smoothing

    def units(self, targets):
        import tensorflow as tf

        return tf.cast(tf.shape(targets)[0], tf.float32)

    def loss_sum(self, logits, targets):
        import keras
        import tensorflow as tf

        target = tf.one_hot(targets, self.classes) * (1.0 - self.smoothing) + self.smoothing / self.classes
        return tf.reduce_sum(keras.losses.categorical_crossentropy(target, logits, from_logits=True))

    def hits(self, logits, targets):
        import tensorflow as tf

        return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), targets), tf.float32))

    def counts(self, logits, targets, real):
        """[correct, images] of the real places."""
        import tensorflow as tf

        real = tf.cast(real, tf.float32)
        return tf.stack([tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), targets), tf.float32) * real),
                         tf.reduce_sum(real)])

    def metrics(self, counts) -> dict:
        correct, images = (float(v) for v in counts)
        return {self.metric: round(correct / images, 4) if images else None}


class Segmentation:
    """Per-pixel cross-entropy over the pixels a mask counts (255: none),
    the logits resized bilinearly from the output stride to the mask, as
    the reference DeepLabV3 recipes train; validation's mean IoU."""
    metric = "val_miou"
    train_metric = "train_pixel_accuracy"

    def __init__(self, classes: int, ignore: int = IGNORE_INDEX):
        self.classes, self.ignore = classes, ignore

    def _at_mask_size(self, logits, targets):
        import tensorflow as tf

        return tf.image.resize(logits, tf.shape(targets)[1:3], method="bilinear")

    def units(self, targets):
        import tensorflow as tf

        return tf.reduce_sum(tf.cast(tf.not_equal(targets, self.ignore), tf.float32))

    def loss_sum(self, logits, targets):
        import tensorflow as tf

        counted = tf.not_equal(targets, self.ignore)
        labels = tf.where(counted, tf.cast(targets, tf.int32), 0)
        per_pixel = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, self._at_mask_size(logits, targets))
        return tf.reduce_sum(per_pixel * tf.cast(counted, tf.float32))

    def hits(self, logits, targets):
        import tensorflow as tf

        predicted = tf.argmax(self._at_mask_size(logits, targets), -1, output_type=tf.int32)
        right = tf.logical_and(tf.equal(predicted, tf.cast(targets, tf.int32)), tf.not_equal(targets, self.ignore))
        return tf.reduce_sum(tf.cast(right, tf.float32))

    def counts(self, logits, targets, real):
        """The [classes, classes] confusion of the real places' counted pixels, flattened."""
        import tensorflow as tf

        predicted = tf.argmax(self._at_mask_size(logits, targets), -1, output_type=tf.int32)
        counted = tf.logical_and(tf.not_equal(targets, self.ignore),
                                 tf.cast(real, tf.bool)[:, None, None])
        pairs = tf.boolean_mask(tf.cast(targets, tf.int32) * self.classes + predicted, counted)
        return tf.cast(tf.math.bincount(pairs, minlength=self.classes ** 2, maxlength=self.classes ** 2),
                       tf.float32)

    def metrics(self, counts) -> dict:
        import numpy as np

        confusion = np.asarray(counts, np.float64).reshape(self.classes, self.classes)
        hits = np.diag(confusion)
        union = confusion.sum(0) + confusion.sum(1) - hits
        iou = hits[union > 0] / union[union > 0]
        pixels = confusion.sum()
        return {self.metric: round(float(iou.mean()), 4) if len(iou) else None,
                "val_pixel_accuracy": round(float(hits.sum() / pixels), 4) if pixels else None}


class Detection:
    """cvnets' SSD multibox loss: the anchors matched to the boxes
    (:func:`edgevit.models.box_coding.match`), smooth L1 on the
    regressions of the matched anchors, and cross-entropy on the matched
    anchors and the NEG_POS_RATIO times as many background anchors the
    model finds hardest (hard negative mining, per image), both summed and
    divided by the matched anchors. The model's outputs are (boxes
    [N, A, 4], scores [N, A, classes] logits); the targets
    :class:`~edgevit.data.targets.Boxes`' [N, MAX_BOXES, 5].

    Validation counts the same loss over the validation images (mAP needs
    the whole set's detections: `edgevit eval` reports it), and how many
    matched anchors the model classifies right."""
    metric = "val_loss"
    train_metric = "train_anchor_accuracy"
    NEG_POS_RATIO = 3

    def __init__(self, classes: int, anchors):
        import numpy as np

        self.classes, self.anchors = classes, np.asarray(anchors, np.float32)

    def _matched(self, targets):
        from edgevit.models import box_coding

        return box_coding.match(targets[..., :4], targets[..., 4], self.anchors)

    def units(self, targets):
        import tensorflow as tf

        return tf.reduce_sum(tf.cast(self._matched(targets)[1] > 0, tf.float32))

    def loss_sum(self, outputs, targets):
        import tensorflow as tf

        regressions, logits = outputs
        wanted, labels = self._matched(targets)
        positive = labels > 0
        difference = tf.abs(regressions - wanted)
        smooth_l1 = tf.where(difference < 1.0, 0.5 * difference ** 2, difference - 0.5)
        box_loss = tf.reduce_sum(tf.reduce_sum(smooth_l1, -1) * tf.cast(positive, tf.float32))
        class_loss = -tf.gather(tf.nn.log_softmax(logits, -1), labels, batch_dims=2)
        return box_loss + tf.reduce_sum(class_loss * tf.cast(self.counted(logits, labels), tf.float32))

    def counted(self, logits, labels):
        """[N, A] the anchors the classification loss counts: the matched
        ones and, in each image, the NEG_POS_RATIO times as many background
        anchors whose background loss is highest."""
        import tensorflow as tf

        positive = labels > 0
        background_loss = tf.stop_gradient(tf.where(positive, -float("inf"), -tf.nn.log_softmax(logits, -1)[..., 0]))
        # each anchor's rank by its background loss, hardest first (cvnets sorts twice, as here)
        rank = tf.argsort(tf.argsort(background_loss, -1, direction="DESCENDING", stable=True), -1, stable=True)
        negatives = self.NEG_POS_RATIO * tf.reduce_sum(tf.cast(positive, tf.int32), -1, keepdims=True)
        return tf.logical_or(positive, rank < negatives)

    def hits(self, outputs, targets):
        import tensorflow as tf

        labels = self._matched(targets)[1]
        right = tf.logical_and(labels > 0, tf.equal(tf.argmax(outputs[1], -1, output_type=tf.int32), labels))
        return tf.reduce_sum(tf.cast(right, tf.float32))

    def counts(self, outputs, targets, real):
        """[loss sum, matched anchors, matched anchors classified right] of the real places."""
        import tensorflow as tf

        # a place without an image keeps no box, hence no anchor: it adds nothing
        targets = targets * tf.cast(real, targets.dtype)[:, None, None]
        return tf.stack([self.loss_sum(outputs, targets), self.units(targets), self.hits(outputs, targets)])

    def metrics(self, counts) -> dict:
        loss, matched, right = (float(v) for v in counts)
        return {self.metric: round(loss / matched, 4) if matched else None,
                "val_anchor_accuracy": round(right / matched, 4) if matched else None}


def objective_for(model, label_smoothing: float = 0.1) -> Classification | Segmentation | Detection:
    """The objective of ``model``'s task: a model whose output is a map of
    class scores ([N, H, W, classes]) segments, one with boxes and scores
    detects."""
    from edgevit.models.ssdlite import anchor_boxes, is_detector

    if is_detector(model):
        return Detection(int(model.outputs[1].shape[-1]), anchor_boxes(model))
    classes = int(model.outputs[0].shape[-1])
    if len(model.outputs[0].shape) == 4:
        return Segmentation(classes)
    return Classification(classes, label_smoothing)
