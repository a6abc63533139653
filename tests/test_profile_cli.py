"""`edgevit check` / `edgevit bench` through the CLI: results, exit codes and
one-line errors; the delegate summary in `edgevit convert` reports."""
import io
import json
import sys
import textwrap

import keras
import pytest
from click.testing import CliRunner

import profile_samples as S
from edgevit.cli import main
from edgevit.export.convert import convert
from edgevit.export.report import print_report


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def assert_clean_error(code, stderr, match):
    assert code == 1, stderr
    assert stderr.startswith("error: ") and match in stderr, stderr
    assert "Traceback" not in stderr


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    inputs = keras.Input((8, 8, 4))
    x = keras.layers.Conv2D(4, 1)(inputs)
    x = keras.layers.Reshape((4, 2, 4, 2, 4))(x)
    x = keras.layers.Permute((1, 3, 2, 4, 5))(x)
    x = keras.layers.Reshape((8, 8, 4))(x)
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 1)(x))
    rank6 = folder / "rank6_fp32.tflite"
    rank6.write_bytes(convert(keras.Model(inputs, x, name="rank6"), "fp32"))
    plain_in = keras.Input((16, 16, 3))
    y = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(8, 3, activation="relu")(plain_in))
    plain = folder / "plain_fp32.tflite"
    plain.write_bytes(convert(keras.Model(plain_in, keras.layers.Dense(4)(y), name="plain"), "fp32"))
    return {"rank6": rank6, "plain": plain, "folder": folder}


def test_check_lists_fallbacks_and_partitions(files):
    code, out, _ = run("check", files["rank6"], "--no-gpu-run")
    assert code == 0
    assert "GPU delegate - rank6_fp32.tflite: 3 of 6 ops fall back to the CPU" in out
    assert "TRANSPOSE" in out and "6-D tensor" in out and "2 delegate partitions" in out
    assert "NNAPI delegate (Android API 33)" in out


def test_check_json_gpu_only_and_fail_on_fallback(files):
    code, out, _ = run("check", files["rank6"], "--gpu", "--json", "--no-gpu-run")
    data = json.loads(out)
    assert code == 0 and set(data) == {"model", "metadata", "gpu"}
    assert data["gpu"]["fallback_ops"] == 3 and data["gpu"]["partitions"] == 2
    assert {g["op"] for g in data["gpu"]["fallback_summary"]} == {"RESHAPE", "TRANSPOSE"}
    assert run("check", files["rank6"], "--fail-on-fallback", "--no-gpu-run")[0] == 2
    code, out, _ = run("check", files["plain"], "--fail-on-fallback", "--no-gpu-run")
    assert code == 0 and "all ops delegated" in out


def test_check_errors(files, tmp_path):
    assert_clean_error(*run("check", tmp_path / "missing.tflite")[::2], "does not exist")
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"\x00" * 64)
    assert_clean_error(*run("check", junk)[::2], "Not a readable .tflite file")


def test_bench_on_this_machine(files):
    code, out, err = run("bench", files["plain"], "--threads", "1", "--runs", "5", "--warmup", "1", "--json")
    assert code == 0, err
    data = json.loads(out)
    rows = data["results"]
    assert [(r["delegate"], r["threads"], r["status"]) for r in rows] == [("xnnpack", 1, "ok"), ("reference", 1, "ok")]
    assert all(r["precision"] == "fp32" and r["runs"] == 5 and r["p50_ms"] > 0 for r in rows)
    assert data["host"]["target"] == "host" and data["devices"] == []
    assert "host: plain_fp32.tflite xnnpack x1" in err  # progress on stderr, JSON clean on stdout


def test_bench_of_several_precisions_gives_each_its_ratio_to_the_fp32_file():
    from edgevit.profile.report import table_rows

    def row(precision, delegate, threads, p50, model="m"):
        return {"model": model, "precision": precision, "target": "host", "runtime": "litert", "delegate": delegate,
                "threads": threads, "status": "ok", "p50_ms": p50}

    result = {"results": [row("fp32", "xnnpack", 1, 20.0), row("int8", "xnnpack", 1, 12.6),
                          row("fp32", "xnnpack", 2, 10.0), row("int8", "xnnpack", 2, 8.9),
                          row("int8", "reference", 1, 300.0), row("int8", "xnnpack", 1, 5.0, model="other")]}
    columns, rows = table_rows(result)
    ratios = [r[columns.index("vs fp32")] for r in rows]
    assert ratios == ["1.00", "0.63", "1.00", "0.89", "-", "-"]  # same model, kernels and threads only
    columns, _ = table_rows({"results": result["results"][:1]})
    assert "vs fp32" not in columns  # one file: nothing to compare


