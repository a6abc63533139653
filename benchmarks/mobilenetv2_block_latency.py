"""Where the fp32 time of a MobileNetV2 block goes on XNNPACK: blocks at
the sizes of ``mobilevit_v1_xs``'s ``layer_1`` (128x128, 64 expanded
channels; written with 32 channels in and out and a residual) and
``layer_2`` (64x64, 48 -> 192 -> 48): 1x1 expansion, SiLU, 3x3 depthwise,
SiLU, 1x1 projection, residual (BatchNorm left out: the converter folds
it). Each as shipped, with ReLU in place of SiLU (which XNNPACK fuses into
the convolution: what SiLU's LOGISTIC and MUL cost), and computed in row
bands, whose expanded maps shrink until they fit in a core's L2 (what
memory traffic costs). All files of a run are timed interleaved, 1 thread (see
mobilevit_latency.py).

    python benchmarks/mobilenetv2_block_latency.py
    python benchmarks/mobilenetv2_block_latency.py --bands 2,4,8 --rounds 5 --json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mobilevit_latency import time_interleaved  # noqa: E402

# (name, input side, channels, expanded channels) of mobilevit_v1_xs's stride-1 blocks
BLOCKS = [("layer_1", 128, 32, 64), ("layer_2", 64, 48, 192)]


def block_model(side: int, channels: int, expanded: int, bands: int, activation: str):
    """The block on a [1, side, side, channels] input; with ``bands`` > 1 each
    band of rows is computed from its input rows plus one halo row per side
    (the depthwise convolution's reach) and the bands are concatenated."""
    import keras

    keras.utils.set_random_seed(0)
    expand = keras.layers.Conv2D(expanded, 1, activation=activation)
    project = keras.layers.Conv2D(channels, 1)
    inputs = keras.Input((side, side, channels), batch_size=1)
    if bands == 1:
        x = keras.layers.DepthwiseConv2D(3, padding="same", activation=activation)(expand(inputs))
        return keras.Model(inputs, project(x) + inputs)
    depthwise = keras.layers.DepthwiseConv2D(3, activation=activation)
    rows, outputs = side // bands, []
    for band in range(bands):
        top, bottom = band * rows, (band + 1) * rows
        x = expand(inputs[:, max(top - 1, 0):min(bottom + 1, side)])
        x = keras.layers.ZeroPadding2D(((int(top == 0), int(bottom == side)), (1, 1)))(x)
        outputs.append(project(depthwise(x)) + inputs[:, top:bottom])
    return keras.Model(inputs, keras.layers.Concatenate(axis=1)(outputs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bands", default="2,4,8", help="row-band counts to try (default 2,4,8)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs-per-round", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="JSON on stdout instead of the table")
    args = parser.parse_args()
    from edgevit.export.convert import convert

    variants = [("silu", 1), ("relu", 1)] + [("silu", int(b)) for b in args.bands.split(",")]
    files = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, side, channels, expanded in BLOCKS:
            for activation, bands in variants:
                path = Path(tmp) / f"{name}_{activation}_{bands}.tflite"
                path.write_bytes(convert(block_model(side, channels, expanded, bands, activation), "fp32"))
                files.append({"block": name, "activation": activation, "bands": bands, "path": path})
                print(f"converted {path.name}", file=sys.stderr)
        time_interleaved(files, [1], args.rounds, args.runs_per_round, warmup=5)
    rows = []
    for f in files:
        base = next(g for g in files if g["block"] == f["block"] and g["activation"] == "silu" and g["bands"] == 1)
        ms = statistics.median(f["ms"][1])
        rows.append({"block": f["block"], "activation": f["activation"], "bands": f["bands"],
                     "ms": round(ms, 3), "ratio": round(ms / statistics.median(base["ms"][1]), 3)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("| block | activation | bands | ms (1 thread, median) | / as shipped |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| `{r['block']}` | {r['activation']} | {r['bands']} | {r['ms']:.3f} | {r['ratio']:.3f} |")


if __name__ == "__main__":
    main()
