"""The export pipeline on small hand-built models: precisions, audits,
metadata, validation and the no-partial-output rule."""
import json
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest
from PIL import Image

from edgevit.errors import EdgevitError
from edgevit.export import pipeline
from edgevit.export.convert import convert
from edgevit.export.graph import describe
from edgevit.export.pipeline import ExportOptions, export
from edgevit.layers import HeadAttention
from edgevit.litert.metadata import read_embedded
from edgevit.litert.run_model import run_in_child
from edgevit.models.batchnorm import recalibrate_batchnorm
from edgevit.registry import ModelSpec, Preprocessing

SIZE = 32
SPEC = ModelSpec("tiny_convnet", "test", builder=None, default_input_size=SIZE,
                 preprocessing=Preprocessing(SIZE, 36, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)))


def tiny_model(norm=None, classes=10):
    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(16, 3, strides=2, use_bias=False)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("silu")(x)
    if norm is not None:
        x = norm(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(classes)(x), name="tiny_convnet")


def run_export(tmp_path, model=None, **options):
    options.setdefault("calib_samples", 8)
    options.setdefault("validation_samples", 4)
    options.setdefault("recalibrate_batchnorm", True)
    out = tmp_path / f"tiny_{options.get('precision', 'int8')}.tflite"
    return export(model or tiny_model(), SPEC, ExportOptions(output=str(out), **options)), out


@pytest.mark.parametrize("precision", ["fp32", "fp16", "dynamic", "int8", "int16x8"])
def test_every_precision_converts_validates_and_writes_all_files(tmp_path, precision):
    result, out = run_export(tmp_path, precision=precision)
    for path in result.files.all():
        assert (tmp_path / path.name).is_file()
    assert result.agreement["samples"] == 4
    assert result.agreement["cosine_mean"] > (0.999999 if precision in ("fp32", "dynamic") else 0.99)
    assert all(check.passed for check in result.checks)
    assert result.max_rank == 4
    # int8: the uint8 input takes the bytes, and a 1x1 depthwise convolution normalises them (mean 0.5, std 0.25
    # of [0, 1] pixels is no uint8 zero point)
    assert result.macs == 15 * 15 * 16 * 27 + 16 * 10 + (SIZE * SIZE * 3 if precision == "int8" else 0)
    expected_input = {"int8": "uint8"}.get(precision, "float32")
    assert result.io["input"]["dtype"] == expected_input


def test_int8_graph_is_all_integer_and_carries_metadata(tmp_path):
    result, out = run_export(tmp_path, precision="int8")
    summary = describe(out.read_bytes())
    assert summary.float_ops() == []
    # the model's ops; the camera's bytes requantized and normalised in front, the softmax and the uint8
    # probabilities behind
    assert set(summary.op_histogram) == {"CONV_2D", "LOGISTIC", "MUL", "MEAN", "FULLY_CONNECTED",
                                         "QUANTIZE", "DEPTHWISE_CONV_2D", "SOFTMAX"}
    names = [op.name for op in summary.ops]
    assert names[:2] == ["QUANTIZE", "DEPTHWISE_CONV_2D"] and names[-2:] == ["SOFTMAX", "QUANTIZE"]
    assert result.io["input"] == {"shape": [1, SIZE, SIZE, 3], "dtype": "uint8",
                                  "quantization": {"scale": 1.0, "zero_point": 0}}
    assert result.io["output"] == {"shape": [1, 10], "dtype": "uint8",
                                   "quantization": {"scale": 1 / 256, "zero_point": 0}}
    embedded = read_embedded(out.read_bytes())
    sidecar = json.loads(out.with_suffix(".json").read_text())
    assert embedded == sidecar
    assert sidecar["input"]["quantization"]["zero_point"] == result.io["input"]["quantization"]["zero_point"]
    assert (sidecar["input"]["takes"], sidecar["output"]["kind"]) == ("rgb_bytes", "probabilities")
    assert sidecar["preprocessing"]["mean"] == [0.5, 0.5, 0.5]
    assert sidecar["preprocessing"]["value_range"] == [-2.0, 2.0]
    assert sidecar["num_classes"] == 10 == len(out.with_suffix(".labels.txt").read_text().split())
    report = json.loads(out.with_name("tiny_int8.report.json").read_text())
    assert report["precision"] == "int8"
    assert list(report) == ["model", "precision", "quantization_ranges", "input_size", "weights", "file", "size_bytes",
                            "io", "ops", "macs", "op_histogram", "max_rank", "checks", "delegates", "images",
                            "outputs", "agreement", "probability_agreement", "seconds", "files", "gpu_accelerator",
                            "weights_hint", "verdict"]
    assert report["probability_agreement"]["top1_agreement"] >= 0.75
    assert report["quantization_ranges"] == sidecar["quantization_ranges"] == "calibrated"
    assert report == result.to_dict() and report["ops"] == len(summary.ops)