def test_bench_runs_a_host_benchmark_binary_with_op_profiling(files, tmp_path):
    calls = tmp_path / "calls.txt"
    script = tmp_path / "benchmark_model"
    sample = tmp_path / "sample.txt"
    sample.write_text(S.CPU_RUN)
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable} -S
        import sys
        open({str(calls)!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
        sys.stdout.write(open({str(sample)!r}).read())
    """))
    script.chmod(0o755)
    code, out, err = run("bench", files["plain"], "--threads", "2", "--host-kernels", "xnnpack", "--runs", "3",
                         "--benchmark-binary", script, "--json")
    assert code == 0, err
    rows = json.loads(out)["results"]
    binary_row = next(r for r in rows if r["runtime"] == "benchmark_model")
    assert binary_row["status"] == "ok" and binary_row["avg_ms"] == pytest.approx(14.2909)
    assert binary_row["op_profile"][1]["node_type"] == "BATCH_MATMUL"
    argv = calls.read_text().split()
    assert f"--graph={files['plain']}" in argv and "--num_threads=2" in argv
    assert "--enable_op_profiling=true" in argv and "--num_runs=3" in argv


@pytest.mark.parametrize("args, match", [
    (["--delegate", "gpu"], "needs a phone"),
    (["--delegate", "tpu"], "Unknown delegate tpu"),
    (["--threads", "0"], "whole numbers from 1 to 64"),
    (["--threads", "two"], "whole numbers from 1 to 64"),
    (["--threads", "1000"], "whole numbers from 1 to 64"),
    (["--host-kernels", "cuda"], "Unknown host-kernels cuda"),
    (["--device", "A", "--all-devices"], "either --device SERIAL or --all-devices"),
    (["--no-host"], "leaves nothing to measure"),
    (["--plot", "out.jpg"], "ending in .png"),
    (["--csv", "/nonexistent-dir/x.csv"], "does not exist"),
    (["--eval", "/nonexistent/eval.json"], "does not exist"),
])
def test_bench_user_errors(files, args, match):
    assert_clean_error(*run("bench", files["plain"], *args)[::2], match)


def test_bench_missing_model_and_folder(files, tmp_path):
    assert_clean_error(*run("bench", tmp_path / "nope.tflite")[::2], "does not exist")
    assert_clean_error(*run("bench", files["folder"])[::2], "is a folder")


def test_convert_report_includes_delegate_compatibility(tmp_path):
    from test_export import run_export

    result, _ = run_export(tmp_path, precision="fp32")
    gpu, nnapi = result.delegates["gpu"], result.delegates["nnapi"]
    assert gpu["fallback_ops"] == 0 and gpu["partitions"] == 1 and gpu["ops"] == result.ops
    assert nnapi["android_api"] == 33
    stream = io.StringIO()
    print_report(result, stream=stream)
    text = stream.getvalue()
    assert f"all {result.ops} ops delegated, 1 partition" in text and "NNAPI delegate (Android API 33)" in text


def test_eval_results_in_every_accepted_form(tmp_path):
    from edgevit.profile.report import load_eval

    single = tmp_path / "int8.json"   # what `edgevit eval m_int8.tflite --json` prints
    single.write_text(json.dumps({"model": "m", "file": "out/m_int8.tflite", "top1": 0.705, "top5": 0.9}))
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"m_fp32.tflite": 0.71, "m_fp16.tflite": {"top1": 71.0}}))
    assert load_eval([single, mapping]) == {"m_int8.tflite": 70.5, "m_fp32.tflite": 71.0, "m_fp16.tflite": 71.0}
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(Exception, match="No accuracy values"):
        load_eval(empty)


def test_bench_refuses_two_models_with_the_same_file_name(files, tmp_path):
    other = tmp_path / "plain_fp32.tflite"
    other.write_bytes(files["plain"].read_bytes())
    assert_clean_error(*run("bench", "--models", files["plain"], other)[::2], "Two models are named plain_fp32")
