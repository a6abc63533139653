"""`edgevit bench` on phones through a fake `adb` on PATH that records every
call and replays real-format output: two phones, device states, a missing
binary, a refused GPU delegate, a crash and a timeout."""
import importlib.util
import json
import os
import sys
import textwrap

import keras
import pytest
from click.testing import CliRunner

import profile_samples as S
from edgevit.cli import main
from edgevit.export.convert import convert

PIXEL, EMULATOR = "0A1B2C3D4E5F", "emulator-5554"

FAKE_ADB = textwrap.dedent("""\
    #!{python} -S
    import json, os, re, sys, time
    argv = sys.argv[1:]
    with open(os.environ["FAKE_ADB_LOG"], "a") as log:
        log.write(json.dumps(argv) + "\\n")
    line = " ".join(argv)
    with open(os.environ["FAKE_ADB_SCENARIO"]) as f:
        rules = json.load(f)
    for rule in rules:
        if re.search(rule["match"], line):
            time.sleep(rule.get("sleep", 0))
            sys.stdout.write(rule.get("stdout", ""))
            sys.stderr.write(rule.get("stderr", ""))
            sys.exit(rule.get("rc", 0))
    sys.stderr.write("fake adb: no rule for " + line + "\\n")
    sys.exit(1)
""")


def fake_elf(path, machine):
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    header[4], header[5] = 2, 1            # 64-bit, little endian
    header[18:20] = machine.to_bytes(2, "little")
    path.write_bytes(bytes(header))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(4, 3)(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(x)), name="tiny")
    folder = tmp_path_factory.mktemp("models")
    fp32, int8 = folder / "tiny_fp32.tflite", folder / "tiny_int8.tflite"
    fp32.write_bytes(convert(model, "fp32"))
    int8.write_bytes(convert(model, "int8", __import__("numpy").ones((2, 16, 16, 3), "float32")))
    return fp32, int8


class FakeAdb:
    def __init__(self, tmp_path, monkeypatch):
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        adb = self.bin / "adb"
        adb.write_text(FAKE_ADB.format(python=sys.executable))
        adb.chmod(0o755)
        self.log = tmp_path / "adb_calls.jsonl"
        self.scenario = tmp_path / "scenario.json"
        monkeypatch.setenv("PATH", f"{self.bin}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_ADB_LOG", str(self.log))
        monkeypatch.setenv("FAKE_ADB_SCENARIO", str(self.scenario))
        self.arm = fake_elf(tmp_path / "benchmark_model_aarch64", 0xB7)
        self.x86 = fake_elf(tmp_path / "benchmark_model_x86_64", 0x3E)

    def play(self, rules):
        self.scenario.write_text(json.dumps(rules))

    @property
    def calls(self):
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def shell_calls(self, serial=None):
        return [c[-1] for c in self.calls if "shell" in c and (serial is None or c[:2] == ["-s", serial])]


@pytest.fixture
def adb(tmp_path, monkeypatch):
    return FakeAdb(tmp_path, monkeypatch)


def device_rules(devices=S.ADB_DEVICES_TWO, run_rules=()):
    return [
        {"match": r"^devices -l$", "stdout": devices},
        {"match": rf"-s {PIXEL} shell getprop$", "stdout": S.GETPROP_PIXEL7},
        {"match": rf"-s {EMULATOR} shell getprop$", "stdout": S.GETPROP_EMULATOR},
        {"match": rf"-s {PIXEL} shell dumpsys thermalservice", "stdout": S.THERMAL_PIXEL7},
        {"match": r"shell dumpsys thermalservice", "stdout": "", "stderr": "Can't find service: thermalservice",
         "rc": 1},
        {"match": r" push ", "stdout": "1 file pushed, 0 skipped. 41.3 MB/s (24310 bytes in 0.001s)\n"},
        {"match": r"shell (mkdir|chmod|rm|pkill) ", "stdout": ""},
        *run_rules,
        {"match": r"benchmark_model.*--use_gpu=true", "stdout": S.GPU_RUN},
        {"match": r"benchmark_model.*--use_nnapi=true", "stdout": S.NNAPI_RUN},
        {"match": r"benchmark_model", "stdout": S.CPU_RUN},
    ]


