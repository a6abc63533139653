"""The training input of `edgevit finetune` and `qat` against the tf.data
pipeline Keras users write, side by side on the same JPEG folder, and each
one's rate on 1, 2, ... cores.

    python benchmarks/training_input.py --json benchmarks/results/training-input.json
    python benchmarks/training_input.py --cores 1,2,16 --images 3000

The folder: ``--images`` symbolic links, in 10 class folders, to the real
photos of ../shared/data (ImageNet sample and hymenoptera: 696 JPEGs, most
about 500x375), or to the JPEGs of ``--folder``. Both pipelines make batches
of 32 uint8 [size, size, 3] training crops (a random crop resized to
``--size`` and a random mirror), in parallel, prefetched, and are counted
inside TensorFlow (a reduce over every batch: no Python loop takes them):

- edgevit: :meth:`edgevit.data.stream.ImageStream.training_dataset` over an
  epoch plan of the folder (Pillow decodes and resizes, a batch per call);
- plain: ``list_files`` -> ``read_file`` -> ``decode_jpeg`` ->
  ``stateless_sample_distorted_bounding_box`` (area 0.35-1) -> crop ->
  ``resize`` (bilinear) -> ``stateless_random_flip_left_right`` -> uint8,
  ``num_parallel_calls=AUTOTUNE``, batch 32, prefetch.

Each core count runs in a process of its own whose CPU affinity is those
cores (TensorFlow and tf.data size their thread pools by it); within it the
two pipelines alternate for ``--rounds`` rounds, so a busy moment of the
host weighs on both, and the ratio is the median of the rounds' ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
BATCH = 32
CLASSES = 10


def make_folder(root: Path, sources: list[Path], images: int) -> Path:
    """``images`` links to ``sources`` (in turn) in CLASSES class folders of ``root/train``."""
    for index in range(images):
        folder = root / "train" / f"class{index % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        os.symlink(sources[index % len(sources)], folder / f"{index:07d}.jpg")
    return root


def edgevit_rate(root: Path, size: int):
    """(images/s of one pass, images in it) of edgevit's training stream."""
    import tensorflow as tf

    from edgevit.data.folders import find_dataset
    from edgevit.data.stream import ImageStream, plan_epoch
    from edgevit.registry import get_spec

    stream = ImageStream(find_dataset(root, val_split=0.01).train, get_spec("mobilevit_v3_xs").preprocessing_at(size))
    plan = plan_epoch(len(stream), BATCH, 1, size, [], np.random.default_rng(0), steps=len(stream) // BATCH)

    def run(epoch: int) -> tuple[float, int]:
        batches = stream.training_dataset(plan, epoch)
        start = time.perf_counter()
        seen = int(batches.reduce(np.int64(0), lambda count, batch: count + tf.reduce_sum(tf.cast(batch[2], tf.int64))))
        return seen / (time.perf_counter() - start), seen

    return run


def plain_rate(root: Path, size: int):
    """(images/s of one pass, images in it) of the tf.data pipeline a Keras user writes."""
    import tensorflow as tf

    files = tf.data.Dataset.list_files(str(root / "train" / "*" / "*.jpg"), shuffle=False)
    count = int(files.cardinality()) // BATCH * BATCH

    def crop(path, seed):
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        begin, extent, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.shape(image), tf.zeros([1, 0, 4]), seed, area_range=(0.35, 1.0), aspect_ratio_range=(0.75, 1.33),
            min_object_covered=0.0, use_image_if_no_bounding_boxes=True)
        image = tf.image.resize(tf.slice(image, begin, extent), (size, size))
        image = tf.image.stateless_random_flip_left_right(image, seed)
        return tf.cast(tf.clip_by_value(image, 0, 255), tf.uint8)

    def run(epoch: int) -> tuple[float, int]:
        seeds = tf.data.Dataset.random(seed=epoch).batch(2)
        ds = (tf.data.Dataset.zip(files.shuffle(count, seed=epoch).take(count), seeds)
              .map(crop, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH).prefetch(tf.data.AUTOTUNE))
        start = time.perf_counter()
        seen = int(ds.reduce(np.int64(0), lambda total, batch: total + tf.shape(batch, tf.int64)[0]))
        return seen / (time.perf_counter() - start), seen

    return run


def measure(root: Path, size: int, rounds: int) -> dict:
    """Both pipelines, alternating, ``rounds`` times (after one warm-up pass each, not counted)."""
    from edgevit.native_output import import_tensorflow_quietly

    import_tensorflow_quietly()
    edgevit, plain = edgevit_rate(root, size), plain_rate(root, size)
    edgevit(99)
    plain(99)
    rates = {"edgevit": [], "plain": []}
    for epoch in range(rounds):
        for name, run in (("edgevit", edgevit), ("plain", plain)):
            rate, seen = run(epoch)
            rates[name].append(round(rate, 1))
    ratios = [e / p for e, p in zip(rates["edgevit"], rates["plain"])]
    return {"cores": len(os.sched_getaffinity(0)), "images_per_pass": seen,
            "edgevit_images_per_s": rates["edgevit"], "plain_images_per_s": rates["plain"],
            "ratios": [round(r, 2) for r in ratios], "ratio": round(float(np.median(ratios)), 2),
            "load_average_1min": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cores", default=None, help="comma-separated core counts (default: 1 and every core)")
    parser.add_argument("--folder", default=None, help="JPEGs to link to (default: ../shared/data's photos)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # a child's folder
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(Path(args.measure), args.size, args.rounds)))
        return
    available = sorted(os.sched_getaffinity(0))
    counts = [int(c) for c in args.cores.split(",")] if args.cores else sorted({1, len(available)})
    source = Path(args.folder) if args.folder else SHARED
    sources = sorted(p for p in source.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    if not sources:
        sys.exit(f"No JPEGs below {source}: pass --folder DIR.")
    result = {"commit": os.popen("git rev-parse --short HEAD").read().strip(), "date": time.strftime("%Y-%m-%d"),
              "images": args.images, "size": args.size, "batch": BATCH, "source_jpegs": len(sources), "runs": []}
    with tempfile.TemporaryDirectory(prefix="edgevit-training-input-") as tmp:
        root = make_folder(Path(tmp), sources, args.images)
        for count in counts:
            if count > len(available):
                print(f"skipping {count} cores: this machine lets the process use {len(available)}", file=sys.stderr)
                continue
            cores = ",".join(map(str, available[:count]))
            proc = subprocess.run(["taskset", "-c", cores, sys.executable, __file__, "--measure", str(root),
                                   "--size", str(args.size), "--rounds", str(args.rounds)],
                                  capture_output=True, text=True, check=True)
            run = json.loads(proc.stdout.strip().splitlines()[-1])
            result["runs"].append(run)
            print(f"{run['cores']:>2} core(s): edgevit {run['edgevit_images_per_s']} images/s, plain tf.data "
                  f"{run['plain_images_per_s']}: {run['ratio']}x", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
