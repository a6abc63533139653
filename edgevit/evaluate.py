"""Top-1 / top-5 accuracy and a confusion summary of a Keras or TFLite model
on an image-folder dataset (the val split: ``DIR/val/<class>/*``, or
``DIR/<class>/*`` when there is no split)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from edgevit.errors import EdgevitError
from edgevit.train.metrics import accuracy_report


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
        from edgevit.litert.metadata import read_embedded

        try:
            meta = read_embedded(path.read_bytes())
        except EdgevitError:  # not a flatbuffer at all, or damaged metadata
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