def bench(*args):
    result = CliRunner().invoke(main, ["bench", *map(str, args)])
    return result.exit_code, result.stdout, result.stderr


def clean_error(code, stderr, *needles):
    assert code == 1, stderr
    assert "Traceback" not in stderr
    last = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert last, stderr
    for needle in needles:
        assert needle in stderr, (needle, stderr)


def test_two_phones_every_delegate_facts_push_run_and_cleanup(adb, models):
    adb.play(device_rules())
    code, out, err = bench(models[0], "--all-devices", "--no-host", "--delegate", "cpu,gpu,nnapi",
                           "--threads", "1,4", "--benchmark-binary", adb.arm, "--benchmark-binary", adb.x86,
                           "--nnapi-accelerator", "google-edgetpu", "--op-profiling", "--peak-memory", "--json")
    assert code == 0, err
    result = json.loads(out)
    facts = {d["serial"]: d for d in result["devices"]}
    pixel = facts[PIXEL]
    assert (pixel["model"], pixel["soc"], pixel["board"], pixel["android"], pixel["sdk"], pixel["abi"]) == \
        ("Google Pixel 7", "Google GS201", "gs201", "14", 34, "arm64-v8a")
    assert pixel["thermal"] == {"status": "light", "max_temp_c": 41.5, "hottest_sensor": "BIG"}
    assert pixel["thermal_after"] == pixel["thermal"]
    assert facts[EMULATOR]["abi"] == "x86_64" and facts[EMULATOR]["thermal"] == {"status": "unknown"}

    rows = [(r["target"], r["delegate"], r["threads"], r["status"]) for r in result["results"]]
    for serial in (PIXEL, EMULATOR):
        assert [(d, t, s) for target, d, t, s in rows if target == serial] == \
            [("cpu", 1, "ok"), ("cpu", 4, "ok"), ("gpu", None, "ok"), ("nnapi", None, "ok")]
    cpu = next(r for r in result["results"] if r["target"] == PIXEL and r["delegate"] == "cpu")
    assert cpu["avg_ms"] == pytest.approx(14.2909) and cpu["p50_ms"] == pytest.approx(14.19)
    assert cpu["init_ms"] == pytest.approx(52.687) and cpu["first_ms"] == pytest.approx(19.105)
    assert cpu["peak_mem_mb"] == pytest.approx(21.4531) and cpu["op_profile"][0]["node_type"] == "CONV_2D"
    gpu = next(r for r in result["results"] if r["target"] == PIXEL and r["delegate"] == "gpu")
    assert (gpu["delegated_nodes"], gpu["total_nodes"], gpu["delegate_kernels"]) == (148, 152, 1)
    assert gpu["expected_fallback_ops"] == 0 and "expected_fallback_ops" not in cpu

    # Each phone got its own ABI's binary, the model, runs with the right flags, and a clean-up.
    pushes = [c for c in adb.calls if "push" in c]
    assert any(c[:2] == ["-s", PIXEL] and c[3].endswith("benchmark_model_aarch64") for c in pushes)
    assert any(c[:2] == ["-s", EMULATOR] and c[3].endswith("benchmark_model_x86_64") for c in pushes)
    runs = [c for c in adb.shell_calls(PIXEL) if "benchmark_model --graph=" in c]
    assert len(runs) == 4
    assert all(c.startswith("/data/local/tmp/edgevit-") for c in runs)
    assert all("--enable_op_profiling=true" in c and "--report_peak_memory_footprint=true" in c for c in runs)
    assert "--num_threads=4" in runs[1] and "--use_gpu=true" in runs[2]
    assert "--use_nnapi=true --nnapi_accelerator_name=google-edgetpu" in runs[3]
    folder = runs[0].split("/benchmark_model")[0]
    assert adb.shell_calls(PIXEL)[-2:] == [f"rm -rf {folder}", "dumpsys thermalservice"]
    assert adb.shell_calls(PIXEL)[0] == "getprop"


