"""Golden cases for the app's Kotlin pre- and postprocessing.

For each case: a small PNG, the edgevit metadata documents a model with that
preprocessing would carry (float32, int8 and uint8 input), and the exact bytes
edgevit's Python preprocessing gives for it (`edgevit.data.images` for
resize/crop/normalise, `edgevit.litert.run_model.quantize` for quantization).
The Kotlin test (GoldenPreprocessingTest) must reproduce every byte.

The segmentation case starts from the raw logits a real int8 segmenter file
gave for a photo (`segment.logits.bin`, with that file's metadata,
`segment.json`): Python makes the category mask (`edgevit.train.metrics.
upsampled_classes`, as `edgevit eval` makes it), the legend and
the colours, which GoldenSegmentationTest must reproduce. `--segmenter FILE`
runs FILE to make new logits; without it, the committed ones are used.

The detection case is a real small int8 detector file in its raw form
(`detect.tflite`: uint8 boxes and softmax scores, the anchors in its
standard metadata) and the outputs it gave for a photo: Python decodes and
suppresses them as `edgevit eval` does by default (`edgevit.models.
box_coding.decode`, then `best_class_nms` as MediaPipe's ObjectDetector
shows a raw file), which GoldenDetectionTest must reproduce from the file's
own metadata. `--detector FILE` makes a new case from FILE. The frames of
DETECTOR_FRAMES are resized to that detector's input as `edgevit eval` resizes
a detector's photo (MediaPipe's resize, `edgevit.data.transforms.
mediapipe_resize`), which GoldenPreprocessingTest must reproduce from the
same metadata.

    python android_demo/offline-check/make_golden.py [OUT_DIR] [--segmenter FILE.tflite] [--detector FILE.tflite]

OUT_DIR defaults to app/src/test/resources/golden (the copy committed for
Android Studio runs); the pytest suite regenerates the cases into a temporary
folder on every run and checks that the committed copy is still current.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from edgevit.data.decode import open_rgb
from edgevit.data.images import to_model_input
from edgevit.data.transforms import PIL_FILTERS, center_crop, transform
from edgevit.evaluate import MEDIAPIPE_NMS, detection_postprocessing
from edgevit.litert.inputs import file_inputs
from edgevit.litert.metadata import build_metadata, preprocessing_of, read_embedded
from edgevit.litert.run_model import dequantize, quantize, run_in_process, split_outputs
from edgevit.litert.standard_metadata import anchors_of_options, detector_options, read_standard
from edgevit.models.box_coding import CONFIDENCE, decode
from edgevit.registry import Preprocessing
from edgevit.train.metrics import upsampled_classes

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "app" / "src" / "test" / "resources" / "golden"

IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))

# name: (width, height, Preprocessing)
CASES = {
    # A downscale (Pillow widens the filter: antialiasing) with ImageNet mean/std.
    "downscale_bilinear": (61, 47, Preprocessing(16, 18, "bilinear", **IMAGENET)),
    # A camera-like 4:3 frame, stronger downscale.
    "camera_bilinear": (160, 120, Preprocessing(32, 36, "bilinear")),
    # An upscale with the bicubic filter (negative weights: clipping to 0..255).
    "upscale_bicubic": (13, 10, Preprocessing(16, 18, "bicubic", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))),
    # 4 x 5 -> shorter side 18: the long side is 22.5, which Python rounds to 22 (half to even).
    "half_rounding": (4, 5, Preprocessing(16, 18, "bilinear")),
    # Already at input size: no resampling at all, only normalisation.
    "exact_size": (16, 16, Preprocessing(16, 16, "bilinear", **IMAGENET)),
}


def _image(width: int, height: int, seed: int) -> Image.Image:
    """Gradients, a hard edge and noise: every resampling weight matters."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    r = 255 * x / max(1, width - 1)
    g = 255 * y / max(1, height - 1)
    b = np.where((x // 3 + y // 3) % 2 == 0, 230, 20)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 25, (height, width, 3))
    return Image.fromarray(np.clip(np.round(img), 0, 255).astype(np.uint8), "RGB")


def _quant(pre: Preprocessing, dtype: str) -> dict:
    lo, hi = pre.value_range
    scale = float(np.float32((hi - lo) / 255.0))
    zero_int8 = int(round(-128 - lo / scale))
    return {"scale": scale, "zero_point": zero_int8 + (128 if dtype == "uint8" else 0)}


def _metadata(name: str, pre: Preprocessing, dtype: str) -> dict:
    quant = None if dtype == "float32" else _quant(pre, dtype)
    size = pre.input_size
    return build_metadata(
        model_name=f"golden_{name}", family="golden", precision="int8" if quant else "fp32",
        weights="none", labels=["a", "b"], labels_file="labels.txt",
        graph_input={"shape": [1, size, size, 3], "dtype": dtype, "quantization": quant},
        graph_output={"shape": [1, 2], "dtype": dtype, "quantization": quant},
        preprocessing=pre.to_dict())


def write_golden(out_dir: str | Path, segmenter: str | Path | None = None,
                 detector: str | Path | None = None) -> list[str]:
    """Write every case into ``out_dir``; return the file names written.
    ``segmenter``: the .tflite file whose logits the segmentation case
    starts from, ``detector`` the raw detector of the detection case
    (default: the committed ones)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for seed, (name, (width, height, pre)) in enumerate(CASES.items()):
        png = out / f"{name}.png"
        _image(width, height, seed).save(png)
        cropped = center_crop(open_rgb(png), pre.resize_size, pre.input_size, pre.interpolation)
        (out / f"{name}.rgb").write_bytes(np.asarray(cropped, np.uint8).tobytes())
        values = to_model_input(cropped, pre)[None]
        for dtype in ("float32", "int8", "uint8"):
            meta = _metadata(name, pre, dtype)
            (out / f"{name}.{dtype}.json").write_text(json.dumps(meta, indent=2) + "\n")
            q = meta["input"]["quantization"]
            detail = {"dtype": np.dtype(dtype), "quantization": (q["scale"], q["zero_point"]) if q else (0.0, 0)}
            tensor = quantize(values, detail)
            (out / f"{name}.{dtype}.bin").write_bytes(tensor.astype(tensor.dtype.newbyteorder("<")).tobytes())
            written += [f"{name}.{dtype}.json", f"{name}.{dtype}.bin"]
        written += [png.name, f"{name}.rgb"]
    (out / "cases.txt").write_text("\n".join(CASES) + "\n")
    written += _write_postprocessing(out)
    written += _write_segmentation(out, segmenter)
    written += _write_detection(out, detector)
    written += _write_detector_frames(out)
    return sorted(written + ["cases.txt"])


def _write_postprocessing(out: Path) -> list[str]:
    """Raw int8/uint8 model outputs with what Python makes of them: dequantized
    scores (`edgevit.litert.run_model.dequantize`, exact), softmax probabilities
    (float64, compared with a tolerance) and the top-5 classes (ties: lower index)."""
    rng = np.random.default_rng(99)
    written = []
    for dtype, zero_point in (("int8", -3), ("uint8", 125)):
        info = np.iinfo(dtype)
        raw = rng.integers(info.min, info.max + 1, 1000).astype(dtype)
        raw[[10, 500]] = info.max  # a tie for first place: index 10 must win
        scale = float(np.float32(0.0625))
        scores = dequantize(raw[None], {"dtype": np.dtype(dtype), "quantization": (scale, zero_point)})[0]
        logits = scores.astype(np.float64)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        top5 = np.lexsort((np.arange(len(probs)), -probs))[:5]
        (out / f"postprocess.{dtype}.bin").write_bytes(raw.tobytes())
        (out / f"postprocess.{dtype}.scores.bin").write_bytes(scores.astype("<f4").tobytes())
        (out / f"postprocess.{dtype}.json").write_text(json.dumps({
            "dtype": dtype, "quantization": {"scale": scale, "zero_point": zero_point},
            "top5": top5.tolist(), "top5_probabilities": probs[top5].tolist()}, indent=2) + "\n")
        written += [f"postprocess.{dtype}.bin", f"postprocess.{dtype}.scores.bin", f"postprocess.{dtype}.json"]
    return written


# The mask the logits are upsampled to: not square, not a multiple of the
# logits' size, so that every interpolation weight of both axes matters.
SEGMENT_MASK_SIZE = (45, 61)


def _write_segmentation(out: Path, segmenter: str | Path | None) -> list[str]:
    """The segmenter's raw logits and metadata, and what Python makes of them:
    the category mask (class bytes, row by row), the legend (the classes
    present, largest share first, ties to the lower class) and each class's
    ARGB colour (the PASCAL VOC palette; "background" transparent)."""
    logits_file, meta_file = out / "segment.logits.bin", out / "segment.json"
    if segmenter is not None:
        content = Path(segmenter).read_bytes()
        meta = read_embedded(content)
        pre = preprocessing_of(meta)
        photo = center_crop(open_rgb(out / "camera_bilinear.png"), pre.resize_size, pre.input_size, pre.interpolation)
        logits = run_in_process(content, file_inputs(content, to_model_input(photo, pre)[None], meta))
        output = meta["output"]
        q = output["quantization"]
        raw = quantize(logits, {"dtype": np.dtype(output["dtype"]), "quantization": (q["scale"], q["zero_point"])})
        logits_file.write_bytes(raw.tobytes())
        meta_file.write_text(json.dumps(meta, indent=2) + "\n")
    elif out != DEFAULT_OUT:
        shutil.copy(DEFAULT_OUT / logits_file.name, logits_file)
        shutil.copy(DEFAULT_OUT / meta_file.name, meta_file)
    meta = json.loads(meta_file.read_text())
    output = meta["output"]
    q = output["quantization"]
    raw = np.frombuffer(logits_file.read_bytes(), output["dtype"]).reshape(output["shape"])
    logits = dequantize(raw, {"dtype": np.dtype(output["dtype"]), "quantization": (q["scale"], q["zero_point"])})
    mask = upsampled_classes(logits, *SEGMENT_MASK_SIZE)[0]
    counts = np.bincount(mask.ravel(), minlength=len(meta["labels"]))
    present = [int(c) for c in np.lexsort((np.arange(len(counts)), -counts)) if counts[c]]
    (out / "segment.mask.bin").write_bytes(mask.tobytes())
    (out / "segment.expected.json").write_text(json.dumps({
        "mask_height": SEGMENT_MASK_SIZE[0], "mask_width": SEGMENT_MASK_SIZE[1],
        "legend": [{"index": c, "share": float(counts[c] / mask.size)} for c in present],
        "colors": [0 if label == "background" else _voc_color(i) for i, label in enumerate(meta["labels"])],
    }, indent=2) + "\n")
    return [logits_file.name, meta_file.name, "segment.mask.bin", "segment.expected.json"]


# The scores the detection case suppresses at: box_coding's evaluation threshold, and the one the app shows from.
DETECTION_CONFIDENCES = (CONFIDENCE, 0.5)


def _write_detection(out: Path, detector: str | Path | None) -> list[str]:
    """A raw detector file, its metadata, its raw uint8 outputs for a photo,
    the anchors and box scales Python reads from the file and, at each of
    DETECTION_CONFIDENCES, the detections Python makes of the outputs
    (boxes, scores, classes counted from 0 without the background)."""
    names = {"model": "detect.tflite", "meta": "detect.json", "boxes": "detect.boxes.bin", "scores": "detect.scores.bin"}
    if detector is not None:
        content = Path(detector).read_bytes()
        meta = read_embedded(content)
        pre = preprocessing_of(meta)
        photo = _detector_input(open_rgb(out / "camera_bilinear.png"), pre)
        boxes, scores = split_outputs(content, run_in_process(content, file_inputs(content, to_model_input(photo, pre)[None],
                                                                                   meta)))
        for key, values, said in (("boxes", boxes, meta["detection"]["outputs"][0]),
                                  ("scores", scores, meta["detection"]["outputs"][1])):
            q = said["quantization"]
            raw = quantize(values, {"dtype": np.dtype(said["dtype"]), "quantization": (q["scale"], q["zero_point"])})
            (out / names[key]).write_bytes(raw.tobytes())
        (out / names["model"]).write_bytes(content)
        (out / names["meta"]).write_text(json.dumps(meta, indent=2) + "\n")
    elif out != DEFAULT_OUT:
        for name in names.values():
            shutil.copy(DEFAULT_OUT / name, out / name)
    meta = json.loads((out / names["meta"]).read_text())
    boxes_said, scores_said = meta["detection"]["outputs"]
    regressions, probabilities = (
        dequantize(np.frombuffer((out / names[key]).read_bytes(), said["dtype"]).reshape(said["shape"]),
                   {"dtype": np.dtype(said["dtype"]),
                    "quantization": (said["quantization"]["scale"], said["quantization"]["zero_point"])})[0]
        for key, said in (("boxes", boxes_said), ("scores", scores_said)))
    options = detector_options(read_standard((out / names["model"]).read_bytes()))
    anchors = anchors_of_options(options)
    decoded = decode(regressions, anchors)
    with_background = np.concatenate([np.zeros_like(probabilities[:, :1]), probabilities], axis=1)
    suppress, _ = detection_postprocessing(MEDIAPIPE_NMS, meta)
    cases = []
    for confidence in DETECTION_CONFIDENCES:
        kept_boxes, kept_scores, kept_classes = suppress(decoded, with_background, confidence=confidence)
        cases.append({"confidence": confidence, "boxes": kept_boxes.astype(np.float32).tolist(),
                      "scores": kept_scores.tolist(), "classes": (kept_classes - 1).tolist()})
    decoding = options["tensors_decoding_options"]
    (out / "detect.expected.json").write_text(json.dumps({
        "anchors": anchors.tolist(), "scales": [decoding[k] for k in ("y_scale", "x_scale", "h_scale", "w_scale")],
        "cases": cases}, indent=2) + "\n")
    return [*names.values(), "detect.expected.json"]


# Frames of CASES a detector is fed, to the detect.json detector's 64 px: 160 x 120 (more than 2x smaller: taps
# skip pixels), 61 x 47 (larger: positions exactly half-way between 1/32 steps, rounded to even) and 13 x 10 (edges
# repeated).
DETECTOR_FRAMES = ("camera_bilinear", "downscale_bilinear", "upscale_bicubic")


def _detector_input(photo: Image.Image, pre: Preprocessing) -> Image.Image:
    """The whole photo resized to the square as `edgevit eval` feeds a detector (and the app does)."""
    return transform(pre).placement(photo.size, whole=True).apply(photo, PIL_FILTERS[pre.interpolation])


def _write_detector_frames(out: Path) -> list[str]:
    """Each frame of DETECTOR_FRAMES as the detection case's detector is fed it: its RGB bytes, row by row."""
    pre = preprocessing_of(json.loads((out / "detect.json").read_text()))
    for name in DETECTOR_FRAMES:
        (out / f"{name}.detector.rgb").write_bytes(np.asarray(_detector_input(open_rgb(out / f"{name}.png"), pre),
                                                              np.uint8).tobytes())
    (out / "detector_frames.txt").write_text("\n".join(DETECTOR_FRAMES) + "\n")
    return [f"{name}.detector.rgb" for name in DETECTOR_FRAMES] + ["detector_frames.txt"]


def _voc_color(index: int) -> int:
    """PASCAL VOC's colour of class ``index`` as an opaque ARGB int (signed,
    as Kotlin's Int): bit 3k, 3k+1 and 3k+2 of the index go to bit 7-k of
    red, green and blue."""
    rgb = [0, 0, 0]
    for k in range(8):
        for channel in range(3):
            rgb[channel] |= ((index >> (3 * k + channel)) & 1) << (7 - k)
    argb = 0xFF000000 | rgb[0] << 16 | rgb[1] << 8 | rgb[2]
    return argb - (1 << 32)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--segmenter", type=Path, default=None,
                        help="An int8 segmenter .tflite whose logits start the segmentation case")
    parser.add_argument("--detector", type=Path, default=None,
                        help="A raw int8 detector .tflite that makes the detection case")
    args = parser.parse_args()
    print(f"{len(write_golden(args.out, args.segmenter, args.detector))} files written to {args.out}")
