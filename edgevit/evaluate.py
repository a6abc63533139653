"""Top-1 / top-5 accuracy and a confusion summary of a Keras or TFLite
classifier on every image of an image folder (``DIR/val/<class>/*`` when
there is a val/ folder, ``DIR/<class>/*`` otherwise); mIoU, per-class IoU
and pixel accuracy of a segmenter on the val/ images of a segmentation
folder (``classes.txt`` with ``val/images`` and ``val/masks``, or a VOC
devkit folder).

Class folders (and a segmentation folder's classes) are matched to the
model's outputs by name when the model knows its class names (training
stores them; converted files carry them as labels), and by sorted order when
it has only default labels."""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from edgevit.data.labels import default_labels
from edgevit.data.stream import BATCH_SIZE
from edgevit.errors import EdgevitError, about
from edgevit.progress import Progress
from edgevit.litert.metadata import CLASSIFICATION, DETECTION, SEGMENTATION
from edgevit.train.metrics import AccuracyTally, SegmentationTally, traced_forward, upsampled_classes


# How `edgevit eval` suppresses a detector's overlapping boxes (its --nms).
# MEDIAPIPE_NMS: as MediaPipe Tasks' ObjectDetector shows a file's detections:
# a raw file's (and a .keras model's, which converts to one) through the
# suppression MediaPipe runs on raw outputs, a post-processing-op file's
# through the op's own options (every client shows what the op outputs).
# CVNETS_NMS: cvnets' evaluation of its SSD models (per-class NMS), the
# figures its papers publish. edgevit's Android demo suppresses a raw file as
# MEDIAPIPE_NMS does (android_demo's SsdPostprocessor).
MEDIAPIPE_NMS, CVNETS_NMS = "mediapipe", "cvnets"
NMS_CHOICES = (MEDIAPIPE_NMS, CVNETS_NMS)
# MediaPipe's ObjectDetector on a raw file (no post-processing op): one NMS
# over all classes at this IoU (ObjectDetectorOptions.min_suppression_threshold,
# 0.3 by default; neither the Java/Kotlin nor the Python options set it, nor
# does the model's metadata), at most max_results boxes (unlimited by
# default: COCO's mAP counts 100).
MEDIAPIPE_IOU = 0.3
MEDIAPIPE_DETECTIONS = 100
# What a detector's scores output holds: class logits, a softmax over every
# class, or one that leaves the background (class 0) out (edgevit's files)
LOGITS, PROBABILITIES, WITHOUT_BACKGROUND = "logits", "probabilities", "probabilities without the background"


def evaluate(model_path: str, data_dir: str, threads: int = 2, progress: Progress | None = None,
             nms: str = MEDIAPIPE_NMS, int8_kernels: str | None = None) -> dict:
    """Evaluate a ``.keras`` or ``.tflite`` model on every image of
    ``data_dir``, streamed: it holds a batch of images at a time. ``nms``:
    how a detector's boxes are suppressed (:func:`detection_postprocessing`).
    A QAT model computes the int8 SOFTMAX and BATCH_MATMUL of LiteRT's
    ``int8_kernels`` ("x86", "arm64"; None: this machine's), what its int8
    file computes there (see :mod:`edgevit.quantize.kernel_arithmetic`)."""
    if int8_kernels is not None and Path(model_path).suffix == ".tflite":
        raise EdgevitError(f"{model_path} computes what the LiteRT running it computes: --int8-kernels chooses "
                           "the kernels a QAT .keras model follows.")
    from edgevit.quantize.kernel_arithmetic import targeting_kernels

    with targeting_kernels(int8_kernels):
        return _evaluate(model_path, data_dir, threads, progress, nms)


