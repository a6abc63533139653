"""Top-1 / top-5 accuracy and a confusion summary of a Keras or TFLite model
on every image of an image folder (``DIR/val/<class>/*`` when there is a val/
folder, ``DIR/<class>/*`` otherwise).

Class folders are matched to the model's outputs by name when the model
knows its class names (training stores them; converted files carry them as
labels), and by sorted order when it has only default labels."""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from edgevit.data.labels import default_labels
from edgevit.data.stream import BATCH_SIZE
from edgevit.errors import EdgevitError, about
from edgevit.progress import Progress
from edgevit.train.metrics import AccuracyTally, traced_forward


def evaluate(model_path: str, data_dir: str, threads: int = 2, progress: Progress | None = None) -> dict:
    """Evaluate a ``.keras`` or ``.tflite`` model on every image of
    ``data_dir``, streamed: it holds a batch of images at a time."""
    from edgevit.data.folders import find_evaluation_images
    from edgevit.data.listing import left_out_summary
    from edgevit.data.stream import ImageStream
    from edgevit.litert.flatbuffer import read_file
    from edgevit.litert.metadata import preprocessing_of
    from edgevit.saving import existing_file

    progress = progress or Progress(enabled=False)
    path = existing_file(model_path, "Model file")
    if path.suffix not in (".tflite", ".keras"):
        raise EdgevitError(f"{model_path!r} is neither a .keras nor a .tflite model.")
    images = find_evaluation_images(data_dir)
    if path.suffix == ".tflite":
        content = read_file(path)
        meta = _edgevit_metadata(path, content)  # checked against the file: every field is there and fits it
        pre, name, labels = preprocessing_of(meta), meta["model"], meta["labels"]
    else:
        from edgevit.native_output import import_tensorflow_quietly
        from edgevit.saving import check_model_file, class_names_of, load_model, spec_of

        check_model_file(path)  # before TensorFlow loads
        progress.step(f"Loading {path}")
        import_tensorflow_quietly()

        model = load_model(path)
        pre = spec_of(model).preprocessing_at(int(model.inputs[0].shape[1]))
        name = model.name
        classes_out = int(model.outputs[0].shape[-1])
        labels = class_names_of(model) or default_labels(classes_out)
    to_output = _output_index(images.classes, [str(label) for label in labels], name, data_dir)
    if path.suffix == ".tflite":
        from edgevit.native_output import import_tensorflow_quietly

        import_tensorflow_quietly()  # the input pipeline is tf.data
    stream = ImageStream(images.split, pre)
    tally = AccuracyTally([str(label) for label in labels])
    found = len(stream)
    progress.step(f"Running {path.name} on the {found} images of {data_dir} ({images.source})")
    if images.left_out:
        progress.step(left_out_summary(images.left_out))
    with contextlib.ExitStack() as stack:
        if path.suffix == ".tflite":
            from edgevit.litert.inputs import file_input_values
            from edgevit.litert.run_model import StreamedRun

            # probabilities or logits: either ranks the classes alike
            run, values = stack.enter_context(StreamedRun(path, num_threads=threads)), \
                file_input_values(content, meta)
            forward = lambda batch: run(values(batch))  # noqa: E731
        else:
            forward = keras_forward(model, found)
        advance = stack.enter_context(progress.bar("scoring", found, "images"))
        for inputs, batch_labels in stream.batches(pre.input_size, BATCH_SIZE):
            tally.add(np.asarray(forward(inputs)), to_output[batch_labels])
            advance(len(batch_labels))
    skipped = stream.tally
    report = tally.report()
    if not report["images"]:
        raise EdgevitError(f"None of the {found} images could be read"
                           + (f": {skipped.summary()}." if skipped else "."))
    report["per_class"] = {c: v for c, v in report["per_class"].items() if v["images"]}
    report.update({"model": name, "file": str(path), "data": str(data_dir), "split": images.source,
                   "input_size": pre.input_size, "found": found,
                   "unreadable_skipped": len(skipped), "skipped_reasons": skipped.counts(),
                   "left_out": images.left_out})
    return report


# Tracing a QAT model costs as much as this many of its eager batches (its
# integer arithmetic becomes 30k graph nodes for mobilevit_v3_xxs): at
# 128 px on a quiet 2-core host its first traced batch of 32 took 33 s
# (run without Grappler, see edgevit.quantize.graph_rewrites), the next
# 0.8 s, and an eager one 5.2 s. A float model traces in seconds.
QAT_TRACE_IN_EAGER_BATCHES = 7


def keras_forward(model, images: int):
    """The forward pass that scores ``images`` images soonest: the model
    itself (eager) for a QAT model and few images, else traced once."""
    from edgevit.quantize.qat import is_qat_model

    if is_qat_model(model) and -(-images // BATCH_SIZE) <= QAT_TRACE_IN_EAGER_BATCHES:
        return lambda batch: model(batch, training=False)
    return traced_forward(model)


def _edgevit_metadata(path: Path, content: bytes) -> dict:
    """The file's edgevit metadata, checked against it."""
    from edgevit.litert.metadata import read_embedded
    from edgevit.litert.metadata_check import check_metadata

    with about(path):
        check_metadata(content, str(path))  # a damaged file, or metadata eval cannot trust: one error
        meta = read_embedded(content)
    if not meta:
        raise EdgevitError(f"{path} is a .tflite file without edgevit metadata (not written by `edgevit convert`): "
                           "eval takes the preprocessing and labels from that metadata.")
    return meta


def _output_index(folders: list[str], labels: list[str], name: str, data_dir: str) -> np.ndarray:
    """The model output of each class folder: by name when every folder is
    one of the model's labels; by sorted position when the model has default
    labels and as many classes as there are folders."""
    index = {label: i for i, label in enumerate(labels)}
    if all(folder in index for folder in folders):
        return np.asarray([index[folder] for folder in folders])
    shown = ", ".join(folders[:5]) + (" ..." if len(folders) > 5 else "")
    if labels == default_labels(len(labels)):
        if len(folders) != len(labels):
            raise EdgevitError(f"{name} predicts {len(labels)} classes; {data_dir} has {len(folders)} ({shown}).")
        return np.arange(len(labels))
    unknown = [folder for folder in folders if folder not in index]
    raise EdgevitError(f"{data_dir} has class folders that are not classes of {name}: "
                       f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''} (its classes: "
                       f"{', '.join(labels[:5])}{' ...' if len(labels) > 5 else ''}).")
