"""Float vs post-training int8 vs QAT int8 on hymenoptera (ants/bees).

Usage: python benchmarks/qat_hymenoptera.py [--data ../shared/data/hymenoptera]
       [--model mobilevit_v3_xxs] [--size 160] [--epochs 30] [--qat-epochs 10] [--out DIR]

Runs the same steps as the CLI (`edgevit finetune`, `edgevit convert --int8`,
`edgevit qat`, `edgevit eval`) in one process and prints one Markdown table:
top-1 on the val split of the float model, the post-training int8 file
(calibrated on train images) and the QAT int8 file (trained ranges), plus
the QAT Keras-vs-int8 agreement on the val images (LiteRT XNNPACK).
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


def main(argv=None) -> int:
    root = Path(__file__).resolve().parents[1]
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(root.parent / "shared" / "data" / "hymenoptera"))
    p.add_argument("--model", default="mobilevit_v3_xxs")
    p.add_argument("--size", type=int, default=160)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--qat-epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--qat-lr", type=float, default=2e-4)
    p.add_argument("--multiscale", default="")
    p.add_argument("--out", default="/tmp/edgevit-qat-hymenoptera")
    args = p.parse_args(argv)

    import keras

    from edgevit.train.metrics import accuracy_report
    from edgevit.export.agreement import agreement
    from edgevit.export.convert import convert
    from edgevit.export.graph import describe
    from edgevit.export.run_model import run_in_child
    from edgevit.models.batchnorm import recalibrate_batchnorm
    from edgevit.quantize.qat import calibrate, quantize_model
    from edgevit.registry import create_model, get_spec
    from edgevit.train.data import find_dataset, load_split
    from edgevit.train.loop import TrainConfig, Trainer

    keras.utils.set_random_seed(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    spec = get_spec(args.model)
    pre = spec.preprocessing_at(args.size)
    ds = find_dataset(args.data)
    sizes = [int(s) for s in args.multiscale.split(",") if s]
    train, _ = load_split(ds.train, pre, max([args.size, *sizes]))
    val, _ = load_split(ds.val, pre, args.size)
    classes = len(ds.classes)
    x_val = val.eval_batch(np.arange(len(val)), args.size)
    x_cal = train.eval_batch(np.random.default_rng(0).permutation(len(train))[:64], args.size)
    print(f"{len(train)} train / {len(val)} val images, {classes} classes", flush=True)

    def top1(logits):
        return accuracy_report(np.asarray(logits), val.labels, ds.classes)["top1"]

    def val_metric(model):
        return {"val_top1": top1(model.predict(x_val, batch_size=32, verbose=0))}

    model = create_model(args.model, num_classes=classes, input_size=args.size)
    recalibrate_batchnorm(model, x_cal)
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, sizes=sizes,
                      warmup_epochs=min(2.0, args.epochs / 10), checkpoint_dir=str(out / "float.ckpt"))
    Trainer(model, lambda s: create_model(args.model, num_classes=classes, input_size=s), args.size, cfg).fit(
        train, val_metric)
    model.save(out / "float.keras")
    float_logits = model.predict(x_val, batch_size=32, verbose=0)
    t_float = time.perf_counter()

    ptq = convert(model, "int8", x_cal, "int8")
    (out / "ptq_int8.tflite").write_bytes(ptq)
    ptq_logits = run_in_child(out / "ptq_int8.tflite", x_val, num_threads=2)

    qat = quantize_model(model, input_range=pre.value_range)
    calibrate(qat, x_cal)
    calibrated_top1 = top1(qat.predict(x_val, batch_size=32, verbose=0))
    qcfg = TrainConfig(epochs=args.qat_epochs, batch_size=args.batch_size, lr=args.qat_lr,
                       checkpoint_dir=str(out / "qat.ckpt"))
    Trainer(qat, None, args.size, qcfg).fit(train, val_metric)
    qat.save(out / "qat.keras")
    qat_logits = qat.predict(x_val, batch_size=32, verbose=0)
    content = convert(qat, "int8", None, "int8")
    floats = describe(content).float_ops()
    (out / "qat_int8.tflite").write_bytes(content)
    qat_int8_logits = run_in_child(out / "qat_int8.tflite", x_val, num_threads=2)
    agree = agreement(qat_logits, qat_int8_logits)

    rows = {
        "float (Keras)": top1(float_logits),
        "post-training int8 (64 train images)": top1(ptq_logits),
        "QAT Keras (fake-quant)": top1(qat_logits),
        "QAT int8 (trained ranges)": top1(qat_int8_logits),
    }
    result = {"model": args.model, "input_size": args.size, "epochs": args.epochs, "qat_epochs": args.qat_epochs,
              "multiscale": sizes, "val_images": len(val), "top1": rows,
              "qat_after_calibration_top1": calibrated_top1,
              "qat_vs_int8_agreement": agree, "qat_int8_float_ops": len(floats),
              "minutes": {"float_training": round((t_float - t0) / 60, 1),
                          "total": round((time.perf_counter() - t0) / 60, 1)}}
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(f"\n| {args.model} @ {args.size}px, hymenoptera val ({len(val)} images) | top-1 |\n|---|---|")
    for k, v in rows.items():
        print(f"| {k} | {v:.1%} |")
    print(f"\nQAT Keras vs QAT int8 (XNNPACK): top-1 agreement {agree['top1_agreement']:.1%}, "
          f"logit cosine mean {agree['cosine_mean']:.5f}")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
