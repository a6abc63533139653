"""How exactly a QAT model's int8 file computes what the QAT model computes,
on real photos, after QAT as a user runs it.

Usage:
  python benchmarks/qat_agreement.py [--data ../shared/data/hymenoptera]
      [--models mobilevit_v2_050,mobilevit_v3_050] [--sizes 256,128] [--epochs 1,10] [--out DIR]

For each model, input size and epoch count, the two commands of the README:
`edgevit qat NAME --data DIR --epochs N --input-size S -o NAME.keras`
(random initialisation, the CLI's defaults) and `edgevit convert --int8
NAME.keras`; then the QAT model (Keras) and its int8 file (LiteRT's XNNPACK
kernels, as phones run it) on every image of DIR/val: images whose top-1
differs, top-1 agreement, mean and min logit cosine, and the share of logits
that are identical. One Markdown row per run, and JSON beside the files.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

TABLE_HEADER = ("| model | input | QAT epochs | val images | top-1 differs | top-1 agreement | mean logit cosine | "
                "min logit cosine | logits identical | minutes |\n|---|---|---|---|---|---|---|---|---|---|")


def edgevit(*args: str, log: Path) -> None:
    """One edgevit command in a child process, its output appended to ``log``."""
    with log.open("a") as out:
        out.write(f"\n$ edgevit {' '.join(args)}\n")
        out.flush()
        done = subprocess.run([sys.executable, "-m", "edgevit", *args], stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"edgevit {args[0]} failed (exit {done.returncode}); see {log}")


def run(name: str, size: int, epochs: int, data: Path, out: Path) -> dict:
    from edgevit.data.folders import find_dataset
    from edgevit.data.stream import ImageStream
    from edgevit.litert.agreement import agreement
    from edgevit.litert.run_model import run_in_child
    from edgevit.registry import get_spec
    from edgevit.saving import load_model

    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    keras_path, tflite_path, log = out / f"{name}.keras", out / f"{name}_int8.tflite", out / "commands.log"
    edgevit("qat", name, "--data", str(data), "--epochs", str(epochs), "--input-size", str(size),
            "-o", str(keras_path), log=log)
    # the graph's own int8 input and logits: what the QAT model computes, value for value
    edgevit("convert", "--int8", str(keras_path), "--io", "int8", "--logits", "-o", str(tflite_path), "--no-gpu-run",
            "--no-arm-run", log=log)

    pre = get_spec(name).preprocessing_at(size)
    x, _ = ImageStream(find_dataset(data).val, pre).read_all(size)
    keras_logits = load_model(keras_path).predict(x, batch_size=16, verbose=0)
    file_logits = run_in_child(tflite_path, x, num_threads=2)
    agree = agreement(keras_logits, file_logits)
    result = {"model": name, "input_size": size, "qat_epochs": epochs, "val_images": len(x),
              "images_disagreeing": int((keras_logits.argmax(1) != file_logits.argmax(1)).sum()),
              "top1_agreement": agree["top1_agreement"], "cosine_mean": agree["cosine_mean"],
              "cosine_min": agree["cosine_min"], "max_abs_logit_error": agree["max_abs_logit_error"],
              "logits_identical": float(np.mean(keras_logits == file_logits)),
              "minutes": round((time.perf_counter() - started) / 60, 1)}
    (out / "result.json").write_text(json.dumps(result, indent=2))
    return result


def table_row(r: dict) -> str:
    return (f"| `{r['model']}` | {r['input_size']} | {r['qat_epochs']} | {r['val_images']} | "
            f"{r['images_disagreeing']} | {r['top1_agreement']:.1%} | {r['cosine_mean']:.5f} | "
            f"{r['cosine_min']:.5f} | {r['logits_identical']:.1%} | {r['minutes']} |")


def main(argv=None) -> int:
    root = Path(__file__).resolve().parents[1]
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(root.parent / "shared" / "data" / "hymenoptera"))
    p.add_argument("--models", default="mobilevit_v2_050,mobilevit_v3_050")
    p.add_argument("--sizes", default="256,128", help="Comma list of input sizes.")
    p.add_argument("--epochs", default="1,10", help="Comma list of QAT epoch counts (one run each).")
    p.add_argument("--out", default="/tmp/edgevit-qat-agreement")
    args = p.parse_args(argv)

    data, out = Path(args.data), Path(args.out)
    rows = []
    print(TABLE_HEADER, flush=True)
    for name in args.models.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            for epochs in (int(e) for e in args.epochs.split(",")):
                rows.append(run(name, size, epochs, data, out / f"{name}_{size}_{epochs}"))
                print(table_row(rows[-1]), flush=True)
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