def test_logits_and_int8_input_keep_the_models_own_graph(tmp_path):
    result, out = run_export(tmp_path, precision="int8", io_dtype="int8", outputs="logits")
    assert set(describe(out.read_bytes()).op_histogram) == {"CONV_2D", "LOGISTIC", "MUL", "MEAN", "FULLY_CONNECTED"}
    assert result.probability_agreement is None and result.to_dict()["outputs"] == "logits"
    meta = read_embedded(out.read_bytes())
    assert (meta["input"]["takes"], meta["output"]["kind"]) == ("normalised", "logits")


def test_a_uint8_file_computes_what_the_int8_file_does_from_the_bytes(tmp_path):
    """The bytes' normalisation inside the file costs at most one input step
    where it rounds otherwise than the float normalisation."""
    from edgevit.litert.inputs import file_inputs
    from edgevit.litert.run_model import run_in_process

    model = tiny_model()
    recalibrate_batchnorm(model, np.random.default_rng(1).normal(size=(16, SIZE, SIZE, 3)).astype(np.float32))
    (tmp_path / "u").mkdir(), (tmp_path / "i").mkdir()
    _, bytes_file = run_export(tmp_path / "u", model, precision="int8", recalibrate_batchnorm=False)
    _, int8_file = run_export(tmp_path / "i", model, precision="int8", io_dtype="int8", recalibrate_batchnorm=False)
    pixels = np.random.default_rng(2).integers(0, 256, (6, SIZE, SIZE, 3)).astype(np.float32)
    images = (pixels / 255 - 0.5) / 0.25
    content = bytes_file.read_bytes()
    fed = file_inputs(content, images)
    np.testing.assert_array_equal(fed, pixels)  # scale 1, zero point 0: the bytes themselves
    from_bytes = run_in_process(content, fed)
    from_int8 = run_in_process(int8_file.read_bytes(), images)
    assert np.abs(from_bytes - from_int8).max() <= 2 / 256
    assert (from_bytes.argmax(1) == from_int8.argmax(1)).mean() >= 5 / 6


@pytest.mark.parametrize("io_dtype", ["uint8", "float32"])
def test_int8_io_types(tmp_path, io_dtype):
    result, out = run_export(tmp_path, precision="int8", io_dtype=io_dtype)
    assert result.io["input"]["dtype"] == io_dtype == result.io["output"]["dtype"]
    assert describe(out.read_bytes()).float_ops(allow_io_boundary=True) == []


def test_io_type_that_does_not_fit_precision_is_refused(tmp_path):
    with pytest.raises(EdgevitError, match="int16x8 models take float32"):
        run_export(tmp_path, precision="int16x8", io_dtype="int8")
    with pytest.raises(EdgevitError, match="needs a fully-integer model"):
        run_export(tmp_path, precision="fp16", io_dtype="uint8")
    assert list(tmp_path.iterdir()) == []


def test_float_ops_left_in_int8_fail_loudly_and_write_nothing(tmp_path):
    # Keras' own LayerNormalization converts with a NEG op that stays float.
    model = tiny_model(norm=keras.layers.LayerNormalization())
    with pytest.raises(EdgevitError, match="left float ops"):
        run_export(tmp_path, model=model, precision="int8")
    assert list(tmp_path.iterdir()) == []


def test_float_graph_fails_the_audit_before_packaging_or_validation(tmp_path, monkeypatch):
    model = tiny_model()
    float_content = convert(model, "fp32")
    monkeypatch.setattr(pipeline, "convert_model", lambda *args: (float_content, 0.0))

    def later_stage(*args, **kwargs):
        raise AssertionError("a stage after the audit ran")

    for stage in ("package", "validate", "diagnose", "write"):
        monkeypatch.setattr(pipeline, stage, later_stage)
    with pytest.raises(EdgevitError, match="int8 conversion left float ops in the graph .*CONV_2D#"):
        run_export(tmp_path, model=model, precision="int8", recalibrate_batchnorm=False)
    assert list(tmp_path.iterdir()) == []


