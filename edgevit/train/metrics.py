"""Classification metrics (counted a batch at a time) and the traced forward
pass of a Keras model that `edgevit eval` scores."""
from __future__ import annotations

import numpy as np

BATCH_SIZE = 32


def forward(model, kernel_arithmetic: bool = True):
    """``model(images, training=False)``; ``kernel_arithmetic=False``: a QAT
    model's graph of fake-quant ops alone (see
    :func:`edgevit.quantize.export_trace.fake_quant_only`). What evaluation
    and validation trace."""
    import contextlib

    from edgevit.quantize.export_trace import fake_quant_only

    def call(images):
        with contextlib.nullcontext() if kernel_arithmetic else fake_quant_only():
            return model(images, training=False)

    return call


def traced_forward(model, kernel_arithmetic: bool = True):
    """:func:`forward` as one graph for every batch size (a smaller last
    batch would trace it again: 130 s for a QAT mobilevit_v3_xxs at 128 px,
    where a batch then takes 1 s)."""
    import tensorflow as tf

    from edgevit.quantize import graph_rewrites

    signature = [tf.TensorSpec((None, *model.inputs[0].shape[1:]), tf.float32)]
    return graph_rewrites.for_model(model, tf.function(forward(model, kernel_arithmetic), input_signature=signature,
                                                       autograph=False))


class AccuracyTally:
    """top-1, top-5, per-class recall and the most frequent confusions,
    counted a batch at a time (:meth:`add`): it holds counts, not the
    logits of every image."""

    def __init__(self, classes: list[str]):
        self.classes = classes
        self.k = min(5, len(classes))
        self.confusion = np.zeros((len(classes), len(classes)), np.int64)
        self.top_k_hits = 0

    def add(self, logits: np.ndarray, labels: np.ndarray) -> None:
        np.add.at(self.confusion, (labels, logits.argmax(1)), 1)
        top = np.argsort(-logits, axis=1)[:, :self.k]
        self.top_k_hits += int(np.sum(top == np.asarray(labels)[:, None]))

    def report(self) -> dict:
        confusion, classes, n = self.confusion, self.classes, len(self.classes)
        images = int(confusion.sum())
        per_class = {c: {"images": int(confusion[i].sum()),
                         "top1": round(float(confusion[i, i] / max(confusion[i].sum(), 1)), 4)}
                     for i, c in enumerate(classes)}
        off = [(int(confusion[i, j]), classes[i], classes[j]) for i in range(n) for j in range(n)
               if i != j and confusion[i, j]]
        off.sort(reverse=True)
        return {
            "images": images,
            "top1": round(float(np.trace(confusion) / images), 4) if images else None,
            f"top{self.k}": round(self.top_k_hits / images, 4) if images else None,
            "per_class": per_class,
            "top_confusions": [{"true": t, "predicted": p, "count": c} for c, t, p in off[:10]],
            "confusion_matrix": confusion.tolist() if n <= 20 else None,
        }


def accuracy_report(logits: np.ndarray, labels: np.ndarray, classes: list[str]) -> dict:
    """:class:`AccuracyTally`'s report of all ``logits`` at once."""
    tally = AccuracyTally(classes)
    tally.add(logits, labels)
    return tally.report()


class SegmentationTally:
    """Per-pixel confusion of predicted and true classes, counted a batch at
    a time (:meth:`add`); pixels whose mask holds ``ignore`` are left out.
    Its report: mean IoU over the classes that occur (in the masks or the
    predictions), per-class IoU and pixel accuracy."""

    def __init__(self, classes: list[str], ignore: int = 255):
        self.classes, self.ignore = classes, ignore
        self.confusion = np.zeros((len(classes), len(classes)), np.int64)

    def add(self, predicted: np.ndarray, masks: np.ndarray) -> None:
        """``predicted`` and ``masks``: class indices of the same shape."""
        predicted, masks = np.asarray(predicted).ravel(), np.asarray(masks).ravel()
        counted = masks != self.ignore
        n = len(self.classes)
        self.confusion += np.bincount(masks[counted].astype(np.int64) * n + predicted[counted],
                                      minlength=n * n).reshape(n, n)

    def report(self) -> dict:
        confusion = self.confusion
        true, hits = confusion.sum(1), np.diag(confusion)
        union = true + confusion.sum(0) - hits
        iou = {c: round(float(hits[i] / union[i]), 4) for i, c in enumerate(self.classes) if union[i]}
        pixels = int(confusion.sum())
        return {"pixels": pixels,
                "miou": round(float(np.mean(list(iou.values()))), 4) if iou else None,
                "pixel_accuracy": round(float(hits.sum() / pixels), 4) if pixels else None,
                "per_class_iou": iou}