def test_table_shows_devices_and_rows(adb, models):
    adb.play(device_rules(devices=S.ADB_DEVICES_TWO))
    code, out, err = bench(models[0], "--device", PIXEL, "--no-host", "--delegate", "cpu,gpu", "--threads", "2",
                           "--benchmark-binary", adb.arm)
    assert code == 0, err
    assert "Google Pixel 7, SoC Google GS201" in out and "Android 14 (API 34), arm64-v8a" in out
    assert "thermal light, 41.5 C BIG -> light, 41.5 C BIG after the runs" in " ".join(out.split())
    assert "148/152 ops" in out and "14.29" in out
    assert not [c for c in adb.calls if c[:2] == ["-s", EMULATOR]]


@pytest.mark.parametrize("devices, needles", [
    (S.ADB_DEVICES_UNAUTHORIZED, ["R58M12ABCDE is unauthorized", "Allow USB debugging"]),
    (S.ADB_DEVICES_OFFLINE, ["192.168.1.50:5555 is offline", "replug"]),
    (S.ADB_DEVICES_NONE, ["No Android device attached"]),
])
def test_device_states_give_one_clear_message(adb, models, devices, needles):
    adb.play(device_rules(devices=devices))
    code, out, err = bench(models[0], "--all-devices", "--benchmark-binary", adb.arm)
    clean_error(code, err, *needles)
    assert adb.calls == [["devices", "-l"]]  # nothing pushed, host runs not started


def test_unknown_serial_and_mixed_states(adb, models):
    adb.play(device_rules(devices=S.ADB_DEVICES_TWO))
    code, _, err = bench(models[0], "--device", "XYZ", "--benchmark-binary", adb.arm)
    clean_error(code, err, "Device XYZ is not attached", f"{PIXEL} (device)")
    adb.play(device_rules(devices=S.ADB_DEVICES_TWO.replace("emulator-5554          device",
                                                            "emulator-5554          unauthorized")))
    code, out, err = bench(models[0], "--all-devices", "--no-host", "--threads", "1", "--benchmark-binary", adb.arm)
    assert code == 0 and "skipping: Device emulator-5554 is unauthorized" in " ".join(err.split())
    assert {c[1] for c in adb.calls if c[0] == "-s"} == {PIXEL}


def test_no_adb_on_path(tmp_path, monkeypatch, models):
    monkeypatch.setenv("PATH", str(tmp_path))
    code, _, err = bench(models[0], "--device", PIXEL, "--benchmark-binary", fake_elf(tmp_path / "bm", 0xB7))
    clean_error(code, err, "adb is not on PATH", "apt install adb")


def test_missing_or_foreign_binary(adb, models, tmp_path):
    adb.play(device_rules())
    code, _, err = bench(models[0], "--device", PIXEL, "--benchmark-binary", tmp_path / "nope")
    clean_error(code, err, "does not exist")
    code, _, err = bench(models[0], "--device", PIXEL, "--no-host", "--benchmark-binary", adb.x86)
    clean_error(code, err, "no benchmark binary for 0A1B2C3D4E5F", "arm64-v8a", "x86_64")
    code, _, err = bench(models[0], "--device", PIXEL)
    clean_error(code, err, "needs --benchmark-binary")


def test_binary_missing_on_the_phone(adb, models):
    adb.play(device_rules(run_rules=[{"match": r"benchmark_model --graph", "rc": 127,
                                      "stdout": "/system/bin/sh: /data/local/tmp/edgevit-1/benchmark_model: "
                                                "inaccessible or not found\n"}]))
    code, out, err = bench(models[0], "--device", PIXEL, "--no-host", "--threads", "1", "--benchmark-binary",
                           adb.arm, "--json")
    clean_error(code, err, "benchmark_model was not found on the target", "inaccessible or not found")
    assert json.loads(out)["results"][0]["status"] == "missing"
    assert adb.shell_calls(PIXEL)[-2].startswith("rm -rf /data/local/tmp/edgevit-")


def test_gpu_delegate_refused_is_a_row_not_a_failure(adb, models):
    adb.play(device_rules(run_rules=[{"match": r"--use_gpu=true", "stdout": S.GPU_REFUSED, "rc": 1}]))
    code, out, err = bench(models[0], "--device", PIXEL, "--no-host", "--delegate", "cpu,gpu", "--threads", "1",
                           "--benchmark-binary", adb.arm, "--json")
    assert code == 0, err
    rows = {r["delegate"]: r for r in json.loads(out)["results"]}
    assert rows["cpu"]["status"] == "ok"
    assert rows["gpu"]["status"] == "refused" and "Failed to apply GPU delegate." in rows["gpu"]["error"]


