"""How `edgevit finetune`, `qat` and `eval` scale with the number of images:
peak resident memory and time to the first training step on a small and a
large folder, and the input pipeline's images/s against the single-thread
rate of the same transform.

    python benchmarks/data_scale.py --json benchmarks/results/data-scale.json
    python benchmarks/data_scale.py --small 2000 --large 100000 --eval-small 2000 --eval-large 20000

The folders live in a temporary folder and are removed afterwards: 2,000
synthetic 320x240 JPEGs of 10 classes, and folders of symbolic links to them
(DIR/train/<class>/*: 2,000 and 100,000 links; DIR/val/<class>/*: 200, the
same for both, so that validation costs the same; an evaluation folder
DIR/<class>/* of 2,000 and 20,000). Each command runs as a user runs it, one
after the other, its process tree's resident memory sampled by
benchmarks/memory.py's sampler:

1. `edgevit finetune mobilevit_v3_xxs --input-size 64 --epochs 1
   --steps-per-epoch S` on each training folder (random weights);
2. `edgevit qat` of the first one's model, the same steps, on each;
3. `edgevit eval` of a 10-class mobilevit_v3_xxs at 256 px on each
   evaluation folder.

The input pipeline alone: 256 px training crops of the large folder, through
tf.data (parallel, prefetched) and through the same per-image function in a
loop on one thread.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from memory import measure

CLASSES = 10
UNIQUE = 2000


def synthetic_jpegs(folder: Path, count: int) -> list[Path]:
    """``count`` 320x240 JPEGs: smooth colour fields with noise, as photos compress."""
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    yy, xx = np.mgrid[0:240, 0:320]
    paths = []
    for index in range(count):
        base = rng.integers(0, 256, 3)
        field = (base + 60 * np.sin(xx[..., None] / rng.uniform(5, 40) + yy[..., None] / rng.uniform(5, 40)
                                     + rng.uniform(0, 6, 3))).astype(np.float32)
        field += rng.normal(0, 12, field.shape)
        paths.append(folder / f"{index}.jpg")
        Image.fromarray(np.clip(field, 0, 255).astype(np.uint8)).save(paths[-1], quality=90)
    return paths


def linked_folder(root: Path, sources: list[Path], count: int) -> Path:
    """``root/<class>/*``: ``count`` symbolic links, round the sources."""
    for index in range(count):
        folder = root / f"class{index % CLASSES}"
        if index < CLASSES:
            folder.mkdir(parents=True)
        os.symlink(sources[index % len(sources)], folder / f"{index}.jpg")
    return root


def edgevit(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgevit", *args]


def command(what: str, cmd: list[str]) -> dict:
    run = measure(what, cmd)
    result = json.loads(run.pop("stdout"))
    row = {"peak_gb": run["peak_gb"], "seconds": run["seconds"]}
    for key in ("seconds_to_first_step", "unreadable_skipped", "images", "found"):
        if key in result:
            row[key] = result[key]
    print(what, row, flush=True)
    return row


def pipeline_rates(train_root: Path, size: int, images: int, rounds: int = 3) -> dict:
    """Images/s of the training transform: the tf.data pipeline alone (its
    batches counted inside TensorFlow, no Python loop taking them), and the
    same per-image work on one thread; ``rounds`` of each, one after the
    other, so that a busy moment of the host weighs on both; the median."""
    import tensorflow as tf

    from edgevit.data.folders import find_dataset
    from edgevit.data.stream import ImageStream, plan_epoch
    from edgevit.data.transforms import transform
    from edgevit.registry import get_spec

    pre = get_spec("mobilevit_v3_xxs").preprocessing_at(size)
    stream = ImageStream(find_dataset(train_root).train, pre)
    draws = np.random.default_rng(0).random((images, 4))
    place = transform(pre, size, is_training=True)
    plan = plan_epoch(len(stream), 32, 1, size, [], np.random.default_rng(0), steps=images // 32)
    singles, pipelines = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for index, draw in enumerate(draws):  # what the pipeline does per image (the training step normalises)
            place(stream.files[index * 7919 % len(stream)], 0, draw)
        singles.append(images / (time.perf_counter() - start))
        batches = stream.training_dataset(plan, 0)
        start = time.perf_counter()
        seen = int(batches.reduce(np.int64(0), lambda count, batch: count + tf.shape(batch[1], tf.int64)[0]))
        pipelines.append(seen / (time.perf_counter() - start))
    ratios = [p / s for p, s in zip(pipelines, singles)]
    return {"input_size": size, "single_thread_images_per_s": [round(r, 1) for r in singles],
            "pipeline_images_per_s": [round(r, 1) for r in pipelines], "ratios": [round(r, 2) for r in ratios],
            "ratio": round(float(np.median(ratios)), 2), "cores": os.cpu_count(),
            "load_average_1min": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=2000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--eval-small", type=int, default=2000)
    parser.add_argument("--eval-large", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=20, help="steps of finetune and qat")
    parser.add_argument("--pipeline-images", type=int, default=640)
    parser.add_argument("--pipeline-only", action="store_true", help="measure the input pipeline alone")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = {"commit": os.popen("git rev-parse --short HEAD").read().strip(), "date": time.strftime("%Y-%m-%d"),
              "steps": args.steps}
    with tempfile.TemporaryDirectory(prefix="edgevit-data-scale-") as tmp:
        tmp = Path(tmp)
        sources = synthetic_jpegs(tmp / "sources", UNIQUE)
        roots = {}
        for count in (args.small, args.large):
            roots[count] = tmp / f"train{count}"
            linked_folder(roots[count] / "train", sources, count)
            linked_folder(roots[count] / "val", sources[::-1], 200)
        result["pipeline"] = pipeline_rates(roots[args.large], 256, args.pipeline_images)
        print("pipeline", result["pipeline"], flush=True)
        if args.pipeline_only:
            return _write(result, args.json)
        steps = ["--epochs", "1", "--steps-per-epoch", str(args.steps), "--batch-size", "32", "--json"]
        model = tmp / "m.keras"
        for count in (args.small, args.large):
            out = model if count == args.small else tmp / f"m{count}.keras"
            result[f"finetune_{count}"] = command(f"finetune {count}", edgevit(
                "finetune", "mobilevit_v3_xxs", "--input-size", "64", "--data", str(roots[count]), *steps,
                "-o", str(out)))
        for count in (args.small, args.large):
            result[f"qat_{count}"] = command(f"qat {count}", edgevit(
                "qat", str(model), "--data", str(roots[count]), *steps, "--calib-batches", "2",
                "-o", str(tmp / f"q{count}.keras")))
        import edgevit as ev
        from edgevit.saving import save_model, set_class_names

        float256 = ev.create_model("mobilevit_v3_xxs", num_classes=CLASSES)
        set_class_names(float256, [f"class{i}" for i in range(CLASSES)])
        save_model(float256, tmp / "m256.keras")
        for count in (args.eval_small, args.eval_large):
            folder = linked_folder(tmp / f"eval{count}", sources, count)
            result[f"eval_{count}"] = command(f"eval {count}", edgevit("eval", str(tmp / "m256.keras"), "--data",
                                                                      str(folder), "--json"))
    for kind, small, large in (("finetune", args.small, args.large), ("qat", args.small, args.large),
                               ("eval", args.eval_small, args.eval_large)):
        peaks = result[f"{kind}_{large}"]["peak_gb"], result[f"{kind}_{small}"]["peak_gb"]
        result[f"{kind}_peak_ratio"] = round(peaks[0] / peaks[1], 3)
    _write(result, args.json)


def _write(result: dict, path: str | None) -> None:
    print(json.dumps(result, indent=2))
    if path:
        Path(path).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
