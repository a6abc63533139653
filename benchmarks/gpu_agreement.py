"""Every MobileViT variant in fp32, fp16, int8-mixed and int8 at its default
input size, exported through the normal pipeline (random weights, BatchNorm
statistics re-estimated on the sample photos) and run on LiteRT's GPU
accelerator against XNNPACK on held-out sample photos: whether the GPU runs
every op, which ops it left on the CPU, and the output cosine (the table in
docs/profiling.md comes from this script; the slow tests assert the same).

Needs a Vulkan device (scripts/install-test-tools.sh installs the software
one).

    python benchmarks/gpu_agreement.py
    python benchmarks/gpu_agreement.py --models mobilevit_v3_xxs --precisions fp32 int8 --json out.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PRECISIONS = ["fp32", "fp16", "int8_mixed", "int8"]


def mobilevit_variants() -> list[str]:
    import edgevit

    return sorted(edgevit.list_models("mobilevit_*"))


def run_all(models, precisions, calib_samples: int, images: int, out_dir: Path) -> list[dict]:
    import edgevit
    from edgevit.export.pipeline import ExportOptions, export
    from edgevit.registry import get_spec

    rows = []
    for name in models:
        spec = get_spec(name)
        model = edgevit.create_model(name)
        for precision in precisions:
            report = export(model, spec, ExportOptions(
                precision=precision, output=str(out_dir / f"{name}_{precision}.tflite"), calib_samples=calib_samples,
                validation_samples=images, gpu_images=images, recalibrate_batchnorm=True)).to_dict()
            run = report["gpu_accelerator"]
            row = {"model": name, "precision": precision, "input_size": spec.default_input_size, "ran": run["ran"]}
            if run["ran"]:
                a = run["agreement"]
                row.update(fully_accelerated=run["fully_accelerated"], cosine_mean=round(a["cosine_mean"], 5),
                           cosine_min=round(a["cosine_min"], 5), top1_agreement=a["top1_agreement"],
                           floor=round(run["floor"], 4), agrees=run["agrees"],
                           xnnpack_vs_reference=None if run["cpu_kernels_cosine"] is None
                           else round(run["cpu_kernels_cosine"], 5),
                           cpu_ops=", ".join(f"{g['op']}: {g['reason']}" for g in run["cpu_ops"]) or "none",
                           errors=run["errors"])
            else:
                row["reason"] = run["reason"]
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=None, help="Default: every MobileViT variant.")
    parser.add_argument("--precisions", nargs="+", default=PRECISIONS)
    parser.add_argument("--calib-samples", type=int, default=16)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)

    from edgevit.litert.accelerator import HOW_TO_GET_A_DEVICE, missing_vulkan

    missing = missing_vulkan()
    if missing:
        print(f"no Vulkan device ({missing}); {HOW_TO_GET_A_DEVICE}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="edgevit-gpu-") as tmp:
        rows = run_all(args.models or mobilevit_variants(), args.precisions, args.calib_samples, args.images,
                       Path(tmp))
    print("| model | precision | fully on the GPU | cosine mean (min) vs XNNPACK | XNNPACK vs reference kernels "
          "| top-1 agreement | ops left on the CPU |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if not r["ran"]:
            print(f"| `{r['model']}` | {r['precision']} | not run: {r['reason']} | | | | |")
            continue
        reference = "" if r["xnnpack_vs_reference"] is None else str(r["xnnpack_vs_reference"])
        print(f"| `{r['model']}` | {r['precision']} | {'yes' if r['fully_accelerated'] else 'NO'} | "
              f"{r['cosine_mean']} ({r['cosine_min']}) | {reference} | {r['top1_agreement'] * 100:.0f}% | "
              f"{r['cpu_ops']} |")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
