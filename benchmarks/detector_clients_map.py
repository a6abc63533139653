"""COCO mAP of one int8 detector file as `edgevit eval` scores it and as an
app sees it through MediaPipe Tasks' ObjectDetector (both file forms) and
the TFLite Task Library's (the post-processing-op form) (issue 55: within
0.02 on real photos).

Usage:
  python benchmarks/detector_clients_map.py [--model ssdlite_mobilevit_v1_xxs] [--size 128] [--epochs 20]
      [--batch-size 16] [--lr 0.002] [--out DIR] [--photos DIR] [--keras FILE]

No box dataset of real photos is reachable offline, so the script builds
the closest honest one: the photos of ``--photos`` (default
../shared/data/imagenet-sample) as backgrounds, each with one to three
objects pasted on it (squares and discs of a jittered colour, their edges
softened, 20-55 % of the photo's shorter side), the boxes known, in the
COCO layout (train: two composites of each of 80 % of the photos; val:
one of each of the rest, at the photo's own size). It then runs the
commands as a user does: `edgevit finetune` (skipped with ``--keras``),
`edgevit convert --int8` twice (the default raw form and
``--add-postprocessing-op``, calibrated on the train images) and `edgevit
eval` of the model and of each file (its default ``--nms mediapipe``, and
``--nms cvnets``: cvnets' per-class NMS, eval's only one before); and feeds the val photos at their own size to
MediaPipe's ObjectDetector (each file; and once more resized as eval
resizes them, which leaves the post-processing alone to differ) and to the
Task Library's (the post-processing-op file) in the clients' own processes
(tests/standard_clients.py), with what a user sets to measure mAP: score
threshold 0.01 (cvnets' evaluation threshold) and at most 100 results an
image (what COCO's mAP counts). The clients' boxes are scored by the same
COCO evaluation `edgevit eval` uses. Last, the op file's own detections
on eval's pixels (LiteRT), exact and moved to the photo's whole pixels as
MediaPipe reports its boxes: what MediaPipe's integer boxes cost. Writes
DIR/detector-clients-map.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.detection_map import CommandLog  # noqa: E402

CLASSES = ("square", "disc")
# each class's colour, jittered per object: the detector learns shapes on real, busy backgrounds
COLOURS = {"square": (230, 60, 40), "disc": (40, 200, 230)}
SCORE_THRESHOLD = 0.01
MAX_RESULTS = 100


def photo_folder(photos: Path, out: Path, seed: int = 0) -> Path:
    """A COCO-layout folder of ``photos`` with shapes pasted on them (see the module's docstring)."""
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(seed)
    paths = sorted(p for p in photos.iterdir() if p.suffix.lower() in (".jpeg", ".jpg", ".png"))
    rng.shuffle(paths)
    cut = int(len(paths) * 0.8)
    (out / "annotations").mkdir(parents=True, exist_ok=True)
    for split, chosen, copies in (("train", paths[:cut], 2), ("val", paths[cut:], 1)):
        (out / split).mkdir(exist_ok=True)
        images, annotations = [], []
        for path in chosen:
            photo = Image.open(path).convert("RGB")
            for copy in range(copies):
                pixels, boxes = _composite(photo, rng, Image, ImageFilter)
                image_id = len(images) + 1
                name = f"{path.stem}_{copy}.jpg"
                Image.fromarray(pixels).save(out / split / name, quality=92)
                images.append({"id": image_id, "file_name": name, "width": pixels.shape[1],
                               "height": pixels.shape[0]})
                for category, (x0, y0, w, h) in boxes:
                    annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": category,
                                        "bbox": [x0, y0, w, h], "area": w * h, "iscrowd": 0})
        categories = [{"id": c, "name": name, "supercategory": "shape"} for c, name in enumerate(CLASSES, 1)]
        (out / "annotations" / f"instances_{split}.json").write_text(json.dumps(
            {"images": images, "annotations": annotations, "categories": categories}))
    return out


