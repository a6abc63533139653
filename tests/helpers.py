"""Test helpers shared by the family tests: fast parameter counting, export
with the validation report (and a run on LiteRT's GPU accelerator where a
Vulkan device exists, on LiteRT's Arm64 kernels where asked), the deployment
rules, the per-layer float-vs-int8 comparison that names the first layer
where int8 breaks, and the QAT tests' models, photos and kernel sets."""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json

import numpy as np
import pytest
from PIL import Image

import edgevit
from edgevit.data.sample_photos import photo_dir
from edgevit.export.pipeline import GPU_PRECISIONS, ExportOptions, export
from edgevit.litert.arm import emulator_missing
from edgevit.litert.x86_levels import LEVELS, x86_emulator_missing
from edgevit.registry import get_spec

# LiteRT's Arm64 kernels under emulation: scripts/install-arm-emulator.sh
# (scripts/install-test-tools.sh runs it, so CI has it)
ARM_MISSING = emulator_missing()
needs_arm = pytest.mark.skipif(ARM_MISSING is not None,
                               reason=f"{ARM_MISSING}: run scripts/install-arm-emulator.sh")

# XNNPACK's int8 kernels of older x86 CPUs (AVX2, SSE4) under emulation: qemu-x86_64, installed with the
# Arm64 emulator. X86_KERNELS: this host's kernels (None), then each emulated level.
X86_EMULATOR_MISSING = x86_emulator_missing()
needs_x86_emulator = pytest.mark.skipif(X86_EMULATOR_MISSING is not None,
                                        reason=f"{X86_EMULATOR_MISSING}: run scripts/install-arm-emulator.sh")
X86_KERNELS = [pytest.param(None, id="host"), *(pytest.param(level, id=level, marks=needs_x86_emulator)
                                                for level in LEVELS)]

FORBIDDEN_OPS = {"SHAPE", "GATHER", "GATHER_ND", "PACK", "REDUCE_PROD", "SQUARED_DIFFERENCE", "NEG", "ERF"}
# Random-init weights give small, noise-like logits: the worst case for
# quantization (trained weights do better).
COSINE_FLOOR = {"fp32": 0.9999, "fp16": 0.999, "dynamic": 0.98, "int16x8": 0.97, "int8_mixed": 0.9, "int8": 0.85}


@contextlib.contextmanager
def zero_initialisers():
    """Build models with all-zero weights: counting parameters of the large
    variants then costs the graph construction only, not random sampling."""
    import keras
    from keras import ops

    classes = (keras.initializers.TruncatedNormal, keras.initializers.RandomNormal,
               keras.initializers.VarianceScaling, keras.initializers.GlorotUniform,
               keras.initializers.RandomUniform)
    saved = {cls: cls.__call__ for cls in classes}

    def _zeros(self, shape, dtype=None):
        return ops.zeros(shape, dtype=dtype or "float32")

    try:
        for cls in classes:
            cls.__call__ = _zeros
        yield
    finally:
        for cls, call in saved.items():
            cls.__call__ = call


def export_variant(tmp_path, name, precision, size, *, num_classes=10, calib_samples=16,
                   validation_samples=8, model=None, gpu=True, arm_images=0):
    """Export under ``tmp_path``; returns the JSON report (what `edgevit convert --json` prints).
    ``arm_images``: also run that many held-out images on the Arm64 kernels (emulated)."""
    spec = get_spec(name)
    model = model or edgevit.create_model(name, num_classes=num_classes, input_size=size)
    opts = ExportOptions(precision=precision, output=str(tmp_path / f"{name}_{precision}.tflite"),
                         calib_samples=calib_samples, validation_samples=validation_samples,
                         gpu_images=validation_samples if gpu and precision in GPU_PRECISIONS else 0,
                         arm_images=arm_images,
                         recalibrate_batchnorm=any(layer.__class__.__name__ == "BatchNormalization"
                                                   for layer in model.layers))
    return export(model, spec, opts).to_dict()


def tiny_tflite(path):
    """A valid .tflite file that edgevit did not write (no metadata)."""
    import keras

    from edgevit.export.convert import convert

    inputs = keras.Input((8, 8, 3))
    x = keras.layers.GlobalAveragePooling2D()(inputs)
    path.write_bytes(convert(keras.Model(inputs, keras.layers.Dense(2)(x), name="plain"), "fp32"))
    return path


def assert_deployable(report):
    failed = [c for c in report["checks"] if not c["passed"]]
    assert not failed, failed
    assert report["max_rank"] <= 4
    assert not FORBIDDEN_OPS & set(report["op_histogram"]), report["op_histogram"]
    assert report["io"]["input"]["shape"] == [1, report["input_size"], report["input_size"], 3]
    gpu = report.get("gpu_accelerator")
    if gpu and gpu["ran"] and report["precision"] in GPU_PRECISIONS:
        assert gpu["fully_accelerated"] and gpu["agrees"] and not gpu["errors"], gpu




def exports_within_floor(tmp_path, name, precision, size, model=None):
    """Export under the deployment rules with agreement above the precision's floor."""
    report = export_variant(tmp_path, name, precision, size, model=model)
    assert_deployable(report)
    assert report["agreement"]["cosine_mean"] > COSINE_FLOOR[precision], report["agreement"]
    return report


def outputs(model, x, batch_size: int = 64):
    """Inference outputs computed eagerly, ``batch_size`` images at a time: no
    per-model graph trace, as ``model.predict`` would pay (seconds for the
    deeper families)."""
    return np.concatenate([np.asarray(model(x[i:i + batch_size], training=False))
                           for i in range(0, len(x), batch_size)])


