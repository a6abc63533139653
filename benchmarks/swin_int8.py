"""How far Swin's quantized files are from the Keras model, with weights of
a realistic scale, at the default input size: the numbers behind the int8
section of docs/families.md.

Random-init Swin attends almost uniformly (scores within +-0.2), which
hides what quantization does to peaked attention and to the shift mask.
Here the weights are timm's model with every parameter randomised at a
trained model's scale (``edgevit.converters.parity.randomize_``: fan-in
scaled matrices, norm scales 0.6-1.4, position-bias tables of std ~0.5,
logits scaled to std 3), imported through the timm importer. Each
precision is exported through the normal pipeline (calibration, validation
on held-out images); the int8 files are also compared tensor by tensor with
the fp32 file (the worst softmax output and block output, and the first
tensor below 0.98).
``--without-mask-grid`` adds the int8 file as the converter's calibration
leaves it (masked scores on a grid down to -100).

Needs torch and timm (the test tools).

    python benchmarks/swin_int8.py
    python benchmarks/swin_int8.py --models swin_tiny --precisions int8 --calib ../shared/data/imagenet-sample
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from families_latency import print_table  # noqa: E402


def realistic_model(name: str, photos, workdir: Path):
    """``name`` with timm's randomised weights (logits of std 3 on ``photos``)."""
    import torch

    from edgevit.converters import import_weights
    from edgevit.converters.parity import import_timm, randomize_, scale_logits_
    from edgevit.converters.timm import TIMM_NAMES

    timm = import_timm()
    reference = timm.create_model(TIMM_NAMES[name], pretrained=False)
    randomize_(reference, 0)
    scale_logits_(reference, reference.get_classifier(), photos)
    torch.save(reference.state_dict(), workdir / f"{name}.pth")
    return import_weights(workdir / f"{name}.pth", name).model


def worst(layers: list[dict], pattern: str) -> float | None:
    """The lowest cosine of the tensors whose name contains ``pattern``."""
    found = [row["cosine"] for row in layers if pattern in row["tensor"].split(";")[0]]
    return round(min(found), 4) if found else None


def masked_scores(content: bytes) -> set[str]:
    """Names of the masked scores (the mask ADD's output and its reshape
    into the SOFTMAX): -100 in float, saturated well above it in int8 by
    design, so their cosine says nothing about the softmax output."""
    from edgevit.litert.flatbuffer import read

    graph = read(content)
    names = set()
    for op in graph.ops:
        if op.name == "SOFTMAX" and op.inputs[0].index in graph.producers:
            reshape = graph.ops[graph.producers[op.inputs[0].index]]
            add = graph.ops[graph.producers[reshape.inputs[0].index]] if reshape.inputs[0].index in graph.producers \
                else None
            if add is not None and add.name == "ADD" and \
                    graph.ops[graph.producers[add.runtime_inputs[0].index]].name == "MUL":
                names |= {op.inputs[0].name, add.outputs[0].name}
    return names


def first_below(layers: list[dict], skip: set[str], threshold: float = 0.98) -> str:
    """The first tensor below ``threshold``, leaving out the masked scores
    and each LayerNorm's token mean (``norm*/Mean``: ~0 for centred tokens,
    where any rounding turns the cosine into noise without touching the
    normalised output)."""
    for row in layers:
        name = row["tensor"].split(";")[0]
        if row["cosine"] < threshold and not name.endswith("/Mean") and row["tensor"] not in skip:
            return f"{name} ({row['cosine']:.3f})"
    return "none"


def measure(name: str, precisions: list[str], calib: str | None, calib_samples: int, images: int,
            without_mask_grid: bool, workdir: Path) -> list[dict]:
    from edgevit.data import sample_photos
    from edgevit.export.convert import convert
    from edgevit.export.diagnose import layerwise_comparison
    from edgevit.export.pipeline import ExportOptions, export
    from edgevit.litert import requantize
    from edgevit.registry import get_spec

    spec = get_spec(name)
    model = realistic_model(name, sample_photos.sample_batch(spec.preprocessing, 4), workdir)
    fp32 = convert(model, "fp32")
    probes = sample_photos.sample_batch(spec.preprocessing, 2, held_out=True)
    runs = [(p, False) for p in precisions] + ([("int8", True)] if without_mask_grid else [])
    rows = []
    for precision, raw in runs:
        saved = requantize.masked_softmax_grids
        if raw:
            requantize.masked_softmax_grids = lambda content: content
        try:
            start = time.perf_counter()
            out = workdir / f"{name}_{precision}{'_raw' if raw else ''}.tflite"
            report = export(model, spec, ExportOptions(
                precision=precision, output=str(out), calib_dir=calib, calib_samples=calib_samples,
                validation_samples=images, weights_label="timm-randomised", io_dtype="float32",
                gpu_images=0)).to_dict()
        finally:
            requantize.masked_softmax_grids = saved
        row = {"model": name, "precision": precision + (" (no mask grid)" if raw else ""),
               "cosine_mean": round(report["agreement"]["cosine_mean"], 4),
               "cosine_min": round(report["agreement"]["cosine_min"], 4),
               "top1_agreement": report["agreement"]["top1_agreement"],
               "top5_overlap": report["agreement"]["top5_overlap"],
               "size_MB": round(report["size_bytes"] / 1e6, 2), "seconds": round(time.perf_counter() - start)}
        if precision != "fp32":
            layers = layerwise_comparison(fp32, out.read_bytes(), probes)["layers"]
            row["worst_softmax_cosine"] = worst(layers, "Softmax")
            row["worst_block_output_cosine"] = worst(layers, ".add2")
            row["first_tensor_below_0.98"] = first_below(layers, masked_scores(out.read_bytes()))
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["swin_tiny", "swinv2_tiny"])
    parser.add_argument("--precisions", nargs="+", default=["int8", "int8_mixed", "int16x8"])
    parser.add_argument("--calib", default=None, help="image folder (default: the sample photos)")
    parser.add_argument("--calib-samples", type=int, default=32)
    parser.add_argument("--images", type=int, default=16, help="held-out validation images")
    parser.add_argument("--without-mask-grid", action="store_true")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="edgevit-swin-") as tmp:
        rows = [row for name in args.models
                for row in measure(name, args.precisions, args.calib, args.calib_samples, args.images,
                                   args.without_mask_grid, Path(tmp))]
    print_table(rows, list(dict.fromkeys(k for row in rows for k in row)), args.json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