def _composite(photo, rng, Image, ImageFilter):
    """The photo with one to three shapes on it, and their (category, [x0, y0, w, h]) in its pixels."""
    canvas = photo.copy()
    width, height = canvas.size
    boxes = []
    for _ in range(int(rng.integers(1, 4))):
        category = int(rng.integers(1, len(CLASSES) + 1))
        side = int(rng.uniform(0.2, 0.55) * min(width, height))
        x0, y0 = int(rng.integers(0, width - side)), int(rng.integers(0, height - side))
        colour = tuple(int(np.clip(c + rng.integers(-30, 31), 0, 255)) for c in COLOURS[CLASSES[category - 1]])
        shade = Image.new("RGB", (side, side), colour)
        mask = Image.new("L", (side, side), 0)
        if CLASSES[category - 1] == "square":
            mask.paste(255, (0, 0, side, side))
        else:
            from PIL import ImageDraw

            ImageDraw.Draw(mask).ellipse((0, 0, side - 1, side - 1), fill=255)
        canvas.paste(shade, (x0, y0), mask.filter(ImageFilter.GaussianBlur(1)))
        boxes.append((category, [x0, y0, side, side]))
    return np.asarray(canvas), boxes


def client_detections(client: str, model: Path, data: Path, tmp: Path, input_size: int | None = None) -> list:
    """Per val image (in the annotations' order), the client's detections
    [index, name, score, ymin, xmin, ymax, xmax] normalised; the images fed
    at their own size, as a camera frame is, or with ``input_size`` already
    resized to the model's input as `edgevit eval` resizes them
    (edgevit.data.transforms.mediapipe_resize)."""
    from PIL import Image

    from edgevit.data.transforms import mediapipe_resize
    from tests.standard_clients import detect

    listing = json.loads((data / "annotations" / "instances_val.json").read_text())["images"]
    photos = [np.asarray(Image.open(data / "val" / entry["file_name"]).convert("RGB")) for entry in listing]
    if input_size:
        photos = [mediapipe_resize(photo, input_size) for photo in photos]
    found = detect(client, model, photos, tmp, score_threshold=SCORE_THRESHOLD, max_results=MAX_RESULTS)
    if isinstance(found, str):
        raise SystemExit(f"{client} refused {model.name}: {found}")
    return found


def op_detections(model: Path, data: Path, input_size: int, whole_pixels: bool) -> list:
    """Per val image, the post-processing op's own detections (LiteRT runs
    the op file on eval's pixels) in the clients' layout, score >= the
    clients' threshold; with ``whole_pixels`` each box moved to whole pixels
    of the photo as MediaPipe reports it (DetectionTransformationCalculator:
    the corner and the size each truncated to an integer)."""
    from PIL import Image

    from edgevit.data.transforms import mediapipe_resize
    from edgevit.litert.interpreter import load_interpreter

    interpreter = load_interpreter(model.read_bytes())
    interpreter.allocate_tensors()
    image_input = interpreter.get_input_details()[0]["index"]
    outputs = [detail["index"] for detail in interpreter.get_output_details()]  # boxes, classes, scores, count
    found = []
    for entry in json.loads((data / "annotations" / "instances_val.json").read_text())["images"]:
        photo = np.asarray(Image.open(data / "val" / entry["file_name"]).convert("RGB"))
        interpreter.set_tensor(image_input, mediapipe_resize(photo, input_size)[None])
        interpreter.invoke()
        boxes, classes, scores, count = (interpreter.get_tensor(index)[0] for index in outputs)
        width, height = entry["width"], entry["height"]
        image = []
        for (ymin, xmin, ymax, xmax), index, score in zip(np.clip(boxes, 0, 1), classes, scores[:int(count)]):
            if score < SCORE_THRESHOLD:
                continue
            if whole_pixels:
                left, top = int(xmin * width), int(ymin * height)
                right, bottom = left + int((xmax - xmin) * width), top + int((ymax - ymin) * height)
                ymin, xmin, ymax, xmax = top / height, left / width, bottom / height, right / width
            image.append([int(index), CLASSES[int(index)], float(score), float(ymin), float(xmin), float(ymax),
                          float(xmax)])
        found.append(image)
    return found