def test_metadata_embeds_and_reads_back_without_tensorflow(tmp_path):
    model = tiny_model()
    path = tmp_path / "m.tflite"
    path.write_bytes(convert(model, "fp32"))
    x = np.random.default_rng(3).random((1, SIZE, SIZE, 3), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        import numpy as np
        from edgevit.litert.flatbuffer import read_model
        from edgevit.litert.interpreter import load_interpreter
        from edgevit.litert.metadata import METADATA_NAME, embed_edgevit as embed, read_embedded

        content = Path({str(path)!r}).read_bytes()
        first = embed(content, {{"labels": ["a", "b"]}})
        second = embed(first, {{"labels": ["c"]}})
        interp = load_interpreter(second)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], np.load({str(tmp_path / "x.npy")!r}))
        interp.invoke()
        np.save({str(tmp_path / "y.npy")!r}, interp.get_tensor(interp.get_output_details()[0]["index"]))
        entries = [m.name.decode() for m in read_model(second).metadata].count(METADATA_NAME)
        print(json.dumps({{"none": read_embedded(content), "first": read_embedded(first),
                          "second": read_embedded(second), "identifier": second[4:8].decode(),
                          "entries": entries, "tensorflow": "tensorflow" in sys.modules}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {"none": None, "first": {"labels": ["a", "b"]}, "second": {"labels": ["c"]},
                     "identifier": "TFL3", "entries": 1, "tensorflow": False}
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), model.predict(x, verbose=0), atol=1e-5)


def test_missing_or_unwritable_output_folder(tmp_path):
    with pytest.raises(EdgevitError, match="does not exist"):
        export(tiny_model(), SPEC, ExportOptions(precision="fp32", output=str(tmp_path / "no" / "m.tflite")))
    with pytest.raises(EdgevitError, match="must end in .tflite"):
        export(tiny_model(), SPEC, ExportOptions(precision="fp32", output=str(tmp_path / "m.bin")))


def _write_images(folder, count, size=(48, 40)):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(folder / f"img{i}.png")


def test_calibration_folder_is_used_and_bad_files_are_skipped(tmp_path):
    calib = tmp_path / "calib"
    _write_images(calib / "a", 14)
    (calib / "notes.txt").write_text("not an image")
    (calib / "broken.jpg").write_bytes(b"not a jpeg")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result, _ = run_export(out_dir, precision="int8", calib_dir=str(calib), calib_samples=6)
    messages = " ".join(str(w.message) for w in caught)
    assert "1 non-image file(s)" in messages
    assert "1 unreadable image(s) skipped: 1 not an image, or damaged (broken.jpg)" in messages
    assert result.images.calibration == f"6 images of {calib}"
    assert result.images.validation.startswith("4 held-out images")


def test_held_out_images_start_after_the_last_calibration_image(tmp_path):
    calib = tmp_path / "calib"
    _write_images(calib, 20)
    for i in range(5):
        (calib / f"broken{i}.jpg").write_bytes(b"not a jpeg")
    options = ExportOptions(calib_dir=str(calib), calib_samples=8, validation_samples=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the broken files are counted
        calibration, validation, _ = pipeline._image_sets(SPEC, SIZE, options, need_calibration=True)
    assert not set(calibration.items) & set(validation.items)
    assert len(calibration) + len(validation) == 20


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "does not exist"),
    (lambda p: p.mkdir(), "contains no images"),
    (lambda p: (p.mkdir(), (p / "x.txt").write_text("x")), "contains no images"),
])
def test_unusable_calibration_folder(tmp_path, setup, message):
    calib = tmp_path / "calib"
    setup(calib)
    with pytest.raises(EdgevitError, match=message):
        run_export(tmp_path, precision="int8", calib_dir=str(calib))