def _evaluate(model_path: str, data_dir: str, threads: int, progress: Progress | None, nms: str) -> dict:
    from edgevit.data.boxes import find_detection_dataset, is_detection_folder
    from edgevit.data.folders import find_evaluation_images
    from edgevit.data.listing import left_out_summary
    from edgevit.data.masks import find_segmentation_dataset, is_segmentation_folder
    from edgevit.data.stream import ImageStream
    from edgevit.litert.flatbuffer import read_file
    from edgevit.litert.metadata import preprocessing_of, task_of
    from edgevit.saving import existing_file

    progress = progress or Progress(enabled=False)
    path = existing_file(model_path, "Model file")
    if path.suffix not in (".tflite", ".keras"):
        raise EdgevitError(f"{model_path!r} is neither a .keras nor a .tflite model.")
    segmentation = is_segmentation_folder(data_dir)
    # a VOC devkit holds both masks and boxes: a detector reads its boxes
    detection = is_detection_folder(data_dir) and (not segmentation or _model_task(path) == DETECTION)
    segmentation = segmentation and not detection
    images = (find_detection_dataset(data_dir) if detection else find_segmentation_dataset(data_dir) if segmentation
              else find_evaluation_images(data_dir))
    if path.suffix == ".tflite":
        content = read_file(path)
        meta = _edgevit_metadata(path, content)  # checked against the file: every field is there and fits it
        pre, name, labels, task = preprocessing_of(meta), meta["model"], meta["labels"], task_of(meta)
        _check_task(task, segmentation, detection, name, data_dir)
    else:
        from edgevit.native_output import import_tensorflow_quietly
        from edgevit.saving import check_model_file, class_names_of, load_model, spec_of

        check_model_file(path)  # before TensorFlow loads
        progress.step(f"Loading {path}")
        import_tensorflow_quietly()

        model = load_model(path)
        spec = spec_of(model)
        _check_task(spec.task, segmentation, detection, model.name, data_dir)
        pre = spec.preprocessing_at(int(model.inputs[0].shape[1]))
        name = model.name
        classes_out = int(model.outputs[-1].shape[-1])
        labels = class_names_of(model) or default_labels(classes_out)
    if detection and path.suffix == ".tflite" and len(labels) == len(images.classes) - 1:
        labels = [images.classes[0], *labels]  # a file whose scores leave the background out
    to_output = _output_index(images.classes, [str(label) for label in labels], name, data_dir)
    scored = (content, meta) if path.suffix == ".tflite" else model
    if detection:
        return _detection_report(path, images, to_output, pre, name, [str(label) for label in labels], threads,
                                 scored, progress, nms)
    if segmentation:
        return _segmentation_report(path, images, to_output, pre, name, [str(label) for label in labels], threads,
                                    scored, progress)
    stream = ImageStream(images.split, pre)
    tally = AccuracyTally([str(label) for label in labels])
    found = len(stream)
    progress.step(f"Running {path.name} on the {found} images of {data_dir} ({images.source})")
    if images.left_out:
        progress.step(left_out_summary(images.left_out))
    with contextlib.ExitStack() as stack:
        # a file's probabilities or logits: either ranks the classes alike
        forward = _forward(stack, path, scored, found, threads)
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


def _model_task(path: Path) -> str:
    """The task of the model at ``path`` (a .tflite file's from its metadata), before it is loaded."""
    if path.suffix == ".tflite":
        from edgevit.litert.flatbuffer import read_file
        from edgevit.litert.metadata import read_embedded, task_of

        return task_of(read_embedded(read_file(path)))
    from edgevit.train.run import model_task

    return model_task(str(path)) or CLASSIFICATION