def round_trip_outputs(tmp_path, model, x):
    """``model``'s outputs on ``x`` after asserting that its ``.keras`` file
    reloads under the same name with identical outputs."""
    import keras

    out = outputs(model, x)
    model.save(tmp_path / "m.keras")
    reloaded = keras.saving.load_model(tmp_path / "m.keras")
    assert reloaded.name == model.name
    np.testing.assert_array_equal(out, outputs(reloaded, x))
    return out


def round_trips_and_converts(tmp_path, name, size, precisions=("int8",)):
    """Output shape, an identical ``.keras`` round trip, then each precision
    through :func:`exports_within_floor`; returns the model and the reports.
    Full int8 by default: the hardest path; every precision of every family
    is the slow matrix's (`test_full_matrix_at_default_size`)."""
    model = edgevit.create_model(name, num_classes=10, input_size=size)
    x = np.random.default_rng(1).random((2, size, size, 3), dtype="float32")
    assert round_trip_outputs(tmp_path, model, x).shape == (2, 10)
    return model, {p: exports_within_floor(tmp_path, name, p, size, model=model) for p in precisions}


def int8_file_and_qat(tmp_path, model, x, input_range):
    """The QAT model of ``model``, calibrated on ``x``, and the path of its
    int8 file, after moving every weight off its initial value as training
    does (no all-one scales or zero biases the converter would fold away)."""
    from edgevit.export.convert import convert
    from edgevit.quantize.qat import quantize_model

    rng = np.random.default_rng(1)
    for w in model.weights:
        w.assign(np.asarray(w) + rng.normal(0, 0.1, w.shape).astype(np.float32))
    qat = quantize_model(model, x, input_range=input_range)
    path = tmp_path / f"{model.name}.tflite"
    path.write_bytes(convert(qat, "int8", None, "int8"))
    return path, qat


def int8_and_qat_outputs(tmp_path, model, x, input_range):
    """Outputs on ``x`` of ``model``'s int8 file (LiteRT's XNNPACK kernels,
    in a child process) and of the QAT model it was converted from (see
    :func:`int8_file_and_qat`)."""
    from edgevit.litert.run_model import run_in_child

    path, qat = int8_file_and_qat(tmp_path, model, x, input_range)
    return run_in_child(path, x), outputs(qat, x)


def assert_same_weights(model, other):
    """Every weight of ``other`` equals ``model``'s bit for bit (so do their outputs)."""
    for a, b in zip(model.weights, other.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


def photo_folder(root, classes=("astronaut", "coffee"), per_class=4):
    """DIR/train/<class>, DIR/val/<class>: crops of two of the sample photos."""
    rng = np.random.default_rng(0)
    photos = {"astronaut": "astronaut.png", "coffee": "coffee.png"}
    for split in ("train", "val"):
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True)
            image = Image.open(photo_dir() / photos[name]).convert("RGB")
            for i in range(per_class):
                side = int(min(image.size) * rng.uniform(0.5, 1.0))
                left, top = (int(rng.integers(0, d - side + 1)) for d in image.size)
                image.crop((left, top, left + side, top + side)).resize((48, 48)).save(folder / f"{i}.png")
    return root


# every family's smallest variant at a small input size on its patch grid (the QAT tests)
SMALLEST = {"mobilevit_v1_xxs": 64, "mobilevit_v2_050": 64, "mobilevit_v3_xxs": 64, "vit_tiny16": 32,
            "deit_tiny": 32, "deepvit_s": 32, "convit_tiny": 32, "crossvit_tiny": 120, "pit_ti": 32,
            "cvt_13": 64, "mixer_s16": 32, "resmlp_12": 32, "pvt_v2_b0": 64, "swin_tiny": 32, "swinv2_tiny": 32,
            "cswin_tiny": 64, "t2t_vit_7": 32}
# The deep families with one block per stage (or per kind of block), which holds every kind of layer:
# module, the fields of its config table's entry and the module constants that set the depth.
FEW_BLOCKS = {"crossvit_tiny": ("crossvit", {"depth": 1}, {"NUM_MULTISCALE_BLOCKS": 1}),
              "cvt_13": ("cvt", {"depths": (1, 1, 1)}, {}),
              "pit_ti": ("pit", {"depths": (1, 1, 1)}, {}),
              "swin_tiny": ("swin", {"depths": (1, 1, 1, 1)}, {}),   # 32 px: one window per stage
              "swinv2_tiny": ("swin", {"depths": (1, 1, 1, 1)}, {}),
              "deepvit_s": ("deepvit", {}, {"DEPTH": 2, "RE_ATTENTION_BLOCKS": 1}),
              # 25 blocks, 21 of them alike in stage 3
              "cswin_tiny": ("cswin", {"depths": (1, 1, 1, 1)}, {})}


def with_few_blocks(name: str, monkeypatch) -> None:
    module_name, fields, constants = FEW_BLOCKS[name]
    module = importlib.import_module(f"edgevit.models.{module_name}")
    if fields:
        monkeypatch.setitem(module.CONFIGS, name, dataclasses.replace(module.CONFIGS[name], **fields))
    for constant, value in constants.items():
        monkeypatch.setattr(module, constant, value)


def run_json(*args):
    """An edgevit command's JSON result, the command asserted to succeed."""
    from click.testing import CliRunner

    from edgevit.cli import main

    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)
