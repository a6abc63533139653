"""COCO mAP of a detector fine-tuned on generated shapes, of its QAT model and
of the QAT model's int8 file (issue 55: the file within 1 point of the float
model).

Usage:
  python benchmarks/detection_map.py [--model ssdlite_mobilevit_v1_xxs] [--size 128] [--per-split 64]
      [--epochs 30] [--qat-epochs 3] [--batch-size 16] [--out DIR]

Generates a COCO-layout folder of shapes (squares and discs on a noisy
ground, tests/test_detection_data.py's generator), then runs the commands
as a user does: `edgevit finetune`, `edgevit qat`, `edgevit convert --int8`
(the QAT model's trained ranges, no calibration images) and `edgevit eval`
on the float .keras, the QAT .keras and the int8 .tflite (LiteRT's XNNPACK
kernels), on the folder's val split. Writes DIR/detection-map.json with each
figure and the commands.
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

from tests.test_detection_data import make_detection_folder  # noqa: E402


def edgevit(*args) -> dict:
    """One command's --json result (stdout), its stderr shown on failure."""
    command = [sys.executable, "-m", "edgevit", *map(str, args), "--json"]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def scored(report: dict) -> dict:
    return {key: report[key] for key in ("map", "ap50", "ap75", "per_class_ap", "images") if key in report}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ssdlite_mobilevit_v1_xxs")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--per-split", type=int, default=64, help="Generated images in train and in val.")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--qat-epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--out", type=Path, default=Path("detection-map"))
    args = parser.parse_args(argv)

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    data = make_detection_folder(out / "shapes", per_split=args.per_split, size=(args.size + 32, args.size + 16))
    float_model, qat_model, int8_file = out / "det.keras", out / "det_qat.keras", out / "det_qat_int8.tflite"
    commands, seconds = [], {}

    def step(name, *command):
        commands.append("edgevit " + " ".join(map(str, command)))
        start = time.perf_counter()
        result = edgevit(*command)
        seconds[name] = round(time.perf_counter() - start, 1)
        return result

    step("finetune", "finetune", args.model, "--data", data, "--input-size", args.size, "--epochs", args.epochs,
         "--batch-size", args.batch_size, "--lr", args.lr, "-o", float_model, "--overwrite")
    step("qat", "qat", float_model, "--data", data, "--epochs", args.qat_epochs, "--batch-size", args.batch_size,
         "-o", qat_model, "--overwrite")
    convert = step("convert", "convert", qat_model, "--int8", "-o", int8_file, "--overwrite", "--no-arm-run",
                   "--no-gpu-run", "--no-diagnosis")
    results = {name: scored(step(f"eval_{name}", "eval", path, "--data", data))
               for name, path in (("float", float_model), ("qat", qat_model), ("qat_int8_file", int8_file))}
    record = {"model": args.model, "input_size": args.size, "images_per_split": args.per_split,
              "epochs": args.epochs, "qat_epochs": args.qat_epochs, "batch_size": args.batch_size, "lr": args.lr,
              "map": results, "file_minus_float_map_points": round(
                  100 * (results["qat_int8_file"]["map"] - results["float"]["map"]), 2),
              "convert_validation": convert["agreement"], "seconds": seconds, "commands": commands}
    (out / "detection-map.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