def _check_task(task: str, segmentation: bool, detection: bool, name: str, data_dir: str) -> None:
    """One error where the model's task is not the folder's."""
    if detection != (task == DETECTION):
        raise EdgevitError(f"{data_dir} is a detection folder (boxes); {name} is an image {task} model: evaluate a "
                           "detector on it (one of `edgevit list`'s ssdlite_*)." if detection else
                           f"{name} is a detector; {data_dir} is not a detection folder (COCO's annotations/"
                           "instances_val.json with val/ images, or a VOC devkit with Annotations/): its mAP needs "
                           "boxes.")
    if segmentation and task != SEGMENTATION:
        raise EdgevitError(f"{data_dir} is a segmentation folder (masks of class indices); {name} is an image "
                           f"{task} model: evaluate a segmenter on it (e.g. one of `edgevit list`'s deeplabv3_*), "
                           "or this model on a folder of class folders.")
    if not segmentation and task == SEGMENTATION:
        raise EdgevitError(f"{name} is a segmenter; {data_dir} is not a segmentation folder (classes.txt with "
                           "val/images and val/masks, or a VOC devkit folder with SegmentationClass/): its mIoU "
                           "needs masks.")


def _forward(stack: contextlib.ExitStack, path: Path, scored, images: int, threads: int):
    """The forward pass that scores ``images`` images: the .tflite file's
    (``scored``: its content and metadata), batches streamed to one LiteRT
    child held open by ``stack``; else the Keras model ``scored``'s."""
    if path.suffix != ".tflite":
        return keras_forward(scored, images)
    from edgevit.litert.inputs import file_input_values
    from edgevit.litert.run_model import StreamedRun
    from edgevit.native_output import import_tensorflow_quietly

    import_tensorflow_quietly()  # the input pipeline is tf.data
    run, values = stack.enter_context(StreamedRun(path, num_threads=threads)), file_input_values(*scored)
    return lambda batch: run(values(batch))


def _segmentation_report(path: Path, folder, to_output: np.ndarray, pre, name: str, labels: list[str],
                         threads: int, scored, progress: Progress) -> dict:
    """mIoU, per-class IoU and pixel accuracy of the model on the val/
    images of ``folder``, streamed: each image's logits resized bilinearly
    to its crop (:func:`upsampled_classes`, as MediaPipe's ImageSegmenter
    does) and their argmax scored against its mask, placed by the same
    transform; mask pixels of 255 are not scored. ``to_output``: the
    model's output of each of the folder's classes; ``scored``: the Keras
    model, or the .tflite file's content and metadata."""
    from edgevit.data.masks import IGNORE_INDEX
    from edgevit.data.stream import ImageStream

    stream = ImageStream(folder.val, pre)
    found = len(stream)
    # a mask's class index -> the model's output (255 stays ignored)
    remap = np.full(256, IGNORE_INDEX, np.uint8)
    remap[:len(to_output)] = to_output
    tally = SegmentationTally(labels, ignore=IGNORE_INDEX)
    progress.step(f"Running {path.name} on the {found} val images of {folder.root} ({folder.layout})")
    with contextlib.ExitStack() as stack:
        forward = _forward(stack, path, scored, found, threads)
        advance = stack.enter_context(progress.bar("scoring", found, "images"))
        for inputs, masks in stream.batches(pre.input_size, BATCH_SIZE):
            logits = np.asarray(forward(inputs))
            logits = logits.reshape(len(masks), *logits.shape[-3:])
            tally.add(upsampled_classes(logits, *masks.shape[1:]), remap[masks])
            advance(len(masks))
    skipped = stream.tally
    report = tally.report()
    if not report["pixels"]:
        raise EdgevitError(f"None of the {found} val images of {folder.root} could be scored"
                           + (f": {skipped.summary()}." if skipped else " (their masks ignore every pixel)."))
    return _val_report(report, path, folder, name, SEGMENTATION, stream, images=found - len(skipped))