def client_map(detections: list, data: Path) -> dict:
    """COCO mAP of the clients' detections, scored as `edgevit eval` scores
    a model (edgevit.train.metrics.DetectionTally), boxes in the image's pixels."""
    from edgevit.train.metrics import DetectionTally

    coco = json.loads((data / "annotations" / "instances_val.json").read_text())
    truth = {}
    for box in coco["annotations"]:
        truth.setdefault(box["image_id"], []).append(box)
    tally = DetectionTally(["background", *CLASSES])
    for entry, found in zip(coco["images"], detections):
        scale = np.array([entry["height"], entry["width"]] * 2, np.float32)
        boxes = truth.get(entry["id"], [])
        corners = np.array([[y, x, y + h, x + w] for x, y, w, h in (b["bbox"] for b in boxes)], np.float32)
        classes = np.array([b["category_id"] for b in boxes], np.int64)
        found_boxes = np.array([d[3:] for d in found], np.float32).reshape(-1, 4) * scale
        scores = np.array([d[2] for d in found], np.float32)
        labels = np.array([CLASSES.index(d[1]) + 1 for d in found], np.int64)
        tally.add(corners.reshape(-1, 4), classes, found_boxes, scores, labels)
    report = tally.report()
    return {key: report[key] for key in ("map", "ap50", "ap75", "per_class_ap", "images")}


def scored(report: dict) -> dict:
    return {key: report[key] for key in ("map", "ap50", "ap75", "per_class_ap", "images", "postprocessing")
            if key in report}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ssdlite_mobilevit_v1_xxs")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--photos", type=Path, default=ROOT.parent / "shared" / "data" / "imagenet-sample")
    parser.add_argument("--keras", type=Path, help="A detector trained on DIR/photo-shapes already: skip finetune.")
    parser.add_argument("--out", type=Path, default=Path("detector-clients-map"))
    args = parser.parse_args(argv)

    from tests.standard_clients import missing

    for client in ("mediapipe", "task_library"):
        if missing(client):
            raise SystemExit(f"{client}: {missing(client)}")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    data = out / "photo-shapes"
    if not (data / "annotations" / "instances_val.json").exists():
        photo_folder(args.photos, data)
    log = CommandLog()
    step = log.step

    model = args.keras or out / "det.keras"
    if not args.keras:
        step("finetune", "finetune", args.model, "--data", data, "--input-size", args.size, "--epochs", args.epochs,
             "--batch-size", args.batch_size, "--lr", args.lr, "-o", model, "--overwrite")
    files = {"raw": out / "det_int8.tflite", "postprocessing_op": out / "det_nms_int8.tflite"}
    for form, path in files.items():
        step(f"convert_{form}", "convert", model, "--int8", "--calib", data / "train", "-o", path, "--overwrite",
             "--no-arm-run", "--no-gpu-run", "--no-diagnosis",
             *(["--add-postprocessing-op"] if form == "postprocessing_op" else []))
    results = {"keras": scored(step("eval_keras", "eval", model, "--data", data)),
               "keras_nms_cvnets": scored(step("eval_keras_nms_cvnets", "eval", model, "--data", data, "--nms",
                                               "cvnets"))}
    for form, path in files.items():
        results[form] = {"edgevit_eval": scored(step(f"eval_{form}", "eval", path, "--data", data)),
                         "edgevit_eval_nms_cvnets": scored(step(f"eval_{form}_nms_cvnets", "eval", path, "--data",
                                                                data, "--nms", "cvnets"))}
        clients = ("mediapipe", "task_library") if form == "postprocessing_op" else ("mediapipe",)
        for client in clients:
            start = time.perf_counter()
            results[form][client] = client_map(client_detections(client, path, data, out), data)
            log.seconds[f"{client}_{form}"] = round(time.perf_counter() - start, 1)
            results[form][f"{client}_minus_eval_map"] = round(
                results[form][client]["map"] - results[form]["edgevit_eval"]["map"], 4)
        # the same client on eval's pixels: what is left is the post-processing alone
        results[form]["mediapipe_on_eval_pixels"] = client_map(
            client_detections("mediapipe", path, data, out, input_size=args.size), data)
    # the op's own detections on eval's pixels, exact and in the photo's whole pixels as MediaPipe reports them
    for key, whole_pixels in (("op_on_eval_pixels", False), ("op_on_eval_pixels_whole_photo_pixels", True)):
        results["postprocessing_op"][key] = client_map(
            op_detections(files["postprocessing_op"], data, args.size, whole_pixels), data)
    coco = json.loads((data / "annotations" / "instances_val.json").read_text())
    record = {"model": args.model, "keras": str(model), "input_size": args.size, "epochs": args.epochs,
              "batch_size": args.batch_size, "lr": args.lr, "val_images": len(coco["images"]),
              "val_boxes": len(coco["annotations"]),
              "client_options": {"score_threshold": SCORE_THRESHOLD, "max_results": MAX_RESULTS},
              "map": results, "seconds": log.seconds, "commands": log.commands}
    (out / "detector-clients-map.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
