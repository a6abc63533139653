"""Host latency: child-process LiteRT benchmark on a tiny model gives sane
percentiles, init/first-inference times and memory for each kernel set."""
import keras
import numpy as np
import pytest

from edgevit.export.convert import convert
from edgevit.profile.host import host_description, percentiles, run_config


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory):
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x), name="tiny")
    path = tmp_path_factory.mktemp("bench") / "tiny_fp32.tflite"
    path.write_bytes(convert(model, "fp32"))
    return path


CONFIGS = [("xnnpack", 1), ("xnnpack", 2), ("reference", 1)]


@pytest.fixture(scope="module")
def results(tiny_model_path):
    return {cfg: run_config(tiny_model_path, cfg[1], cfg[0], warmup=3, runs=30) for cfg in CONFIGS}


@pytest.mark.parametrize("kernels, threads", CONFIGS)
def test_host_benchmark_reports_sane_numbers(results, kernels, threads):
    r = results[(kernels, threads)]
    assert r["status"] == "ok", r
    assert (r["target"], r["delegate"], r["threads"], r["runs"]) == ("host", kernels, threads, 30)
    assert 0 < r["min_ms"] <= r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] <= r["max_ms"] < 1000
    assert r["min_ms"] <= r["avg_ms"] <= r["max_ms"] and r["std_ms"] >= 0
    assert r["init_ms"] > 0 and r["first_ms"] > 0 and r["warmup_avg_ms"] > 0
    # The child's own peak (not the pytest parent's, which holds TensorFlow).
    assert 10 < r["peak_mem_mb"] < 300 and 0 < r["mem_delta_mb"] < r["peak_mem_mb"]


def test_reference_kernels_are_slower_than_xnnpack(results):
    # min: robust to other load on the machine
    assert results[("reference", 1)]["min_ms"] > results[("xnnpack", 1)]["min_ms"]


def test_a_file_the_interpreter_rejects_is_a_failed_row_not_a_crash(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a flatbuffer" * 10)
    r = run_config(bad, 1, "xnnpack", runs=3)
    assert r["status"] == "crashed" and "exit status 1" in r["error"]


def test_percentiles_match_numpy():
    times = list(np.arange(1, 101, dtype=float))
    p = percentiles(times)
    assert (p["p50_ms"], p["min_ms"], p["max_ms"]) == (50.5, 1.0, 100.0)
    assert p["p90_ms"] == pytest.approx(90.1) and p["p99_ms"] == pytest.approx(99.01)


@pytest.mark.parametrize("cpuinfo,expected", [
    ("model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma\n", "AMD EPYC, 2 cores, int8 dot product: none"),
    ("model name\t: Xeon\nflags\t\t: avx2 avx512f avx512_vnni\nmodel name\t: Xeon\n",
     "Xeon, 2 cores, int8 dot product: avx512_vnni"),
    ("processor\t: 0\nFeatures\t: fp asimd asimddp i8mm\n", "int8 dot product: asimddp, i8mm"),
])
def test_host_description_names_the_int8_dot_product_instructions(monkeypatch, cpuinfo, expected):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert expected in host_description(cpuinfo) and not host_description(cpuinfo).startswith("host")


def test_a_mean_far_from_the_median_is_explained():
    from edgevit.profile.report import skew_note

    assert skew_note({"avg_ms": 10.2, "p50_ms": 10.0}) is None
    assert skew_note({"avg_ms": 8.0, "p50_ms": 10.0, "min_ms": 2.0, "max_ms": 11.0}) == (
        "mean 8.00 ms against a median of 10.00 ms: a few runs were much faster than the rest (min 2.00, max "
        "11.00 ms); the median is the figure to compare")