def _detection_report(path: Path, folder, to_output: np.ndarray, pre, name: str, labels: list[str], threads: int,
                      scored, progress: Progress, nms: str) -> dict:
    """COCO mAP (IoU 0.5:0.95), AP50 and per-class AP of the detector on
    the val/ images of ``folder``, as cvnets evaluates its SSD models: each
    whole image resized to the input, the boxes decoded against the
    anchors, the class probabilities suppressed as ``nms`` says
    (:func:`detection_postprocessing`), then pycocotools' COCOeval against
    the boxes placed with the image (in the input's pixels). ``to_output``:
    the model's output of each of the folder's classes; ``scored``: the
    Keras model, or the .tflite file's content and metadata."""
    from edgevit.data.stream import ImageStream
    from edgevit.models.box_coding import decode
    from edgevit.train.metrics import DetectionTally

    stream = ImageStream(folder.val, pre)
    found, size = len(stream), pre.input_size
    tally = DetectionTally(labels)
    suppress, postprocessing = detection_postprocessing(nms, scored[1] if path.suffix == ".tflite" else None)
    progress.step(f"Running {path.name} on the {found} val images of {folder.root} ({folder.layout})")
    with contextlib.ExitStack() as stack:
        forward, anchors = _detector_forward(stack, path, scored, found, threads, len(labels))
        advance = stack.enter_context(progress.bar("scoring", found, "images"))
        for inputs, targets in stream.batches(size, BATCH_SIZE):
            regressions, probabilities = forward(inputs)
            for image_regressions, image_probabilities, boxes in zip(regressions, probabilities, targets):
                truth = boxes[boxes[:, 4] > 0]
                tally.add(truth[:, :4] * size, to_output[truth[:, 4].astype(np.int64)],
                          *suppress(decode(image_regressions, anchors) * size, image_probabilities))
            advance(len(targets))
    skipped = stream.tally
    report = tally.report()
    if not report["images"]:
        raise EdgevitError(f"None of the {found} val images of {folder.root} could be read"
                           + (f": {skipped.summary()}." if skipped else "."))
    return _val_report(report, path, folder, name, DETECTION, stream, postprocessing=postprocessing,
                       left_out=folder.skipped)


def _val_report(report: dict, path: Path, folder, name: str, task: str, stream, **more) -> dict:
    """``report`` (a tally's) with what a segmenter's and a detector's
    reports both say: the model, the file, the folder and its val images
    (``stream``: how many, and the unreadable ones), and ``more``."""
    skipped = stream.tally
    report.update({"model": name, "file": str(path), "data": str(folder.root), "split": "val",
                   "layout": folder.layout, "task": task, "input_size": stream.pre.input_size,
                   "found": len(stream), "unreadable_skipped": len(skipped), "skipped_reasons": skipped.counts(),
                   **more})
    return report


def detection_postprocessing(nms: str, meta: dict | None):
    """(suppress, description): ``suppress(boxes, probabilities)`` -> the
    detections (:func:`edgevit.models.box_coding.per_class_nms`'s result)
    of one image, as ``nms`` (one of NMS_CHOICES) says, for a .keras model
    (``meta`` None) or a .tflite file of that edgevit ``meta``."""
    from functools import partial

    from edgevit.litert.standard_metadata import NMS_FORM
    from edgevit.models.box_coding import CONFIDENCE, DETECTIONS, NMS_IOU, best_class_nms, per_class_nms

    if nms not in NMS_CHOICES:
        raise EdgevitError(f"Unknown NMS {nms!r}: one of {', '.join(NMS_CHOICES)}.")
    if nms == CVNETS_NMS:
        return per_class_nms, {"nms": "per class", "iou_threshold": NMS_IOU, "score_threshold": CONFIDENCE,
                               "max_detections": DETECTIONS, "as": "cvnets' evaluation of its SSD models"}
    block = (meta or {}).get("detection", {})
    op = block.get("postprocessing") if block.get("form") == NMS_FORM else None
    if op is not None:
        iou, score, most = float(op["iou_threshold"]), float(op["score_threshold"]), int(op["max_detections"])
        per_class = bool(op.get("use_regular_nms"))
        suppress = partial(per_class_nms if per_class else best_class_nms, confidence=score, threshold=iou,
                           detections=most)
        return suppress, {"nms": "per class" if per_class else "over all classes", "iou_threshold": iou,
                          "score_threshold": score, "max_detections": most,
                          "as": "the file's detection post-processing op, as every client shows it"}
    return (partial(best_class_nms, threshold=MEDIAPIPE_IOU, detections=MEDIAPIPE_DETECTIONS),
            {"nms": "over all classes", "iou_threshold": MEDIAPIPE_IOU, "score_threshold": CONFIDENCE,
             "max_detections": MEDIAPIPE_DETECTIONS, "as": "MediaPipe's ObjectDetector on a raw file"})


