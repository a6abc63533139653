"""int8 and fp32 latency of the smallest variant of every ViT-style family
on this CPU (LiteRT, XNNPACK), at each family's default input size, in one
table (the table in docs/families.md comes from this script).

Each model is exported through the normal pipeline (validation report
included; its logit cosine vs Keras is a column), then all files are timed
in one interleaved run (see mobilevit_latency.py) so machine-load drift hits
every file alike. Where scripts/install-arm-emulator.sh has run, every file
is also counted on LiteRT's Arm64 kernels under emulation (exact
instructions per inference, `--arm a76` by default; `--arm none` skips).

    python benchmarks/families_latency.py
    python benchmarks/families_latency.py --models vit_tiny16 pit_ti --rounds 3 --json out.json
    python benchmarks/families_latency.py --diagnose   # + first int8 layer below 0.98 cosine
    python benchmarks/families_latency.py --models swin_tiny --arm a76,max
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mobilevit_latency import count_on_arm, summarise, time_interleaved  # noqa: E402

SMALLEST = ["vit_tiny16", "deit_tiny", "deepvit_s", "convit_tiny", "crossvit_tiny", "pit_ti", "cvt_13",
            "mixer_s16", "resmlp_12", "pvt_v2_b0", "swin_tiny", "swinv2_tiny", "cswin_tiny", "t2t_vit_7"]


def convert_all(models, precisions, calib_samples, out_dir: Path, diagnose: bool) -> list[dict]:
    import edgevit
    from edgevit.export.pipeline import ExportOptions, export
    from edgevit.registry import get_spec

    files = []
    for name in models:
        spec = get_spec(name)
        model = edgevit.create_model(name)
        paths = {}
        for precision in precisions:
            out = out_dir / f"{name}_{precision}.tflite"
            report = export(model, spec, ExportOptions(
                precision=precision, output=str(out), calib_samples=calib_samples, validation_samples=8,
                recalibrate_batchnorm=True, io_dtype="float32")).to_dict()
            paths[precision] = out
            files.append({"model": name, "precision": precision, "path": out,
                          "input_size": spec.default_input_size,
                          "convert_seconds": round(report["seconds"]["convert"], 1),
                          "size_bytes": report["size_bytes"], "macs_M": round(report["macs"] / 1e6),
                          "cosine_mean": round(report["agreement"]["cosine_mean"], 4),
                          "top1_agreement": report["agreement"]["top1_agreement"]})
            print(f"converted {name} {precision}: {report['seconds']['convert']:.1f} s, "
                  f"cosine {report['agreement']['cosine_mean']:.4f}", file=sys.stderr)
        if diagnose and {"fp32", "int8"} <= set(paths):
            from edgevit.data import sample_photos
            from edgevit.export.diagnose import layerwise_comparison

            images = sample_photos.sample_batch(spec.preprocessing, 2, held_out=True)
            first = layerwise_comparison(paths["fp32"].read_bytes(), paths["int8"].read_bytes(), images,
                                         threshold=0.98)["first_below"]
            files[-1]["first_int8_layer_below_0.98"] = first["layer"] if first else "none"
    return files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=SMALLEST)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "int8"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs-per-round", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--calib-samples", type=int, default=32)
    parser.add_argument("--diagnose", action="store_true")
    parser.add_argument("--arm", default="a76",
                        help="Arm64 CPU profiles to count instructions on (LiteRT 1.4 aarch64, emulated), or none.")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="edgevit-bench-") as tmp:
        files = convert_all(args.models, args.precisions, args.calib_samples, Path(tmp), args.diagnose)
        time_interleaved(files, args.threads, args.rounds, args.runs_per_round, args.warmup)
        arm_profiles = count_on_arm(files, args.arm)
    rows = summarise(files, args.threads, arm_profiles)

    columns = ["model", "precision", "input_size", "macs_M", "size_bytes", "cosine_mean", "top1_agreement"]
    columns += [c for t in args.threads for c in (f"median_ms_{t}t", f"vs_fp32_{t}t")]
    columns += [c for p in arm_profiles for c in (f"arm_{p}_M", f"arm_{p}_vs_fp32")]
    if args.diagnose:
        columns.append("first_int8_layer_below_0.98")
    print_table(rows, columns, args.json_path)
    return 0


def print_table(rows: list[dict], columns: list[str], json_path: str | None) -> None:
    """``rows`` as a Markdown table of ``columns``, and as JSON to ``json_path`` if given."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
