"""Right answers on GPUs: the minimal graphs LiteRT's GPU accelerator computes
wrongly (kept as documentation: each test asserts the GPU still gets the raw
converter output wrong and that edgevit's own conversion avoids it), the
rules that recognise them, the audit that refuses them, and `edgevit check
--gpu` with its exit codes.

The GPU runs need a Vulkan device: scripts/install-test-tools.sh installs the
software one (SwiftShader, from Debian's chromium package) and CI runs them;
without one they skip, saying how to get one. The family files themselves
run on the GPU in each family's export tests (tests/helpers.py).
"""
import json

import keras
import numpy as np
import pytest
from click.testing import CliRunner
from keras import layers, ops

from edgevit.cli import main
from edgevit.errors import EdgevitError
from edgevit.export import convert as convert_module
from edgevit.export.audit import audit
from edgevit.export.convert import convert
from edgevit.layers import PrefixTokens
from edgevit.litert.accelerator import missing_vulkan, run_on_gpu, unsupported_ops
from edgevit.litert.flatbuffer import Op, Tensor, read
from edgevit.litert.gpu_rules import check_gpu, computed_wrongly, constant_operand_warning, quantized_rank_warning
from tests.helpers import assert_deployable, export_variant

CALIB = np.random.default_rng(0).normal(size=(8, 4, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def gpu():
    """Skips unless LiteRT's GPU accelerator runs here."""
    missing = missing_vulkan()
    if missing:
        pytest.skip(f"no Vulkan device ({missing}): run scripts/install-test-tools.sh")


@pytest.fixture
def raw_converter(monkeypatch):
    """convert() without edgevit's rewrite: the TFLite converter's own graph."""
    monkeypatch.setattr(convert_module, "restore_operand_ranks", lambda content: content)


def _written(tmp_path, content: bytes, name: str):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def class_token_residual():
    """ViT's first residual add on the class token: a constant (the class
    token) plus a slice of a dense layer's output."""
    x = keras.Input((4, 8))
    token = PrefixTokens(["cls_token"], [0.5], concat=False)(x)
    return keras.Model(x, layers.Add()([token, layers.Dense(8)(x)[:, 0:1]]), name="class_token_residual")


def token_sum():
    """Two one-token slices added: every later class-token residual."""
    x = keras.Input((4, 8))
    return keras.Model(x, layers.Add()([layers.Dense(8)(x)[:, 0:1], layers.Dense(8)(x)[:, 0:1]]), name="token_sum")


def shapes(content: bytes, op_name: str) -> list:
    return [[(list(t.shape), t.is_const) for t in op.inputs] for op in read(content).ops if op.name == op_name]


def test_converter_adds_a_rank1_tensor_to_a_constant_which_the_gpu_lays_out_wrongly(gpu, raw_converter, tmp_path):
    model = class_token_residual()
    raw = convert(model, "fp32")
    assert shapes(raw, "ADD") == [[([8], False), ([1, 1, 8], True)]]
    assert [w.op for w in computed_wrongly(read(raw))] == ["ADD"]
    wrong = run_on_gpu(_written(tmp_path, raw, "raw.tflite"), CALIB, "fp32")
    assert wrong.fully_accelerated and wrong.agreement["cosine_mean"] < 0.9, wrong.summary()


def test_edgevit_gives_the_class_token_residual_its_rank_back():
    content = convert(class_token_residual(), "fp32")
    assert shapes(content, "ADD") == [[([1, 1, 8], False), ([1, 1, 8], True)]]
    assert computed_wrongly(read(content)) == [] and "RESHAPE" not in [op.name for op in read(content).ops]


def test_edgevit_class_token_residual_agrees_on_the_gpu(gpu, tmp_path):
    content = convert(class_token_residual(), "fp32")
    run = run_on_gpu(_written(tmp_path, content, "fixed.tflite"), CALIB, "fp32")
    assert run.fully_accelerated and run.agrees, run.summary()


def test_int8_operands_of_different_rank_leave_the_gpu_output_unwritten(gpu, raw_converter, tmp_path):
    raw = convert(token_sum(), "int8", CALIB, "float32")
    assert shapes(raw, "ADD") == [[([1, 1, 8], False), ([8], False)]]
    wrong = run_on_gpu(_written(tmp_path, raw, "raw_int8.tflite"), CALIB, "int8")
    assert not wrong.agrees and any("WGSL" in e for e in wrong.errors), wrong.summary()


def test_edgevit_int8_token_sum_runs_on_the_gpu(gpu, tmp_path):
    content = convert(token_sum(), "int8", CALIB, "float32")
    assert shapes(content, "ADD") == [[([1, 1, 8], False), ([1, 1, 8], False)]]
    run = run_on_gpu(_written(tmp_path, content, "int8.tflite"), CALIB, "int8")
    assert run.fully_accelerated and run.agrees and not run.errors, run.summary()


def test_a_matmul_whose_first_operand_is_a_constant_stays_on_the_cpu(gpu, tmp_path):
    # ConViT's positional attention was written this way (scores @ values
    # with image-independent scores); edgevit now multiplies v^T by them.
    x = keras.Input((4, 8))
    scores = np.random.default_rng(1).random((1, 4, 4)).astype(np.float32)
    y = layers.Lambda(lambda t: ops.matmul(ops.convert_to_tensor(scores), t), output_shape=(4, 8))(x)
    content = convert(keras.Model(x, layers.Dense(8)(y), name="constant_first"), "fp32")
    assert [(f.op, f.reason) for f in check_gpu(content).fallbacks] == \
        [("BATCH_MATMUL", "the first operand is a constant (only the second may be)")]
    run = run_on_gpu(_written(tmp_path, content, "constant_first.tflite"), CALIB, "fp32")
    assert run.ran and not run.fully_accelerated, run.summary()
    assert [g["op"] for g in run.cpu_ops] == ["BATCH_MATMUL"] and "non-constant" in run.cpu_ops[0]["reason"]


@pytest.mark.parametrize("name,precision", [("vit_tiny16", "fp32"), ("vit_tiny16", "int8")])
def test_one_class_token_vit_agrees_on_the_gpu(gpu, tmp_path, name, precision):
    # ViT and DeiT (one class token) broke both ways; the family tests export
    # the distilled DeiT (two prefix tokens), which never did.
    report = export_variant(tmp_path, name, precision, 32)
    assert report["gpu_accelerator"]["ran"], report["gpu_accelerator"]
    assert_deployable(report)


def _tensor(index, shape, const=False, dtype="float32"):
    return Tensor(index, f"t{index}", dtype, tuple(shape), const)


def _op(name, a, b, out):
    return Op(0, name, 1, [a, b], [out], {})


# (runtime shape, constant shape, output shape, wrong on the GPU): each case
# measured on LiteRT 2.3's GPU accelerator (SwiftShader), output cosine vs
# XNNPACK 1.0 where right, 0.6 or below where wrong.
CONSTANT_OPERAND_CASES = [
    ((8,), (1, 1, 8), (1, 1, 8), True),
    ((8,), (1, 8), (1, 8), True),
    ((8,), (1, 1, 1, 8), (1, 1, 1, 8), True),
    ((40,), (40,), (40,), True),
    ((5, 8), (1, 5, 8), (1, 5, 8), True),
    ((5, 8), (5, 8), (5, 8), True),
    ((1, 8), (1, 1, 8), (1, 1, 8), False),
    ((1, 1, 8), (8,), (1, 1, 8), False),
    ((1, 5, 8), (5, 8), (1, 5, 8), False),
    ((1, 5, 8), (1, 1, 5, 8), (1, 1, 5, 8), False),
    ((1, 1, 8), (1, 5, 8), (1, 5, 8), False),
    ((1, 5, 8), (1, 5, 1), (1, 5, 8), False),
    ((5, 8), (1, 8), (5, 8), False),
    ((8,), (), (8,), False),
    ((1, 5, 2, 4), (2, 4), (1, 5, 2, 4), False),
]


@pytest.mark.parametrize("runtime,constant,output,wrong", CONSTANT_OPERAND_CASES)
@pytest.mark.parametrize("op_name", ["ADD", "MUL"])
def test_constant_operand_rule_matches_what_the_gpu_computed(op_name, runtime, constant, output, wrong):
    op = _op(op_name, _tensor(0, runtime), _tensor(1, constant, const=True), _tensor(2, output))
    assert bool(constant_operand_warning(op)) is wrong


def test_quantized_operands_of_different_rank_are_flagged_only_in_integer_files():
    def op(dtype, shape_b):
        return _op("ADD", _tensor(0, (1, 1, 8), dtype=dtype), _tensor(1, shape_b, dtype=dtype),
                   _tensor(2, (1, 1, 8), dtype=dtype))

    assert "shader" in quantized_rank_warning(op("int8", (8,)))
    assert quantized_rank_warning(op("int8", (1, 1, 8))) is None
    assert quantized_rank_warning(op("float32", (8,))) is None


def test_ops_left_on_the_cpu_are_read_from_the_accelerator_log():
    log = """ERROR: Following operations are not supported by GPU delegate:
BATCH_MATMUL: Not supported batched mat mul case: non-constant tensor
I0000 00:00:1795456667.398668    5291 delegate_kernel.cc:984] Initializing WebGPU-based API from graph.
125 operations will run on the GPU, and the remaining 376 operations will run on the CPU.
RESHAPE: after the list"""
    assert unsupported_ops(log) == [{"op": "BATCH_MATMUL",
                                     "reason": "Not supported batched mat mul case: non-constant tensor"}]


def run_cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def adjoint_file(tmp_path_factory):
    # The converter fuses q @ transpose(k) into BATCH_MATMUL(adj_y=True).
    x = keras.Input((4, 8))
    q = layers.Dense(8)(x)
    scores = layers.Lambda(lambda t: ops.matmul(t, ops.transpose(t, (0, 2, 1))), output_shape=(4, 4))(q)
    content = convert(keras.Model(x, layers.Softmax()(scores), name="adjoint"), "fp32")
    return _written(tmp_path_factory.mktemp("adjoint"), content, "adjoint_fp32.tflite")


def test_audit_rejects_an_adjoint_batch_matmul(adjoint_file):
    with pytest.raises(EdgevitError, match="adj_y=true"):
        audit(adjoint_file.read_bytes(), "fp32", "float32")


def test_check_fails_an_adjoint_batch_matmul_only_when_asked(adjoint_file):
    code, out, _ = run_cli("check", adjoint_file, "--gpu")
    assert code == 0 and "adj_y=true" in out
    assert run_cli("check", adjoint_file, "--gpu", "--fail-on-fallback")[0] == 3


def test_check_without_vulkan_says_so_and_still_applies_the_rules(adjoint_file, monkeypatch):
    monkeypatch.setenv("VK_ICD_FILENAMES", "/nonexistent/icd.json")
    code, out, _ = run_cli("check", adjoint_file, "--gpu")
    assert code == 0
    assert "not run: no Vulkan device" in out and "apt-get install chromium libvulkan1" in out
    assert "all ops delegated" in out and "adj_y=true" in out
    assert run_cli("check", adjoint_file, "--gpu", "--require-gpu-run")[0] == 4
    data = json.loads(run_cli("check", adjoint_file, "--gpu", "--json")[1])
    assert data["gpu_accelerator"]["ran"] is False and data["gpu_accelerator"]["agreement"] is None


def test_check_runs_a_good_file_on_the_gpu(gpu, tmp_path):
    x = keras.Input((16, 16, 3))
    y = layers.GlobalAveragePooling2D()(layers.Conv2D(8, 3, activation="relu")(x))
    path = _written(tmp_path, convert(keras.Model(x, layers.Dense(4)(y), name="plain"), "fp32"), "plain.tflite")
    code, out, _ = run_cli("check", path, "--gpu", "--images", "2", "--fail-on-fallback", "--require-gpu-run")
    assert code == 0, out
    assert "fully accelerated; agrees with XNNPACK on 2 images" in " ".join(out.split())
    data = json.loads(run_cli("check", path, "--gpu", "--images", "2", "--json")[1])
    run = data["gpu_accelerator"]
    assert run["ran"] and run["fully_accelerated"] and run["agrees"] and run["agreement"]["top1_agreement"] == 1.0


def test_convert_and_check_judge_a_qat_file_on_the_gpu_alike_every_time(gpu, tmp_path):
    """A 2-class QAT model, its logits close together: convert judged its
    GPU run on its validation images and check on sample photos, and one
    failed the GPU where the other passed it. Now both run the same held-out
    photos against the same floor: two conversions and a check give one
    answer, and the verdict rules out the GPU alone should it disagree."""
    from edgevit.export.pipeline import ExportOptions, export
    from edgevit.quantize.qat import quantize_model
    from tests.test_export import SPEC, tiny_model

    x = np.random.default_rng(0).uniform(-2, 2, (16, 32, 32, 3)).astype(np.float32)
    qat = quantize_model(tiny_model(classes=2), x, input_range=(-2.0, 2.0))
    results = [export(qat, SPEC, ExportOptions(output=str(tmp_path / f"run{i}.tflite"), weights_label="qat.keras"))
               for i in range(2)]
    runs = [result.gpu_run.to_dict() for result in results]
    assert runs[0]["ran"] and runs[0]["agreement"]["samples"] == 16
    assert {k: v for k, v in runs[0].items() if k != "images"} == {k: v for k, v in runs[1].items() if k != "images"}
    assert results[0].verdict.text == results[1].verdict.text
    assert ("GPU" in results[0].verdict.text) == runs[0]["agrees"]
    code, out, _ = run_cli("check", "--gpu", "--json", tmp_path / "run0.tflite")
    checked = json.loads(out)["gpu_accelerator"]
    assert (checked["agrees"], checked["agreement"], checked["floor"]) == \
        (runs[0]["agrees"], runs[0]["agreement"], runs[0]["floor"]), code
