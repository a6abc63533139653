"""The `edgevit` command line: results and every user error it must catch."""
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from edgevit.cli import main

SMALL = ["mobilevit_v3_xxs", "--input-size", "64"]


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def assert_clean_error(code, stderr, match):
    assert code == 1
    assert stderr.startswith("error: ") and match in stderr
    assert "Traceback" not in stderr and stderr.count("\n") == 1


def test_list_shows_every_mobilevit_variant():
    code, out, _ = run("list", "mobilevit*", "--json")
    names = [m["name"] for m in json.loads(out)]
    assert code == 0 and len(names) == 19
    assert {"mobilevit_v1_xxs", "mobilevit_v2_200", "mobilevit_v3_xs", "mobilevit_v3_s_l2"} <= set(names)


def test_info_reports_parameters_macs_and_preprocessing():
    code, out, _ = run("info", "mobilevit_v3_xxs", "--json")
    info = json.loads(out)
    assert code == 0
    assert info["parameters"] == 1_249_448
    assert info["input_size"] == 256 and info["preprocessing"]["value_range"] == [0.0, 1.0]
    assert 250e6 < info["macs"] < 350e6
    assert info["pretrained"]["tag"] == "mobilevitv3_XXS_e300_7098" and info["pretrained"]["top1"] == 70.98
    assert info["pretrained"]["licence"].startswith("non-commercial only")


def test_info_prints_counts_as_numbers_read():
    code, out, _ = run("info", "mobilevit_v3_xs")
    assert code == 0 and "2,490,360" in out and "966.6 M" in out
    code, out, _ = run("info", "vit_base16")
    assert code == 0 and "86,567,656" in out and "17.56 G" in out
    code, out, _ = run("info", "vit_large16")  # too large to convert for the catalog: it says how to count
    assert code == 0 and "304,326,632" in out and "not recorded" in out
    assert json.loads(run("info", "vit_large16", "--json")[1])["macs"] is None


def test_info_at_another_size_counts_the_model_built_at_it():
    code, out, _ = run("info", "mobilevit_v3_xxs", "--input-size", "64", "--json")
    info = json.loads(out)
    assert code == 0 and info["input_size"] == 64 and info["parameters"] == 1_249_448
    assert 10e6 < info["macs"] < 30e6  # about 1/16 of 256 px's


def test_unknown_model_suggests_close_names():
    code, _, err = run("convert", "mobilevit_v3_xxx")
    assert_clean_error(code, err, "Unknown model 'mobilevit_v3_xxx'. Did you mean: mobilevit_v3_xxs")


@pytest.mark.parametrize("size", ["100", "0"])
def test_input_size_off_the_patch_grid(size):
    code, _, err = run("convert", "mobilevit_v3_xxs", "--input-size", size)
    assert_clean_error(code, err, "must be a positive multiple of 32")


def test_weights_errors(tmp_path):
    code, _, err = run("convert", *SMALL, "--weights", str(tmp_path / "none.weights.h5"))
    assert_clean_error(code, err, "does not exist")
    corrupt = tmp_path / "bad.weights.h5"
    corrupt.write_bytes(b"garbage" * 10)
    code, _, err = run("convert", *SMALL, "--weights", str(corrupt))
    assert_clean_error(code, err, "corrupt or not HDF5")
    other = tmp_path / "other.weights.h5"
    from edgevit import create_model

    create_model("mobilevit_v1_xxs", num_classes=10, input_size=64).save_weights(other)
    code, _, err = run("convert", *SMALL, "--weights", str(other))
    assert_clean_error(code, err, "do not fit mobilevit_v3_xxs")
    assert list(tmp_path.glob("*.tflite")) == []


def test_output_and_calibration_errors(tmp_path):
    code, _, err = run("convert", *SMALL, "-o", str(tmp_path / "missing" / "m.tflite"))
    assert_clean_error(code, err, "does not exist")
    (tmp_path / "empty").mkdir()
    code, _, err = run("convert", *SMALL, "--calib", str(tmp_path / "empty"), "-o", str(tmp_path / "m.tflite"))
    assert_clean_error(code, err, "contains no images")
    assert not (tmp_path / "m.tflite").exists()


def test_not_an_edgevit_keras_file(tmp_path):
    import keras

    inputs = keras.Input((32, 32, 3))
    path = tmp_path / "foreign.keras"
    keras.Model(inputs, keras.layers.Dense(2)(inputs), name="foreign").save(path)
    code, _, err = run("convert", str(path))
    assert_clean_error(code, err, "is not an edgevit model")


def test_convert_int8_end_to_end_json(tmp_path):
    out = tmp_path / "xxs_int8.tflite"
    proc = subprocess.run([sys.executable, "-m", "edgevit", "convert", "--int8", *SMALL,
                           "--num-classes", "10", "--calib-samples", "8", "-o", str(out), "--json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    # the camera's bytes in, probabilities out (what the standard clients load)
    assert report["precision"] == "int8" and report["io"]["input"]["dtype"] == "uint8"
    assert report["outputs"] == "probabilities" and report["io"]["output"]["quantization"]["scale"] == 1 / 256
    assert all(c["passed"] for c in report["checks"]), report["checks"]
    assert report["max_rank"] <= 4
    assert report["agreement"]["cosine_mean"] > 0.85  # random-init weights: see test_mobilevit
    # random weights at 64 px agree below 0.98: the report names where int8 breaks first
    broken = report["first_breaking_layer"]
    assert min(broken["cosine"], broken["worst_token_cosine"]) < 0.98
    assert broken["layer"] and "--int16x8" in broken["hint"]
    for path in report["files"].values():
        assert (tmp_path / path.split("/")[-1]).exists()
    assert "Validating" not in proc.stderr  # standard error keeps to warnings and errors under --json
    # random weights: the report says how to get real ones
    assert report["weights"] == "random-init"
    assert "`edgevit convert --int8 mobilevit_v3_xxs --weights imagenet` (mobilevitv3_XXS_e300_7098" \
        in report["weights_hint"]
    # the verdict: where the file deploys, and that random weights explain its low agreement
    verdict = report["verdict"]
    assert "CPU (XNNPACK)" in verdict["deployable_on"] and verdict["agreement"] != "good"
    assert "as expected with random weights" in verdict["why"] and verdict["text"].endswith(": random weights")
    # the phone's Arm64 CPU kernels (emulated) where installed; else how to install them
    arm64 = report["arm64"]
    assert (arm64["ran"] and arm64["agrees"]) or (not arm64["ran"] and "install-arm-emulator.sh" in arm64["reason"])


def test_convert_keras_file_round_trip(tmp_path):
    from edgevit import create_model

    keras_path = tmp_path / "m.keras"
    create_model("mobilevit_v3_xxs", num_classes=3, input_size=64).save(keras_path)
    code, out, err = run("convert", "--fp32", str(keras_path), "-o", str(tmp_path / "m.tflite"), "--json",
                         "--no-arm-run")
    assert code == 0, err
    report = json.loads(out)
    assert report["model"] == "mobilevit_v3_xxs" and report["io"]["output"]["shape"] == [1, 3]
    assert report["agreement"]["max_abs_logit_error"] < 1e-3
