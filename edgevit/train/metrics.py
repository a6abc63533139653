"""Classification metrics, and a Keras model's logits they are computed from,
shared by training (validation after each epoch) and `edgevit eval`."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

BATCH_SIZE = 32


def traced_forward(model, kernel_arithmetic: bool = True):
    """``model(images, training=False)`` as one graph for every batch size (a
    smaller last batch would trace it again: 130 s for a QAT
    mobilevit_v3_xxs at 128 px, where a batch then takes 1 s).
    ``kernel_arithmetic=False``: a QAT model's graph of fake-quant ops
    alone (see :func:`edgevit.quantize.export_trace.fake_quant_only`)."""
    import contextlib

    import tensorflow as tf

    from edgevit.quantize import graph_rewrites
    from edgevit.quantize.export_trace import fake_quant_only

    def forward(images):
        with contextlib.nullcontext() if kernel_arithmetic else fake_quant_only():
            return model(images, training=False)

    signature = [tf.TensorSpec((None, *model.inputs[0].shape[1:]), tf.float32)]
    return graph_rewrites.for_model(model, tf.function(forward, input_signature=signature, autograph=False))


def logits_of(forward: Callable, images: np.ndarray, batch_size: int = BATCH_SIZE,
              on_batch: Callable[[int], None] = lambda count: None) -> np.ndarray:
    """``forward`` (a model, or its :func:`traced_forward`) over ``images``, a
    batch at a time; ``on_batch(images in it)`` after each."""
    outputs = []
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size]
        outputs.append(np.asarray(forward(batch)))
        on_batch(len(batch))
    return np.concatenate(outputs)


def accuracy_report(logits: np.ndarray, labels: np.ndarray, classes: list[str]) -> dict:
    """top-1, top-5, per-class recall and the most frequent confusions."""
    pred = logits.argmax(1)
    k = min(5, logits.shape[1])
    top5 = np.argsort(-logits, axis=1)[:, :k]
    n = len(classes)
    confusion = np.zeros((n, n), np.int64)
    for t, p in zip(labels, pred):
        confusion[t, p] += 1
    per_class = {c: {"images": int(confusion[i].sum()),
                     "top1": round(float(confusion[i, i] / max(confusion[i].sum(), 1)), 4)}
                 for i, c in enumerate(classes)}
    off = [(int(confusion[i, j]), classes[i], classes[j]) for i in range(n) for j in range(n)
           if i != j and confusion[i, j]]
    off.sort(reverse=True)
    return {
        "images": int(len(labels)),
        "top1": round(float(np.mean(pred == labels)), 4),
        f"top{k}": round(float(np.mean([label in row for label, row in zip(labels, top5)])), 4),
        "per_class": per_class,
        "top_confusions": [{"true": t, "predicted": p, "count": c} for c, t, p in off[:10]],
        "confusion_matrix": confusion.tolist() if n <= 20 else None,
    }
