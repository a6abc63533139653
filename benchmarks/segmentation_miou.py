"""mIoU of a fine-tuned segmenter, of its quantization-aware-trained model
and of that model's int8 file, on the synthetic shapes dataset the tests
generate (a bright square on a dark ground, the square's mask with a
255 border), every step the command a user runs:

    edgevit finetune deeplabv3_mobilevit_v1_xxs --data SHAPES ...  -> float .keras
    edgevit qat FLOAT.keras --data SHAPES ...                      -> QAT .keras
    edgevit convert --int8 QAT.keras                               -> int8 .tflite
    edgevit eval MODEL --data SHAPES                               (each of the three)

    PYTHONPATH=. python benchmarks/segmentation_miou.py --json benchmarks/results/segmentation-miou-DATE.json

Goal (issue 54): the int8 file's mIoU within 1 point (0.01) of its float
model's, the QAT .keras it was converted from; the fine-tuned model's is
reported beside them. The square covers a quarter of each image: a model
that calls every pixel background scores about 0.375 mIoU (background IoU
0.75, square 0).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.test_segmentation_data import make_segmentation_folder

MODEL = "deeplabv3_mobilevit_v1_xxs"
INT8_WITHIN = 0.01  # mIoU, int8 file against the QAT model it was converted from


def edgevit(*args) -> tuple[dict, float]:
    """``edgevit ARGS --json``'s result and wall seconds; exits with its error where it fails."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "edgevit", *map(str, args), "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: edgevit {' '.join(map(str, args))} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout), round(time.perf_counter() - start, 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=48, help="Images per split (train and val).")
    parser.add_argument("--image-size", type=int, nargs=2, default=[96, 80], metavar=("W", "H"))
    parser.add_argument("--input-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=8, help="Fine-tuning epochs.")
    parser.add_argument("--qat-epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json", dest="json_path", default=None, help="Also write the result as JSON here.")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="edgevit-miou-") as tmp:
        work = Path(tmp)
        data = make_segmentation_folder(work / "shapes", per_split=args.images, size=tuple(args.image_size))
        common = ["--data", data, "--batch-size", args.batch_size]
        finetuned, finetune_s = edgevit("finetune", MODEL, *common, "--input-size", args.input_size,
                                        "--epochs", args.epochs, "-o", work / "float.keras")
        qat, qat_s = edgevit("qat", work / "float.keras", *common, "--epochs", args.qat_epochs,
                             "-o", work / "qat.keras")
        converted, convert_s = edgevit("convert", "--int8", work / "qat.keras", "-o", work / "qat_int8.tflite")
        scores = {name: edgevit("eval", work / name, "--data", data)[0]
                  for name in ("float.keras", "qat.keras", "qat_int8.tflite")}

    result = {
        "model": MODEL, "input_size": args.input_size, "images_per_split": args.images,
        "image_size": args.image_size, "epochs": args.epochs, "qat_epochs": args.qat_epochs,
        "batch_size": args.batch_size,
        "seconds": {"finetune": finetune_s, "qat": qat_s, "convert": convert_s},
        "miou": {"float": scores["float.keras"]["miou"], "qat": scores["qat.keras"]["miou"],
                 "int8_file": scores["qat_int8.tflite"]["miou"]},
        "per_class_iou": {name: s["per_class_iou"] for name, s in scores.items()},
        "pixel_accuracy": {name: s["pixel_accuracy"] for name, s in scores.items()},
        "training_val_miou": {"finetune": finetuned["val_miou"], "qat": qat["val_miou"]},
        "int8_file": {"size_bytes": converted["size_bytes"], "agreement": converted["agreement"]},
    }
    miou = result["miou"]
    gap = round(miou["qat"] - miou["int8_file"], 4)
    result["int8_within_qat"] = abs(gap) <= INT8_WITHIN
    print(f"{MODEL} at {args.input_size} px, shapes {args.images} train / {args.images} val images")
    print(f"  mIoU: fine-tuned {miou['float']:.4f}, QAT {miou['qat']:.4f}, int8 file {miou['int8_file']:.4f}")
    print(f"  int8 file vs QAT model: {gap:+.4f} (goal within {INT8_WITHIN}) -> "
          f"{'meets' if result['int8_within_qat'] else 'MISSES'}")
    print(f"  seconds: finetune {finetune_s}, qat {qat_s}, convert {convert_s}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