def test_interpreter_failure_in_child_becomes_an_error(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(EdgevitError, match="LiteRT failed running bad.tflite"):
        run_in_child(bad, np.zeros((1, SIZE, SIZE, 3), np.float32))


def test_child_run_matches_in_process_run(tmp_path):
    model = tiny_model()
    path = tmp_path / "m.tflite"
    path.write_bytes(convert(model, "fp32"))
    x = np.random.default_rng(1).random((3, SIZE, SIZE, 3), dtype=np.float32)
    np.testing.assert_allclose(run_in_child(path, x), model.predict(x, verbose=0), atol=1e-5)


def test_batchnorm_recalibration_matches_input_statistics():
    model = tiny_model()
    images = np.random.default_rng(2).normal(0.3, 2.0, (18, SIZE, SIZE, 3)).astype(np.float32)
    images[:8] += 1.0  # batches that differ: only statistics pooled over all of them match the whole set's
    assert recalibrate_batchnorm(model, images, batch_size=8) == 1
    conv = model.layers[1]
    bn = model.layers[2]
    features = np.asarray(conv(images))
    np.testing.assert_allclose(np.asarray(bn.moving_mean), features.mean(axis=(0, 1, 2)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(bn.moving_variance), features.var(axis=(0, 1, 2)), rtol=1e-3)


@keras.saving.register_keras_serializable(package="edgevit_tests")
def tiny_attention_model():
    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(16, 4, strides=4)(inputs)
    tokens = keras.layers.Reshape((64, 16))(x)
    q, k, v = (keras.layers.Dense(16)(tokens) for _ in range(3))
    x = keras.layers.GlobalAveragePooling1D()(HeadAttention(num_heads=1)([q, k, v]))
    return keras.Model(inputs, keras.layers.Dense(10)(x), name="tiny_convnet")


def test_int8_mixed_keeps_only_attention_matmuls_and_softmax_in_float(tmp_path):
    result, out = run_export(tmp_path, model=tiny_attention_model(), precision="int8_mixed",
                             recalibrate_batchnorm=False)
    summary = describe(out.read_bytes())
    float_ops = {op.name for op in summary.float_ops(allow_io_boundary=True)}
    assert float_ops <= {"BATCH_MATMUL", "SOFTMAX", "QUANTIZE", "DEQUANTIZE"}
    assert "BATCH_MATMUL" in float_ops
    assert {op.name for op in summary.ops if op.name == "FULLY_CONNECTED" and op.output_dtypes == ["int8"]}
    assert all(c.passed for c in result.checks)
    assert result.agreement["cosine_mean"] > 0.99


def test_full_int8_of_attention_is_all_integer(tmp_path):
    result, out = run_export(tmp_path, model=tiny_attention_model(), precision="int8",
                             recalibrate_batchnorm=False)
    assert describe(out.read_bytes()).float_ops() == []
    assert result.op_histogram["BATCH_MATMUL"] == 2


def test_verdict_of_a_file_that_agrees_says_where_it_deploys_and_what_next(tmp_path):
    result, out = run_export(tmp_path, precision="fp32", weights_label="trained.keras", gpu_images=0)
    verdict = result.verdict
    assert verdict.agreement == "good"
    assert verdict.deployable_on[0] == "CPU (XNNPACK)" and "GPU delegate (by its rules; not run here)" in \
        verdict.deployable_on and "NNAPI (Android API 33 rules)" in verdict.deployable_on
    assert verdict.text == "verdict: deploy on CPU, GPU, NNAPI; agreement good"
    assert verdict.why.startswith("deployable on CPU (XNNPACK), GPU delegate")
    assert f"`edgevit eval {out} --data DIR`" in verdict.next and "random" not in verdict.why + verdict.next
    assert json.loads(result.files.report.read_text())["verdict"] == verdict.to_dict()


def test_verdict_on_random_weights_says_low_agreement_is_expected_there(tmp_path):
    import dataclasses

    from edgevit.export.verdict import verdict

    result, _ = run_export(tmp_path, precision="int8", gpu_images=0)
    assert result.weights == "random-init" and "random weights" in result.verdict.why
    poor = {**result.agreement, "top1_agreement": 0.344, "cosine_mean": 0.90}
    random_init = verdict(dataclasses.replace(result, agreement=poor))
    assert random_init.agreement == "poor" and random_init.deployable_on[0] == "CPU (XNNPACK)"
    assert random_init.text == "verdict: deploy on CPU, GPU, NNAPI; agreement poor: random weights"
    assert "agreement poor (top-1 34.4%, logit cosine 0.9000 on 4 images), as expected with random weights" in \
        random_init.why and "--weights imagenet" in random_init.next
    # the same numbers from trained weights point at what to change instead
    breaking = {"layer": "blocks.3.attn", "threshold": 0.98, "hint": "try --int16x8"}
    trained = verdict(dataclasses.replace(result, agreement=poor, weights="model.keras",
                                          first_breaking_layer=breaking))
    assert "expected" not in trained.why and trained.why.endswith("first below cosine 0.98 at blocks.3.attn)")
    assert trained.next == "try --int16x8" and trained.text == "verdict: deploy on CPU, GPU, NNAPI; agreement poor"
    failed = verdict(dataclasses.replace(result, checks=[*result.checks, pipeline.Check("max tensor rank <= 4",
                                                                                         False, "max rank 6")]))
    assert failed.deployable_on == [] and failed.text == "verdict: not deployable (1 check failed); agreement good"
    assert failed.why.startswith("not deployable as it is: 1 check(s) failed (max tensor rank <= 4: max rank 6)")


def test_a_failed_run_on_one_place_rules_out_that_place_and_the_verdict_says_what_to_do(tmp_path):
    """A GPU (or Arm64) run that disagrees with XNNPACK rules out the GPU
    delegate, not the CPU the file was validated on, and the verdict says
    where to ship it instead; every verdict line fits 80 columns."""
    import dataclasses

    from edgevit.export.verdict import verdict

    result, _ = run_export(tmp_path, precision="int8", gpu_images=0, weights_label="trained.keras")
    gpu_failed = pipeline.Check("GPU accelerator: every op on the GPU, same answer as XNNPACK", False,
                                "every op on the GPU, mean cosine 0.96613 (floor 0.9741)", place="GPU")
    arm_failed = pipeline.Check("Arm64 kernels (emulated): same answer as x86 XNNPACK", False,
                                "mean cosine 0.5 (floor 0.995), a76 XNNPACK kernels", place="Arm64")
    judged = verdict(dataclasses.replace(result, checks=[*result.checks, gpu_failed]))
    assert judged.deployable_on == ["CPU (XNNPACK)", "NNAPI (Android API 33 rules)"]
    assert judged.text == "verdict: deploy on CPU, NNAPI (not GPU); agreement good"
    assert "GPU accelerator: every op on the GPU, same answer as XNNPACK failed (every op on the GPU, mean cosine " \
           "0.96613 (floor 0.9741))" in judged.why
    assert "ship it without the GPU delegate (CPU or NNAPI), or convert --fp16 for the GPU" in judged.next
    poor = {**result.agreement, "top1_agreement": 0.344, "cosine_mean": 0.90}
    lines = [verdict(dataclasses.replace(result, checks=[*result.checks, *failed], agreement=agreement,
                                         weights=weights)).text
             for failed in ([], [gpu_failed], [gpu_failed, arm_failed])
             for agreement in (result.agreement, poor) for weights in ("random-init", "trained.keras")]
    assert max(len(line) for line in lines) <= 80, lines


def test_logit_rows_that_are_both_zero_agree_and_a_zero_row_against_another_does_not():
    from edgevit.litert.agreement import agreement

    reference = np.array([[0.0, 0.0], [0.0, 0.0], [0.5, -0.2]])
    result = agreement(reference, np.array([[0.0, 0.0], [0.1, 0.0], [0.5, -0.2]]))
    assert result["cosine_min"] == 0.0 and result["cosine_mean"] == pytest.approx(2 / 3)
    assert agreement(reference, reference.copy())["cosine_min"] == pytest.approx(1.0)


def test_the_fp32_file_read_a_share_of_tensors_at_a_time_gives_the_cosines_of_one_share(monkeypatch):
    """The diagnosis reads the fp32 file's tensors in shares (its graph made
    to output each share: memory for a share, not for every tensor at once);
    one tensor a share or all in one, each layer gets the same cosines."""
    from edgevit.export import diagnose
    from edgevit.litert.flatbuffer import write_model

    model = tiny_model(norm=keras.layers.LayerNormalization())
    x = np.random.default_rng(0).normal(size=(2, SIZE, SIZE, 3)).astype(np.float32)
    fp32, int8 = convert(model, "fp32"), convert(model, "int8", x)
    built = []
    monkeypatch.setattr(diagnose, "write_model", lambda *args: built.append(1) or write_model(*args))
    runs = {}
    for share_bytes in (1, 10**9):
        monkeypatch.setattr(diagnose, "FLOAT_SHARE_BYTES", share_bytes)
        built.clear()
        runs[share_bytes] = diagnose.layerwise_comparison(fp32, int8, x)["layers"], len(built)
    (one_each, one_each_files), (together, together_files) = runs[1], runs[10**9]
    assert together_files == 2 and one_each_files >= 2 * len(together) > 2 * 4  # two images
    assert [row["tensor"] for row in one_each] == [row["tensor"] for row in together]
    for a, b in zip(one_each, together):
        assert a["cosine"] == pytest.approx(b["cosine"], abs=1e-6) and 0 < a["cosine"] <= 1 + 1e-9
