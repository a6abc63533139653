"""What `edgevit finetune` and `edgevit qat` do before training: find the
dataset, build or load the model with a head for its classes, and load the
images at the training resolution."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from edgevit.errors import EdgevitError
from edgevit.train.metrics import accuracy_report


def prepare(model_arg: str, data_dir: str, *, weights, input_size, val_split, log, sizes=()):
    """(model, spec, dataset, train data, val data, input size, skipped count)."""
    from edgevit.registry import check_input_size
    from edgevit.saving import resolve_model
    from edgevit.train.data import find_dataset, load_split

    dataset = find_dataset(data_dir, val_split=val_split)
    classes = len(dataset.classes)
    from_file = model_arg.endswith(".keras") or Path(model_arg).is_file()
    if from_file:
        model, spec = resolve_model(model_arg, input_size=input_size, weights=weights)
        if int(model.outputs[0].shape[-1]) != classes:
            model = with_new_head(model, spec, classes, log)
    else:
        from edgevit.registry import create_model, get_spec

        spec = get_spec(model_arg)
        size = spec.default_input_size if input_size is None else input_size
        check_input_size(spec, size)
        if weights is not None:
            source = create_model(model_arg, num_classes=classes_in(weights, model_arg, size),
                                  input_size=size, weights=weights)
            model = with_new_head(source, spec, classes, log) if int(source.outputs[0].shape[-1]) != classes \
                else source
        else:
            model = create_model(model_arg, num_classes=classes, input_size=size)
    size = int(model.inputs[0].shape[1])
    for s in sizes:
        check_input_size(spec, s)
    pre = spec.preprocessing_at(size)
    largest = max([size, *sizes])
    log(f"Dataset {data_dir}: {classes} classes, {len(dataset.train.files)} train / "
         f"{len(dataset.val.files)} val images ({dataset.val_source})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train, skipped_train = load_split(dataset.train, pre, largest)
        val, skipped_val = load_split(dataset.val, pre, size)
    skipped = len(skipped_train) + len(skipped_val)
    if skipped:
        log(f"warning: {skipped} unreadable image(s) skipped, e.g. {(skipped_train + skipped_val)[0]}")
    return model, spec, dataset, train, val, size, skipped


def classes_in(weights: str, name: str, size: int) -> int:
    """Head size stored in a weights file (1000 for ImageNet checkpoints)."""
    if weights.endswith(".keras"):
        from edgevit.saving import load_model

        return int(load_model(weights).outputs[0].shape[-1])
    import h5py

    try:
        with h5py.File(weights, "r") as f:
            found = []
            f.visititems(lambda k, v: found.append(v.shape)
                         if "head.fc" in k and len(getattr(v, "shape", ())) == 2 else None)
        return int(found[0][1]) if found else 1000
    except OSError as err:
        raise EdgevitError(f"Weights file {weights!r} is corrupt or not HDF5.") from err


def with_new_head(model, spec, classes: int, log):
    """The same network with a freshly initialised ``classes``-way head."""
    from edgevit.registry import create_model

    new = create_model(spec.name, num_classes=classes, input_size=int(model.inputs[0].shape[1]))
    by_path = {w.path: w for w in model.weights}
    for w in new.weights:
        src = by_path.get(w.path)
        if src is not None and tuple(src.shape) == tuple(w.shape):
            w.assign(src)
    log(f"New {classes}-class head (the given weights have {model.outputs[0].shape[-1]} classes)")
    return new


def val_metrics(val, size: int):
    def evaluate(model):
        x = val.eval_batch(np.arange(len(val)), size)
        logits = np.asarray(model.predict(x, batch_size=32, verbose=0))
        report = accuracy_report(logits, val.labels, [str(i) for i in range(logits.shape[1])])
        return {"val_top1": report["top1"]}

    return evaluate
