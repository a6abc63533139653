"""COCO mAP of a detector fine-tuned on generated shapes, of its QAT model and
of the QAT model's int8 file (issue 55: the file within 1 point of the float
model).

Usage:
  python benchmarks/detection_map.py [--model ssdlite_mobilevit_v1_xxs] [--size 160] [--train-images 1024]
      [--val-images 64] [--epochs 30] [--steps-per-epoch 32] [--qat-epochs N] [--qat-steps-per-epoch N]
      [--batch-size 16] [--test-images 512] [--out DIR]

Generates a COCO-layout folder of shapes (squares and discs of 18-36 px on a
noisy 96x80 ground, tests/test_detection_data.py's generator: each covers
a fifth to nearly half of its image's side), then runs the commands
as a user does: `edgevit finetune`, `edgevit qat` (its own epochs and
learning rate unless told), `edgevit convert --int8` (the QAT model's trained
ranges, no calibration images) and `edgevit eval` on the float .keras, the
QAT .keras and the int8 .tflite (LiteRT's XNNPACK kernels), on TEST_IMAGES
held-out images generated apart (another seed: the val split's 64 images,
127 boxes, resolve about a point). `eval` runs with MediaPipe's NMS (its
default) and with cvnets' per-class NMS. Writes DIR/detection-map.json with
each figure, both commands' per-epoch losses and the commands.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgevit.train.run import QAT_LR  # noqa: E402
from tests.test_detection_data import make_detection_folder  # noqa: E402

# The generated images' size. The SSDLite anchors (cvnets' scales 0.1-1.05 of the input) need objects a good part
# of the input across at small inputs: at 128 px the stride-16 level is an 8x8 grid whose cells (0.125) are wider
# than its anchors (0.1, 0.16), and shapes of a tenth to a fifth of the input (18-36 px on 160x144 images) found
# an anchor at IoU >= 0.5 for 40% of them; a fifth to nearly half of it, at 160 px, for 68% (2,000 random boxes).
IMAGE_SIZE = (96, 80)
# The held-out set's generator seed (the training folder's is the generator's default, 0).
TEST_SEED = 7


def edgevit(*args) -> dict:
    """One command's --json result (stdout), its stderr shown on failure."""
    command = [sys.executable, "-m", "edgevit", *map(str, args), "--json"]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


class CommandLog:
    """Runs edgevit commands for a benchmark, keeping each command line and
    its seconds for the results JSON."""

    def __init__(self):
        self.commands, self.seconds = [], {}

    def step(self, name: str, *command) -> dict:
        self.commands.append("edgevit " + " ".join(map(str, command)))
        start = time.perf_counter()
        result = edgevit(*command)
        self.seconds[name] = round(time.perf_counter() - start, 1)
        return result


def scored(report: dict) -> dict:
    return {key: report[key] for key in ("map", "ap50", "ap75", "per_class_ap", "images") if key in report}


def points(scores: dict, suffix: str) -> dict:
    """The int8 file's mAP minus the float model's and minus the float
    model trained on as long as qat trains, in points."""
    file = scores["qat_int8_file"]["map"]
    return {f"file_minus_float_map_points{suffix}": round(100 * (file - scores["float"]["map"]), 2),
            f"file_minus_float_trained_on_map_points{suffix}": round(
                100 * (file - scores["float_trained_on"]["map"]), 2)}


