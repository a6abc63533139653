"""What writing attention without BATCH_MATMUL's adjoint flag costs on
XNNPACK: ``q @ k^T`` with the keys transposed inside the matmul (the
converter then sets ``adj_y``, which the classic GPU delegate ignores; the
formulation edgevit used before) against keys split into heads already
transposed (``[B, heads, head_dim, N]``, what MultiHeadSelfAttention does
now), fp32 and int8-mixed, all files timed in one interleaved run (see
mobilevit_latency.py).

    python benchmarks/attention_layout_latency.py
    python benchmarks/attention_layout_latency.py --models vit_tiny16 --rounds 5
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mobilevit_latency import time_interleaved  # noqa: E402

DEFAULT_MODELS = ["mobilevit_v3_xs", "mobilevit_v1_xs", "vit_tiny16"]
LAYOUTS = ("adjoint", "transposed_keys")


def adjoint_call(self, x, training=None):
    """MultiHeadSelfAttention.call as it was: one transpose of the stacked
    q|k|v heads, keys transposed by the matmul itself."""
    import tensorflow as tf
    from keras import ops

    from edgevit.layers.attention import softmax

    tokens = x.shape[1]
    qkv = ops.reshape(self.qkv(x), (-1, tokens, 3 * self.num_heads, self.head_dim))
    q, k, v = ops.split(ops.transpose(qkv, (0, 2, 1, 3)), 3, axis=1)
    attn = self.dropout(softmax(tf.linalg.matmul(q * self.scale, k, transpose_b=True)), training=training)
    out = ops.transpose(tf.linalg.matmul(attn, v), (0, 2, 1, 3))
    return self.proj(ops.reshape(out, (-1, tokens, self.dim)))


@contextlib.contextmanager
def attention_layout(layout: str):
    from edgevit.layers.attention import MultiHeadSelfAttention

    current = MultiHeadSelfAttention.call
    if layout == "adjoint":
        MultiHeadSelfAttention.call = adjoint_call
    try:
        yield
    finally:
        MultiHeadSelfAttention.call = current


def convert_all(models, precisions, calib_samples, out_dir: Path) -> list[dict]:
    import edgevit
    from edgevit.data import sample_photos
    from edgevit.export.convert import convert
    from edgevit.litert.flatbuffer import read
    from edgevit.models.batchnorm import recalibrate_batchnorm
    from edgevit.registry import get_spec

    files = []
    for name in models:
        spec = get_spec(name)
        model = edgevit.create_model(name)
        calibration = sample_photos.sample_batch(spec.preprocessing, calib_samples)
        recalibrate_batchnorm(model, calibration)
        for precision in precisions:
            for layout in LAYOUTS:
                with attention_layout(layout):
                    content = convert(model, precision, calibration if precision != "fp32" else None,
                                      io_dtype="float32")
                path = out_dir / f"{name}_{precision}_{layout}.tflite"
                path.write_bytes(content)
                adjoint = sum(bool(op.options.get("adjX") or op.options.get("adjY"))
                              for op in read(content).ops if op.name == "BATCH_MATMUL")
                files.append({"model": name, "precision": precision, "layout": layout, "path": path,
                              "adjoint_batch_matmuls": adjoint})
                print(f"converted {name} {precision} {layout}", file=sys.stderr)
    return files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "int8_mixed"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs-per-round", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--calib-samples", type=int, default=16)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="edgevit-bench-") as tmp:
        files = convert_all(args.models, args.precisions, args.calib_samples, Path(tmp))
        time_interleaved(files, [1], args.rounds, args.runs_per_round, args.warmup)

    from edgevit.profile.host import host_description

    print(host_description())
    print("| model | precision | adjoint BATCH_MATMULs: adjoint / transposed keys | adjoint ms | "
          "transposed keys ms | ratio |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        for precision in args.precisions:
            pair = {f["layout"]: f for f in files if f["model"] == name and f["precision"] == precision}
            before, after = (statistics.median(pair[k]["ms"][1]) for k in LAYOUTS)
            print(f"| `{name}` | {precision} | {pair['adjoint']['adjoint_batch_matmuls']} / "
                  f"{pair['transposed_keys']['adjoint_batch_matmuls']} | {before:.2f} | {after:.2f} | "
                  f"{after / before:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
