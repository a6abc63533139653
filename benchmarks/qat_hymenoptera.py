"""Float vs post-training int8 vs QAT int8 on hymenoptera (ants/bees), and
how exactly a QAT model predicts its int8 file.

Usage:
  python benchmarks/qat_hymenoptera.py [--data ../shared/data/hymenoptera]
      [--model mobilevit_v3_xxs] [--size 160] [--epochs 30] [--qat-epochs 10] [--out DIR]
  python benchmarks/qat_hymenoptera.py --families [--size 64] [--epochs 6] [--qat-epochs 2]

Runs the same steps as the CLI (`edgevit finetune`, `edgevit convert --int8`,
`edgevit qat`, `edgevit eval`) in one process, from random initialisation:
float training and QAT are the commands' own runs (`edgevit.train.run`),
post-training int8 is calibrated on 64 train images, the QAT model's int8 file
(its trained ranges, no calibration images). Every file runs on LiteRT's
XNNPACK kernels, as phones run it. Reported on the val split: top-1 of each,
and QAT Keras vs its int8 file: images whose top-1 differs, mean logit
cosine; on this host's kernels and, where the emulators are installed, on
the AVX2 kernels of an x86 CPU without AVX-512 and on the phone's Arm64
kernels (a Cortex-A76's). ``--families`` does this for the smallest variant of every family at
a small input size (each at least its patch grid) and prints one Markdown
row per family; without it, one model in detail.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

# The smallest registered variant of every family.
FAMILIES = ("mobilevit_v1_xxs", "mobilevit_v2_050", "mobilevit_v3_xxs", "vit_tiny16", "deit_tiny", "deepvit_s",
            "convit_tiny", "crossvit_tiny", "pit_ti", "cvt_13", "mixer_s16", "resmlp_12", "pvt_v2_b0", "swin_tiny",
            "swinv2_tiny", "cswin_tiny", "t2t_vit_7")


def smallest_size(name: str, size: int) -> int:
    """``size`` rounded up to an input size ``name`` takes."""
    from edgevit.registry import get_spec

    multiple = get_spec(name).input_size_multiple
    return -(-size // multiple) * multiple


def run(name: str, size: int, epochs: int, qat_epochs: int, data_dir: str, out: Path, *, batch_size: int, lr: float,
        qat_lr: float) -> dict:
    """The float and QAT runs of `edgevit finetune` and `edgevit qat`
    (:mod:`edgevit.train.run`, their options as given), then the files."""
    import keras

    from edgevit.data.folders import find_dataset
    from edgevit.data.stream import ImageStream
    from edgevit.export.convert import convert
    from edgevit.export.graph import describe
    from edgevit.litert.run_model import run_in_child
    from edgevit.registry import get_spec
    from edgevit.train.metrics import accuracy_report
    from edgevit.train.run import Finetune, QuantizationAwareTraining, RunOptions

    keras.utils.set_random_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    data = find_dataset(data_dir)
    pre = get_spec(name).preprocessing_at(size)
    train = ImageStream(data.train, pre)
    x_val, val_labels = ImageStream(data.val, pre).read_all(size)
    x_cal, _ = train.subset(np.random.default_rng(0).permutation(len(train))[:64]).read_all(size)

    def top1(logits):
        return accuracy_report(np.asarray(logits), val_labels, data.classes)["top1"]

    def run_file(content: bytes, stem: str):
        path = out / f"{stem}.tflite"
        path.write_bytes(content)
        return run_in_child(path, x_val, num_threads=2)

    common = {"batch_size": batch_size, "input_size": size, "overwrite": True}
    Finetune(RunOptions(name, data_dir, str(out / "float.keras"), epochs=epochs, lr=lr, **common)).execute()
    model = keras.models.load_model(out / "float.keras")
    float_logits = model.predict(x_val, batch_size=32, verbose=0)
    ptq_logits = run_file(convert(model, "int8", x_cal, "int8"), "ptq_int8")

    qat_run = QuantizationAwareTraining(RunOptions(str(out / "float.keras"), data_dir, str(out / "qat.keras"),
                                                   epochs=qat_epochs, lr=qat_lr, **common))
    calibrated_top1 = qat_run.execute()["qat_val_top1_calibrated"]
    qat = qat_run.model
    qat_logits = qat.predict(x_val, batch_size=32, verbose=0)
    content = convert(qat, "int8", None, "int8")
    qat_int8_logits = run_file(content, "qat_int8")
    on_kernels = {kernels: vs_file(qat_logits, logits)
                  for kernels, logits in file_on_emulated_kernels(out / "qat_int8.tflite", x_val).items()}
    result = {
        "model": name, "input_size": size, "epochs": epochs, "qat_epochs": qat_epochs, "val_images": len(x_val),
        "top1": {"float": top1(float_logits), "ptq_int8": top1(ptq_logits), "qat_keras": top1(qat_logits),
                 "qat_int8": top1(qat_int8_logits)},
        "qat_after_calibration_top1": calibrated_top1,  # the fake-quant model's, as `edgevit qat` reports it
        "qat_vs_int8": vs_file(qat_logits, qat_int8_logits),
        "qat_vs_int8_on": on_kernels,
        "qat_int8_float_ops": len(describe(content).float_ops()),
        "minutes": round((time.perf_counter() - started) / 60, 1),
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))
    return result


def vs_file(qat_logits, file_logits) -> dict:
    """How the QAT model's logits predict its int8 file's."""
    from edgevit.litert.agreement import agreement

    agree = agreement(qat_logits, file_logits)
    return {"images_disagreeing": int((qat_logits.argmax(1) != file_logits.argmax(1)).sum()),
            "logits_identical": float(np.mean(qat_logits == file_logits)),
            **{key: agree[key] for key in ("top1_agreement", "cosine_mean", "cosine_min", "max_abs_logit_error")}}


def file_on_emulated_kernels(path: Path, x) -> dict:
    """The file's logits on an AVX2 CPU's x86 kernels and a Cortex-A76's
    Arm64 kernels, each where its emulator is installed."""
    from edgevit.litert.arm import PROFILES, emulator_missing, find_emulator, run_guest
    from edgevit.litert.run_model import run_in_child
    from edgevit.litert.x86_levels import x86_emulator_missing

    logits = {}
    if x86_emulator_missing() is None:
        logits["x86_avx2"] = run_in_child(path, x, x86_level="avx2")
    if emulator_missing() is None:
        logits["arm64_a76"] = run_guest(find_emulator(), path, x, PROFILES["a76"]).outputs["xnnpack"]
    return logits


def table_row(r: dict) -> str:
    t, a = r["top1"], r["qat_vs_int8"]
    return (f"| `{r['model']}` | {r['input_size']} | {r['epochs']} + {r['qat_epochs']} | {t['float']:.1%} | "
            f"{t['ptq_int8']:.1%} | {t['qat_int8']:.1%} | {a['images_disagreeing']} of {r['val_images']} | "
            f"{a['cosine_mean']:.4f} | {r['minutes']} |")


TABLE_HEADER = ("| model | input | epochs (float + QAT) | float top-1 | post-training `--int8` top-1 | "
                "QAT int8 top-1 | QAT Keras vs int8: top-1 differs | mean logit cosine | minutes |\n"
                "|---|---|---|---|---|---|---|---|---|")


def main(argv=None) -> int:
    from edgevit.train.run import QAT_LR

    root = Path(__file__).resolve().parents[1]
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(root.parent / "shared" / "data" / "hymenoptera"))
    p.add_argument("--families", action="store_true", help="The smallest variant of every family, one row each.")
    p.add_argument("--model", default="mobilevit_v3_xxs")
    p.add_argument("--size", type=int, default=None, help="Input size (default: 160; 64 with --families).")
    p.add_argument("--epochs", type=int, default=None, help="Float epochs (default: 30; 6 with --families).")
    p.add_argument("--qat-epochs", type=int, default=None, help="QAT epochs (default: 10; 2 with --families).")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3, help="Float training peak learning rate.")
    p.add_argument("--qat-lr", type=float, default=QAT_LR, help="QAT peak learning rate (edgevit qat's default).")
    p.add_argument("--out", default="/tmp/edgevit-qat-hymenoptera")
    args = p.parse_args(argv)

    out = Path(args.out)
    if args.families:
        size, epochs, qat_epochs = args.size or 64, args.epochs or 6, args.qat_epochs or 2
        rows = []
        print(TABLE_HEADER, flush=True)
        for name in FAMILIES:
            result = run(name, smallest_size(name, size), epochs, qat_epochs, args.data, out / name,
                         batch_size=args.batch_size, lr=args.lr, qat_lr=args.qat_lr)
            rows.append(result)
            print(table_row(result), flush=True)
        (out / "families.json").write_text(json.dumps(rows, indent=2))
        print(f"\n{TABLE_HEADER}\n" + "\n".join(table_row(r) for r in rows))
        return 0
    result = run(args.model, args.size or 160, args.epochs or 30, args.qat_epochs or 10, args.data, out / args.model,
                 batch_size=args.batch_size, lr=args.lr, qat_lr=args.qat_lr)
    print(f"\n{TABLE_HEADER}\n{table_row(result)}")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