def curve(report: dict) -> list[dict]:
    """A training command's per-epoch losses (train and val)."""
    return [{key: epoch[key] for key in ("epoch", "loss", "val_loss", "val_anchor_accuracy") if key in epoch}
            for epoch in report["history"]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ssdlite_mobilevit_v1_xxs")
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--val-images", type=int, default=64,
                        help="Generated images in val (the commands' per-epoch validation loss).")
    # On 64 training images the float model overfit (train loss 1.34, val 2.08) and QAT's steps went on overfitting
    # them (train loss down to 1.12, val up to 2.13): the comparison measured that, not quantization
    parser.add_argument("--train-images", type=int, default=1024, help="Generated images in train.")
    # 12 epochs (384 steps) left the float model short of converged: `edgevit qat`'s few steps then raised its mAP
    # by 1.3 points (results/detection-map-2026-11-29.json), and the comparison measured that training
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--steps-per-epoch", type=int, default=32,
                        help="Fine-tuning steps an epoch: a from-scratch detector needs hundreds of steps, and each "
                             "epoch's validation costs what several steps do.")
    parser.add_argument("--qat-epochs", type=int, help="QAT epochs (default: edgevit qat's own, as a user runs it).")
    parser.add_argument("--qat-steps-per-epoch", type=int, help="QAT steps an epoch (default: edgevit qat's own).")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--test-images", type=int, default=512, help="Held-out images the four models are scored on.")
    parser.add_argument("--out", type=Path, default=Path("detection-map"))
    args = parser.parse_args(argv)

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    data = make_detection_folder(out / "shapes", per_split=args.val_images, size=IMAGE_SIZE,
                                 train_images=args.train_images)
    # its train split is not used: the generator makes both
    held_out = make_detection_folder(out / "held-out", per_split=args.test_images, size=IMAGE_SIZE, seed=TEST_SEED)
    float_model, qat_model, int8_file = out / "det.keras", out / "det_qat.keras", out / "det_qat_int8.tflite"
    log = CommandLog()
    step = log.step
    finetune = step("finetune", "finetune", args.model, "--data", data, "--input-size", args.size,
                    "--epochs", args.epochs, "--steps-per-epoch", args.steps_per_epoch, "--batch-size", args.batch_size,
                    "--lr", args.lr, "-o", float_model, "--overwrite")
    qat_epochs = () if args.qat_epochs is None else ("--epochs", args.qat_epochs)
    qat_steps = () if args.qat_steps_per_epoch is None else ("--steps-per-epoch", args.qat_steps_per_epoch)
    qat = step("qat", "qat", float_model, "--data", data, *qat_epochs, *qat_steps, "--batch-size", args.batch_size,
               "-o", qat_model, "--overwrite")
    # the control: the float model trained qat's steps at qat's learning rate, in float (finetune warms up over the
    # first of its epochs): what those steps do without quantization
    float_trained_on = out / "det_trained_on.keras"
    finetune_on = step("finetune_on", "finetune", float_model, "--data", data, "--epochs", len(qat["history"]),
                       *qat_steps, "--batch-size", args.batch_size, "--lr", QAT_LR, "-o", float_trained_on,
                       "--overwrite")
    convert = step("convert", "convert", qat_model, "--int8", "-o", int8_file, "--overwrite", "--no-arm-run",
                   "--no-gpu-run", "--no-diagnosis")
    models = (("float", float_model), ("float_trained_on", float_trained_on), ("qat", qat_model),
              ("qat_int8_file", int8_file))
    results = {name: scored(step(f"eval_{name}", "eval", path, "--data", held_out)) for name, path in models}
    cvnets_nms = {name: scored(step(f"eval_{name}_cvnets_nms", "eval", path, "--data", held_out, "--nms", "cvnets"))
                  for name, path in models}
    record = {"model": args.model, "input_size": args.size, "train_images": args.train_images,
              "val_images": args.val_images, "held_out_images": args.test_images,
              "epochs": args.epochs, "steps_per_epoch": args.steps_per_epoch, "qat_epochs": len(qat["history"]),
              "qat_steps_per_epoch": qat["steps_per_epoch"],  # null: every training image once
              "batch_size": args.batch_size, "lr": args.lr,
              "map": results, **points(results, ""), "map_cvnets_nms": cvnets_nms, **points(cvnets_nms, "_cvnets_nms"),
              "finetune_curve": curve(finetune),
              "float_trained_on_curve": curve(finetune_on),
              "qat_val_loss": {"float_model": qat["float_val_loss"], "calibrated": qat["qat_val_loss_calibrated"],
                               "epochs": curve(qat)},
              "convert_validation": convert["agreement"], "seconds": log.seconds, "commands": log.commands}
    (out / "detection-map.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
