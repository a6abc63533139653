"""What `edgevit qat` costs against a float fine-tune of the same model on the
same images, in one run: fixed cost, steady epoch, evaluation of the saved
model and peak resident memory, each as a ratio QAT / float.

    python benchmarks/qat_cost.py                       # mobilevit_v3_xxs, 128 px, 3 epochs, hymenoptera
    python benchmarks/qat_cost.py --model vit_tiny16 --input-size 64 --epochs 2 --json qat_cost.json

Four commands as a user runs them, each in its own process, one after the
other (benchmarks/memory.py's sampler sums the resident memory of each
one's process tree):

1. `edgevit finetune MODEL --epochs E -o float.keras` (random weights, whose
   BatchNorm statistics it estimates first),
2. `edgevit qat float.keras --epochs E -o qat.keras`,
3. and 4. `edgevit eval` of each .keras on the val images.

A training command's fixed cost is its wall time less E steady epochs
(building, images, BatchNorm estimation or range calibration, the first
epoch's tracing, the evaluations, saving); a steady epoch is the median of
the epochs after the first (training only, as its JSON history times them).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from memory import measure

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hymenoptera"


def edgevit(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgevit", *args]


def training(what: str, command: list[str], epochs: int) -> dict:
    run = measure(what, command)
    history = json.loads(run.pop("stdout"))["history"]
    steady = round(statistics.median(h["seconds"] for h in history[1:]), 1)
    return {"seconds": run["seconds"], "peak_gb": run["peak_gb"], "epochs": [h["seconds"] for h in history],
            "steady_epoch_seconds": steady, "fixed_seconds": round(run["seconds"] - epochs * steady, 1),
            "val_top1": history[-1].get("val_top1")}


def evaluation(what: str, command: list[str]) -> dict:
    run = measure(what, command)
    return {"seconds": run["seconds"], "peak_gb": run["peak_gb"], "top1": json.loads(run["stdout"])["top1"]}


def compare(model: str, input_size: int, epochs: int, data: Path, folder: Path) -> dict:
    common = ["--data", str(data), "--epochs", str(epochs), "--json"]
    float_keras, qat_keras = folder / "float.keras", folder / "qat.keras"
    print(f"> edgevit finetune {model} --epochs {epochs}", file=sys.stderr, flush=True)
    float_run = training("edgevit finetune", edgevit("finetune", model, "--input-size", str(input_size), *common,
                                                     "-o", str(float_keras)), epochs)
    print(f"> edgevit qat float.keras --epochs {epochs}", file=sys.stderr, flush=True)
    qat_run = training("edgevit qat", edgevit("qat", str(float_keras), *common, "-o", str(qat_keras)), epochs)
    for name, path in (("float", float_keras), ("qat", qat_keras)):
        print(f"> edgevit eval {path.name}", file=sys.stderr, flush=True)
        (float_run if name == "float" else qat_run)["eval"] = evaluation(
            f"edgevit eval {path.name}", edgevit("eval", str(path), "--data", str(data), "--json"))
    ratio = {key: round(qat_run[key] / float_run[key], 2) for key in ("fixed_seconds", "steady_epoch_seconds",
                                                                         "seconds", "peak_gb")}
    ratio["eval_seconds"] = round(qat_run["eval"]["seconds"] / float_run["eval"]["seconds"], 2)
    return {"model": model, "input_size": input_size, "epochs": epochs, "data": str(data), "float": float_run,
            "qat": qat_run, "qat_over_float": ratio}


def print_table(row: dict) -> None:
    print(f"\n{row['model']} at {row['input_size']} px, {row['epochs']} epochs on {row['data']}")
    print(f"  {'':<22} {'float':>9} {'QAT':>9} {'QAT/float':>10}")
    lines = (("command (s)", "seconds", "seconds"), ("fixed cost (s)", "fixed_seconds", "fixed_seconds"),
             ("steady epoch (s)", "steady_epoch_seconds", "steady_epoch_seconds"),
             ("peak memory, tree (GB)", "peak_gb", "peak_gb"))
    for label, key, ratio in lines:
        print(f"  {label:<22} {row['float'][key]:>9} {row['qat'][key]:>9} {row['qat_over_float'][ratio]:>10}")
    print(f"  {'eval of the .keras (s)':<22} {row['float']['eval']['seconds']:>9} {row['qat']['eval']['seconds']:>9} "
          f"{row['qat_over_float']['eval_seconds']:>10}")
    print(f"  {'eval peak memory (GB)':<22} {row['float']['eval']['peak_gb']:>9} {row['qat']['eval']['peak_gb']:>9}")
    print(f"  epochs (s): float {row['float']['epochs']}, QAT {row['qat']['epochs']}")
    print(f"  val top-1: float {row['float']['eval']['top1']}, QAT {row['qat']['eval']['top1']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mobilevit_v3_xxs")
    parser.add_argument("--input-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=3, help="At least 2: the epochs after the first are steady.")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--json", type=Path, help="Also write the result here.")
    args = parser.parse_args()
    if args.epochs < 2:
        sys.exit("error: --epochs must be at least 2 (the first epoch traces the training step)")
    if not args.data.is_dir():
        sys.exit(f"error: {args.data} is not a folder (pass --data DIR: DIR/train/<class>/*, DIR/val/<class>/*)")
    with tempfile.TemporaryDirectory() as tmp:
        row = compare(args.model, args.input_size, args.epochs, args.data, Path(tmp))
    print_table(row)
    if args.json is not None:
        args.json.write_text(json.dumps(row, indent=2) + "\n")


if __name__ == "__main__":
    main()