def _detector_forward(stack: contextlib.ExitStack, path: Path, scored, images: int, threads: int, classes: int):
    """(forward, anchors): ``forward(inputs)`` -> (box regressions [N, A, 4],
    class probabilities [N, A, classes]) of the Keras model or the .tflite
    file ``scored`` (its scores read as :func:`declared_scores` says; a
    file ending in the detection post-processing op is read before it:
    :func:`detection_postprocessing` applies the op's options); the anchors
    its regressions are relative to."""
    from edgevit.models.ssdlite import anchor_boxes

    if path.suffix != ".tflite":
        run, scores = keras_forward(scored, images), declared_scores(None)
        return (lambda batch: class_probabilities([np.asarray(t) for t in run(batch)], classes, scores)), \
            anchor_boxes(scored)
    from edgevit.litert.detection_postprocess import raw_view
    from edgevit.litert.inputs import file_input_values
    from edgevit.litert.run_model import outputs_by_signature
    from edgevit.registry import create_model

    content, meta = scored
    size = int(meta["preprocessing"]["input_size"])
    anchors = anchor_boxes(create_model(meta["model"], num_classes=classes, input_size=size))
    run, values = outputs_by_signature(raw_view(content), threads), file_input_values(content, meta)
    scores = declared_scores(meta)

    def forward(batch):
        outputs = run(values(batch))
        if len(outputs) != 2:
            raise EdgevitError(f"The file has {len(outputs)} outputs; eval scores a detector's two (boxes, scores).")
        return class_probabilities(outputs, classes, scores)

    return forward, anchors


def declared_scores(meta: dict | None) -> str | None:
    """What a detector's scores are, as declared: a .keras model's (``meta``
    None) its class logits (the contract of edgevit.models.ssdlite, the only
    detectors edgevit builds and loads); a file's as its edgevit metadata's
    detection block says (``edgevit convert`` writes the softmax without the
    background). None where the block does not say: a document that
    ``edgevit convert`` did not write (its scores are told by their values)."""
    from edgevit.export.detection import SCORES

    if meta is None:
        return LOGITS
    return WITHOUT_BACKGROUND if meta["detection"].get("scores") == SCORES else None


def class_probabilities(outputs: list[np.ndarray], classes: int, scores: str | None):
    """(regressions, probabilities [N, A, classes]) from a detector's
    outputs, whose scores are ``scores`` (LOGITS, PROBABILITIES or
    WITHOUT_BACKGROUND; None: undeclared, told by their columns and values):
    logits through a softmax; probabilities that leave the background out get
    a column of zeros for it (NMS skips class 0)."""
    regressions, values = outputs
    scores = scores or _scores_by_values(values, classes)
    if scores == WITHOUT_BACKGROUND:
        return regressions, np.concatenate([np.zeros_like(values[..., :1]), values], -1)
    if scores == PROBABILITIES:
        return regressions, values
    shifted = np.exp(values - values.max(-1, keepdims=True))
    return regressions, shifted / shifted.sum(-1, keepdims=True)


def _scores_by_values(values: np.ndarray, classes: int) -> str:
    """What undeclared scores look like: a column short, the background
    left out; non-negative rows summing to 1, probabilities; else logits."""
    if values.shape[-1] == classes - 1:
        return WITHOUT_BACKGROUND
    if values.min() >= 0 and np.allclose(values.sum(-1), 1, atol=0.1):
        return PROBABILITIES
    return LOGITS


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
