"""Golden cases for the app's Kotlin pre- and postprocessing.

For each case: a small PNG, the edgevit metadata documents a model with that
preprocessing would carry (float32, int8 and uint8 input), and the exact bytes
edgevit's Python preprocessing gives for it (`edgevit.data.images` for
resize/crop/normalise, `edgevit.litert.run_model.quantize` for quantization).
The Kotlin test (GoldenPreprocessingTest) must reproduce every byte.

    python android_demo/offline-check/make_golden.py [OUT_DIR]

OUT_DIR defaults to app/src/test/resources/golden (the copy committed for
Android Studio runs); the pytest suite regenerates the cases into a temporary
folder on every run and checks that the committed copy is still current.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from edgevit.data.decode import open_rgb
from edgevit.data.images import to_model_input
from edgevit.data.transforms import center_crop
from edgevit.litert.metadata import build_metadata
from edgevit.litert.run_model import dequantize, quantize
from edgevit.registry import Preprocessing

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "app" / "src" / "test" / "resources" / "golden"

IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))

# name: (width, height, Preprocessing)
CASES = {
    # A downscale (Pillow widens the filter: antialiasing) with ImageNet mean/std.
    "downscale_bilinear": (61, 47, Preprocessing(16, 18, "bilinear", **IMAGENET)),
    # A camera-like 4:3 frame, stronger downscale.
    "camera_bilinear": (160, 120, Preprocessing(32, 36, "bilinear")),
    # An upscale with the bicubic filter (negative weights: clipping to 0..255).
    "upscale_bicubic": (13, 10, Preprocessing(16, 18, "bicubic", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))),
    # 4 x 5 -> shorter side 18: the long side is 22.5, which Python rounds to 22 (half to even).
    "half_rounding": (4, 5, Preprocessing(16, 18, "bilinear")),
    # Already at input size: no resampling at all, only normalisation.
    "exact_size": (16, 16, Preprocessing(16, 16, "bilinear", **IMAGENET)),
}


def _image(width: int, height: int, seed: int) -> Image.Image:
    """Gradients, a hard edge and noise: every resampling weight matters."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    r = 255 * x / max(1, width - 1)
    g = 255 * y / max(1, height - 1)
    b = np.where((x // 3 + y // 3) % 2 == 0, 230, 20)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 25, (height, width, 3))
    return Image.fromarray(np.clip(np.round(img), 0, 255).astype(np.uint8), "RGB")


def _quant(pre: Preprocessing, dtype: str) -> dict:
    lo, hi = pre.value_range
    scale = float(np.float32((hi - lo) / 255.0))
    zero_int8 = int(round(-128 - lo / scale))
    return {"scale": scale, "zero_point": zero_int8 + (128 if dtype == "uint8" else 0)}


def _metadata(name: str, pre: Preprocessing, dtype: str) -> dict:
    quant = None if dtype == "float32" else _quant(pre, dtype)
    size = pre.input_size
    return build_metadata(
        model_name=f"golden_{name}", family="golden", precision="int8" if quant else "fp32",
        weights="none", labels=["a", "b"], labels_file="labels.txt",
        graph_input={"shape": [1, size, size, 3], "dtype": dtype, "quantization": quant},
        graph_output={"shape": [1, 2], "dtype": dtype, "quantization": quant},
        preprocessing=pre.to_dict())


def write_golden(out_dir: str | Path) -> list[str]:
    """Write every case into ``out_dir``; return the file names written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for seed, (name, (width, height, pre)) in enumerate(CASES.items()):
        png = out / f"{name}.png"
        _image(width, height, seed).save(png)
        cropped = center_crop(open_rgb(png), pre.resize_size, pre.input_size, pre.interpolation)
        (out / f"{name}.rgb").write_bytes(np.asarray(cropped, np.uint8).tobytes())
        values = to_model_input(cropped, pre)[None]
        for dtype in ("float32", "int8", "uint8"):
            meta = _metadata(name, pre, dtype)
            (out / f"{name}.{dtype}.json").write_text(json.dumps(meta, indent=2) + "\n")
            q = meta["input"]["quantization"]
            detail = {"dtype": np.dtype(dtype), "quantization": (q["scale"], q["zero_point"]) if q else (0.0, 0)}
            tensor = quantize(values, detail)
            (out / f"{name}.{dtype}.bin").write_bytes(tensor.astype(tensor.dtype.newbyteorder("<")).tobytes())
            written += [f"{name}.{dtype}.json", f"{name}.{dtype}.bin"]
        written += [png.name, f"{name}.rgb"]
    (out / "cases.txt").write_text("\n".join(CASES) + "\n")
    written += _write_postprocessing(out)
    return sorted(written + ["cases.txt"])


def _write_postprocessing(out: Path) -> list[str]:
    """Raw int8/uint8 model outputs with what Python makes of them: dequantized
    scores (`edgevit.litert.run_model.dequantize`, exact), softmax probabilities
    (float64, compared with a tolerance) and the top-5 classes (ties: lower index)."""
    rng = np.random.default_rng(99)
    written = []
    for dtype, zero_point in (("int8", -3), ("uint8", 125)):
        info = np.iinfo(dtype)
        raw = rng.integers(info.min, info.max + 1, 1000).astype(dtype)
        raw[[10, 500]] = info.max  # a tie for first place: index 10 must win
        scale = float(np.float32(0.0625))
        scores = dequantize(raw[None], {"dtype": np.dtype(dtype), "quantization": (scale, zero_point)})[0]
        logits = scores.astype(np.float64)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        top5 = np.lexsort((np.arange(len(probs)), -probs))[:5]
        (out / f"postprocess.{dtype}.bin").write_bytes(raw.tobytes())
        (out / f"postprocess.{dtype}.scores.bin").write_bytes(scores.astype("<f4").tobytes())
        (out / f"postprocess.{dtype}.json").write_text(json.dumps({
            "dtype": dtype, "quantization": {"scale": scale, "zero_point": zero_point},
            "top5": top5.tolist(), "top5_probabilities": probs[top5].tolist()}, indent=2) + "\n")
        written += [f"postprocess.{dtype}.bin", f"postprocess.{dtype}.scores.bin", f"postprocess.{dtype}.json"]
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    print(f"{len(write_golden(target))} files written to {target}")
