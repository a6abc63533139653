"""What `edgevit finetune` and `edgevit qat` do before training: build or load
the model with a head for the dataset's classes, then make the streams of its
images at the training resolution (two steps, so that a command can check its
outputs in between, before the slow part)."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from edgevit.errors import EdgevitError
from edgevit.progress import Progress


def build_model(model_arg: str, classes: list[str], *, weights, input_size, log, sizes=()):
    """(model, spec) for ``classes``: a registered name (optionally started
    from ``weights``) or a ``.keras`` file, with a new head when the class
    count differs; the model carries the class names."""
    from edgevit.pretrained import IMAGENET_CLASSES, is_imagenet
    from edgevit.registry import check_input_size, create_model, get_spec
    from edgevit.models.common import copy_all_but_head
    from edgevit.saving import existing_file, load_weights_into, resolve_model, set_class_names

    if weights is not None and not is_imagenet(weights):
        existing_file(weights, "Weights file")
        refuse_qat_weights(weights)
    if model_arg.endswith(".keras") or Path(model_arg).is_file():
        model, spec = resolve_model(model_arg, input_size=input_size, weights=weights)
    else:
        spec = get_spec(model_arg)
        size = spec.default_input_size if input_size is None else input_size
        check_input_size(spec, size)
        model = create_model(model_arg, num_classes=len(classes), input_size=size,
                             weights=weights if is_imagenet(weights) else None)
        if is_imagenet(weights):
            if len(classes) != IMAGENET_CLASSES:
                log(f"New {len(classes)}-class head on the ImageNet weights (they have {IMAGENET_CLASSES} classes)")
        elif weights is not None:
            stored = classes_in(weights, model.layers[-1].name)
            if stored in (None, len(classes)):
                load_weights_into(model, weights)
            else:
                source = create_model(model_arg, num_classes=stored, input_size=size, weights=weights)
                copy_all_but_head(source, model)
                log(f"New {len(classes)}-class head (the given weights have {stored} classes)")
    if int(model.outputs[-1].shape[-1]) != len(classes):
        new = create_model(spec.name, num_classes=len(classes), input_size=int(model.inputs[0].shape[1]))
        copy_all_but_head(model, new)
        log(f"New {len(classes)}-class head (the given model has {model.outputs[-1].shape[-1]} classes)")
        model = new
    for s in sizes:
        check_input_size(spec, s)
    set_class_names(model, classes)
    return model, spec


def refuse_qat_weights(weights: str) -> None:
    """Refuse a QAT model's weights (a qat output, or a QAT checkpoint's
    last.weights.h5) as the start of a float model: beside each layer they
    hold fake-quantization ranges, folded BatchNorms and other shapes, and
    Keras ended in a cut line about objects it could not load."""
    if weights.endswith(".keras"):
        from edgevit.saving import model_description

        # every QAT layer class is saved under the name edgevit.qat>ClassName: read the description, not the model
        qat = b'"edgevit.qat>' in model_description(weights)
    else:
        import h5py

        try:
            with h5py.File(weights, "r") as f:
                layers = f.get("layers")
                # Keras keys each layer of a .weights.h5 by its class: ActivationQuantizer -> activation_quantizer_N
                qat = layers is not None and any(key.startswith("activation_quantizer") for key in layers.keys())
        except OSError:  # not HDF5: said in words where the weights load
            return
    if qat:
        raise EdgevitError(f"--weights {weights} holds the weights of a quantization-aware (QAT) model, which fit no "
                           "float model: pass the float model's weights it was trained from, or resume a QAT "
                           "checkpoint with the `edgevit qat` command that wrote it (the same --checkpoint-dir).")


def load_data(dataset, spec, size: int, sizes, log):
    """(train images, val images) streamed from ``dataset``'s file lists:
    nothing is read here (unreadable files are counted in the shared
    ``tally`` as the pipeline meets them)."""
    from edgevit.data.decode import UnreadableTally
    from edgevit.data.listing import left_out_summary
    from edgevit.data.stream import ImageStream

    pre = spec.preprocessing_at(size)
    # Pillow's notes on odd files (EXIF, palettes), from the pipeline's threads, where catch_warnings races
    warnings.filterwarnings("ignore", module=r"PIL\.")
    log(f"Dataset {dataset.root}: {len(dataset.classes)} classes, {len(dataset.train.files)} train / "
        f"{len(dataset.val.files)} val images ({dataset.val_source})")
    if dataset.left_out:
        log(left_out_summary(dataset.left_out))
    tally = UnreadableTally()
    return (ImageStream(dataset.train, pre, tally),
            ImageStream(dataset.val, pre, tally))


def first_images(images, size: int, count: int, seed: int | None = None, batch_size: int = 32) -> list:
    """Batches of at most ``count`` readable images of ``images`` (in a
    random order of ``seed``, else in order), center-cropped at ``size``:
    what BatchNorm estimation and QAT calibration read."""
    if seed is not None:
        images = images.subset(np.random.default_rng(seed).permutation(len(images))[:count])
    else:
        images = images.subset(range(min(count, len(images))))
    batches = [x for x, _ in images.batches(size, batch_size)]
    if not batches:
        raise EdgevitError(f"None of the {len(images)} training images read first (to estimate BatchNorm statistics "
                           "or calibrate the ranges) could be read"
                           + (f": {images.tally.summary()}." if len(images.tally) else "."))
    return batches


def classes_in(weights: str, head_name: str) -> int | None:
    """Classes of the head layer ``head_name`` stored in a weights file (None
    when the file does not say)."""
    if weights.endswith(".keras"):
        from edgevit.saving import load_model

        return int(load_model(weights).outputs[-1].shape[-1])
    import h5py

    found = []

    def visit(name, item):
        # Keras stores each top-level layer as layers/<class name>_<n>/vars, with the layer name as attribute.
        if name.count("/") == 2 and name.endswith("/vars") and item.attrs.get("name") == head_name and "1" in item:
            found.append(int(item["1"].shape[0]))

    try:
        with h5py.File(weights, "r") as f:
            f.visititems(visit)
    except OSError as err:
        raise EdgevitError(f"Weights file {weights!r} is corrupt or not HDF5.") from err
    return found[0] if found else None


def val_metrics(val, size: int, strategy=None, progress: Progress | None = None, kernel_arithmetic: bool = True):
    """``evaluate(model)``: {"val_top1": ...} on the center crops of ``val``,
    each replica of each worker scoring its share (see
    :func:`edgevit.train.validation.distributed_top1`)."""
    from edgevit.train.validation import Validation

    return Validation(val, size, strategy, progress or Progress(enabled=False), kernel_arithmetic)