def test_crash_keeps_partial_output_and_cleans_up(adb, models):
    adb.play(device_rules(run_rules=[{"match": r"--num_threads=4", "stdout": S.CRASH_PARTIAL, "rc": 139}]))
    code, out, err = bench(models[0], "--device", PIXEL, "--no-host", "--threads", "1,4", "--benchmark-binary",
                           adb.arm, "--json")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["ok", "crashed"]
    assert "SIGSEGV" in rows[1]["error"] and "Segmentation fault" in rows[1]["error"]
    assert rows[1]["init_ms"] == pytest.approx(50.1)
    assert adb.shell_calls(PIXEL)[-2].startswith("rm -rf ")


def test_timeout_kills_our_process_and_cleans_up(adb, models):
    adb.play(device_rules(run_rules=[{"match": r"benchmark_model --graph", "sleep": 5, "stdout": S.CPU_RUN}]))
    code, out, err = bench(models[0], "--device", PIXEL, "--no-host", "--threads", "1", "--timeout", "1",
                           "--benchmark-binary", adb.arm, "--json")
    clean_error(code, err, "no result within 1 s")
    assert json.loads(out)["results"][0]["status"] == "timeout"
    shell = adb.shell_calls(PIXEL)
    folder = next(c for c in shell if "benchmark_model --graph" in c).split("/benchmark_model")[0]
    assert f"pkill -f {folder}/benchmark_model" in shell and shell[-2] == f"rm -rf {folder}"


def test_precision_sweep_one_table_csv_and_plot(adb, models, tmp_path):
    adb.play(device_rules())
    csv_path, png = tmp_path / "sweep.csv", tmp_path / "sweep.png"
    evals = tmp_path / "eval.json"
    evals.write_text(json.dumps({"tiny_fp32.tflite": {"top1": 0.70}, "tiny_int8.tflite": {"top1": 0.69}}))
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    plot_args = ["--plot", png, "--eval", evals] if has_matplotlib else []
    code, out, err = bench("--models", *models, "--device", PIXEL, "--threads", "1", "--host-kernels", "xnnpack",
                           "--runs", "5", "--warmup", "1", "--benchmark-binary", adb.arm, "--csv", csv_path,
                           *plot_args)
    assert code == 0, err
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("model,file,precision,target,device,runtime,delegate,threads,status")
    rows = lines[1:]
    assert len(rows) == 4  # 2 models x (host xnnpack x1, phone cpu x1)
    assert {r.split(",")[2] for r in rows} == {"fp32", "int8"}
    if has_matplotlib:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "int8" in out and "fp32" in out and "Google Pixel 7" in out


def test_a_phone_without_timings_fails_the_command_even_when_the_host_ran(adb, models):
    adb.play(device_rules(run_rules=[{"match": r"benchmark_model --graph", "rc": 127,
                                      "stdout": "/system/bin/sh: benchmark_model: not found\n"}]))
    code, out, err = bench(models[0], "--device", PIXEL, "--threads", "1", "--host-kernels", "xnnpack",
                           "--runs", "3", "--benchmark-binary", adb.arm)
    clean_error(code, err, f"No configuration produced timings on {PIXEL}", "not found")
    assert "xnnpack x1" in out  # the table (with the host row) is still printed


def test_a_hot_phone_gets_a_warning(adb, models):
    hot = S.THERMAL_PIXEL7.replace("Thermal Status: 1", "Thermal Status: 3")
    rules = [{"match": rf"-s {PIXEL} shell dumpsys thermalservice", "stdout": hot}] + device_rules()
    adb.play(rules)
    code, out, err = bench(models[0], "--device", PIXEL, "--no-host", "--threads", "1", "--benchmark-binary",
                           adb.arm)
    assert code == 0, err
    assert "is already severe, 41.5 C BIG: it may throttle" in " ".join(err.split())


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, tmp_path):
    from edgevit.errors import EdgevitError
    from edgevit.profile.report import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(EdgevitError, match="--plot needs matplotlib"):
        plot({"results": [{"status": "ok", "p50_ms": 1.0, "target": "host"}]}, tmp_path / "x.png")
