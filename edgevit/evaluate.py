"""Top-1 / top-5 accuracy and a confusion summary of a Keras or TFLite model
on an image-folder dataset (the val split: ``DIR/val/<class>/*``, or
``DIR/<class>/*`` when there is no split)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from edgevit.errors import EdgevitError


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
        f"top{k}": round(float(np.mean([l in row for l, row in zip(labels, top5)])), 4),
        "per_class": per_class,
        "top_confusions": [{"true": t, "predicted": p, "count": c} for c, t, p in off[:10]],
        "confusion_matrix": confusion.tolist() if n <= 20 else None,
    }


def tflite_input_size(path: str | Path) -> int:
    from edgevit.export.graph import load_interpreter

    interp = load_interpreter(Path(path).read_bytes(), num_threads=1)
    shape = interp.get_input_details()[0]["shape"]
    return int(shape[1])


def evaluate(model_path: str, data_dir: str, batch_size: int = 32, threads: int = 2,
             split: str = "val") -> dict:
    """Evaluate a ``.keras`` or ``.tflite`` model on ``data_dir``."""
    from edgevit.train.data import find_dataset, load_split

    path = Path(model_path)
    if not path.exists():
        raise EdgevitError(f"Model file {model_path!r} does not exist.")
    dataset = find_dataset(data_dir)
    split_data = dataset.val if split == "val" else dataset.train
    if path.suffix == ".tflite":
        from edgevit.export.metadata import read_embedded

        try:
            meta = read_embedded(path.read_bytes())
        except Exception:  # not a flatbuffer at all
            meta = None
        if not meta:
            raise EdgevitError(f"{model_path} is not a model written by `edgevit convert` "
                               "(no edgevit metadata inside).")
        pre = _preprocessing_from(meta)
        name = meta.get("model", path.stem)
        classes_out = meta.get("num_classes")
    elif path.suffix == ".keras":
        from edgevit.saving import load_model, spec_of

        model = load_model(path)
        pre = spec_of(model).preprocessing_at(int(model.inputs[0].shape[1]))
        name = model.name
        classes_out = int(model.outputs[0].shape[-1])
    else:
        raise EdgevitError(f"{model_path!r} is neither a .keras nor a .tflite model.")
    if classes_out is not None and classes_out != len(dataset.classes):
        raise EdgevitError(f"{name} predicts {classes_out} classes; {data_dir} has "
                           f"{len(dataset.classes)} ({', '.join(dataset.classes[:5])}).")
    data, skipped = load_split(split_data, pre, pre.input_size)
    inputs = data.eval_batch(np.arange(len(data)), pre.input_size)
    if path.suffix == ".tflite":
        from edgevit.export.run_model import run_in_child

        logits = run_in_child(path, inputs, num_threads=threads)
    else:
        logits = np.asarray(model.predict(inputs, batch_size=batch_size, verbose=0))
    report = accuracy_report(logits, data.labels, dataset.classes)
    report.update({"model": name, "file": str(path), "data": str(data_dir), "split": dataset.val_source
                   if split == "val" else "train", "input_size": pre.input_size,
                   "unreadable_skipped": len(skipped)})
    return report


def _preprocessing_from(meta: dict):
    from edgevit.registry import Preprocessing

    p = meta.get("preprocessing") or {}
    try:
        return Preprocessing(int(p["input_size"]), int(p["resize_size"]), p.get("interpolation", "bilinear"),
                             tuple(p.get("mean", (0, 0, 0))), tuple(p.get("std", (1, 1, 1))))
    except (KeyError, TypeError, ValueError):
        raise EdgevitError("The model's metadata has no usable preprocessing.") from None