def upsampled_classes(logits: np.ndarray, height: int, width: int) -> np.ndarray:
    """The class of each pixel of a ``height`` x ``width`` image from a
    segmenter's logits ``[N, h, w, classes]``: the logits resized
    bilinearly with the corners aligned, in float32, then the argmax, as
    MediaPipe's ImageSegmenter makes its category mask on the CPU (so that
    `edgevit eval` of a file scores what the app shows). One image at a
    time: a batch of 512x512 maps of 21 classes in float32 is 700 MB."""
    n, h, w, _ = logits.shape
    ys, y0, y1, ty = _corner_aligned(h, height)
    xs, x0, x1, tx = _corner_aligned(w, width)
    out = np.empty((n, height, width), np.uint8)
    for i, image in enumerate(logits.astype(np.float32)):
        rows = image[y0] + (image[y1] - image[y0]) * ty[:, None, None]
        out[i] = (rows[:, x0] + (rows[:, x1] - rows[:, x0]) * tx[None, :, None]).argmax(-1)
    return out


def _corner_aligned(source: int, target: int):
    """Where each of ``target`` places falls on ``source`` ones, corners on
    corners: (positions, lower and upper neighbours, the fraction between)."""
    scale = np.float32(source - 1) / np.float32(max(target - 1, 1))
    at = np.arange(target, dtype=np.float32) * scale
    low = np.maximum(np.floor(at), 0).astype(np.int64)
    high = np.minimum(np.ceil(at), source - 1).astype(np.int64)
    return at, low, high, np.clip(at - low, 0, 1).astype(np.float32)


class DetectionTally:
    """COCO's box mAP (IoU 0.5:0.95), AP50 and per-class AP through
    pycocotools' COCOeval, from an image's true boxes and its detections at
    a time (:meth:`add`). It holds the boxes as numpy rows (at most
    :data:`~edgevit.models.box_coding.DETECTIONS` detections an image), not
    the model's outputs."""

    def __init__(self, classes: list[str]):
        self.classes = classes
        self.truth: list[np.ndarray] = []        # [n, 6]: image, x, y, w, h, class
        self.detections: list[np.ndarray] = []   # [d, 7]: image, x, y, w, h, score, class
        self.images = 0

    @staticmethod
    def _xywh(corners: np.ndarray) -> np.ndarray:
        """(ymin, xmin, ymax, xmax) -> COCO's (x, y, width, height)."""
        corners = np.asarray(corners, np.float64).reshape(-1, 4)
        return np.stack([corners[:, 1], corners[:, 0], corners[:, 3] - corners[:, 1], corners[:, 2] - corners[:, 0]],
                        1)

    def add(self, true_corners, true_classes, corners, scores, classes) -> None:
        """One image: its true boxes (ymin, xmin, ymax, xmax in pixels) and
        their classes, and its detections in the same frame, their scores
        and classes."""
        image = self.images + 1
        self.images += 1
        self.truth.append(np.concatenate([np.full((len(true_classes), 1), image), self._xywh(true_corners),
                                          np.asarray(true_classes, np.float64)[:, None]], 1))
        self.detections.append(np.concatenate([np.full((len(scores), 1), image), self._xywh(corners),
                                               np.asarray(scores, np.float64)[:, None],
                                               np.asarray(classes, np.float64)[:, None]], 1))

    def report(self) -> dict:
        truth = np.concatenate(self.truth) if self.truth else np.zeros((0, 6))
        detections = np.concatenate(self.detections) if self.detections else np.zeros((0, 7))
        boxes_of = {c: int((truth[:, 5] == i).sum()) for i, c in enumerate(self.classes) if i}
        result = {"images": self.images, "boxes": int(len(truth)), "detections": int(len(detections)),
                  "map": None, "ap50": None, "ap75": None, "per_class_ap": {}, "boxes_per_class": boxes_of}
        if not len(truth):
            return result
        if not len(detections):
            return {**result, "map": 0.0, "ap50": 0.0, "ap75": 0.0,
                    "per_class_ap": {c: 0.0 for c, n in boxes_of.items() if n}}
        import contextlib
        import io

        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval

        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints as it goes
            truths = COCO()
            truths.dataset = {
                "images": [{"id": i} for i in range(1, self.images + 1)],
                "categories": [{"id": i, "name": c} for i, c in enumerate(self.classes) if i],
                "annotations": [{"id": n, "image_id": int(row[0]), "bbox": row[1:5].tolist(),
                                 "area": float(row[3] * row[4]), "category_id": int(row[5]), "iscrowd": 0}
                                for n, row in enumerate(truth, 1)]}
            truths.createIndex()
            evaluation = COCOeval(truths, truths.loadRes(detections), "bbox")
            evaluation.evaluate()
            evaluation.accumulate()
            evaluation.summarize()
        # precision [IoU thresholds, recall points, classes, areas, max detections]: all areas, 100 detections
        precision = evaluation.eval["precision"][:, :, :, 0, -1]
        per_class = {}
        for k, category in enumerate(evaluation.params.catIds):
            values = precision[:, :, k]
            if boxes_of[self.classes[category]]:
                per_class[self.classes[category]] = round(float(values[values > -1].mean()), 4) \
                    if (values > -1).any() else 0.0
        stats = evaluation.stats
        return {**result, "map": round(float(stats[0]), 4), "ap50": round(float(stats[1]), 4),
                "ap75": round(float(stats[2]), 4), "per_class_ap": per_class}
