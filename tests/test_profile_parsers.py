"""benchmark_model output parsers on real-format text (both timing formats,
op-profiling tables read by their header row, CSV mode, delegate lines)."""
import pytest

from edgevit.profile.benchmark_binary import record_from_output
from edgevit.profile.benchmark_output import RunStats, parse

import profile_samples as S


def test_litert_cpu_run_with_percentiles_memory_and_op_profile():
    out = parse(S.CPU_RUN)
    assert (out.init_us, out.first_us, out.warmup_avg_us, out.inference_avg_us) == (52687, 19105, 14452.5, 14290.9)
    assert out.warmup.count == 35 and out.warmup.avg == 14452.5
    r = out.runs
    assert (r.count, r.first, r.curr, r.min, r.max, r.avg, r.std) == (70, 14941, 14066, 13728, 16145, 14290.9, 452)
    assert (r.p5, r.median, r.p95) == (13801, 14190, 15320)
    assert (out.memory_init_mb, out.memory_overall_mb, out.peak_memory_mb) == (6.21875, 13.1289, 21.4531)
    assert (out.delegate, out.delegated_nodes, out.total_nodes, out.partitions) == \
        ("TfLiteXNNPackDelegate", 150, 152, 3)
    assert out.errors == []
    order = out.table("Run Order")
    assert order.columns == ["node_type", "first_ms", "avg_ms", "percent", "cdf_percent", "mem_kb",
                             "times_called", "name"]
    assert [row["node_type"] for row in order.rows] == ["CONV_2D", "DEPTHWISE_CONV_2D", "BATCH_MATMUL",
                                                       "SOFTMAX", "FULLY_CONNECTED"]
    assert order.rows[2] == {"node_type": "BATCH_MATMUL", "first_ms": 0.9, "avg_ms": 0.85, "percent": 29.565,
                             "cdf_percent": 82.609, "mem_kb": 0.0, "times_called": 1,
                             "name": "[model/attn/qk]:2"}
    assert len(out.table("Top by Computation Time").rows) == 2
    summary = out.op_type_summary()
    assert summary[0] == {"node_type": "CONV_2D", "count": 1, "avg_ms": 1.15, "percent": 40.0}
    assert [s["node_type"] for s in summary][:2] == ["CONV_2D", "BATCH_MATMUL"]
    # The profiler's own "Timings (microseconds): count=..." must not replace the run stats.
    assert out.runs.count == 70


def test_tflite_gpu_run_without_percentiles():
    out = parse(S.GPU_RUN)
    assert out.inference_avg_us == 7512.6 and out.init_us == 812400
    assert out.runs.count == 130 and out.runs.p5 is None and out.runs.median is None
    assert (out.delegate, out.delegated_nodes, out.partitions) == ("TfLiteGpuDelegateV2", 148, 2)
    assert out.applied == {"GPU": {"delegate_kernels": 1, "fully_delegated": False}}
    assert out.peak_memory_mb is None and out.memory_overall_mb == 43.25


def test_refused_delegate_reports_errors_and_no_timings():
    out = parse(S.GPU_REFUSED)
    assert not out.has_timings
    assert "Failed to apply GPU delegate." in out.errors
    assert out.errors[-1] == "Benchmarking failed."


def test_nnapi_run_reports_delegated_share():
    out = parse(S.NNAPI_RUN)
    assert out.applied["NNAPI"]["delegate_kernels"] == 3
    assert (out.delegated_nodes, out.total_nodes) == (97, 152)
    assert out.runs.avg == 22004.1 and out.warmup.count == 12


def test_old_summary_format_and_profiler_summary_line_are_not_confused():
    out = parse(S.OLD_FORMAT)
    assert (out.warmup_avg_us, out.init_us, out.inference_avg_us) == (83235, 38467, 79760.9)
    assert out.first_us is None and out.runs is None


def test_op_profile_columns_are_read_by_header_not_position():
    out = parse(S.GPU_DELEGATE_PROFILE)
    rows = out.table("Run Order").rows
    assert rows[0]["node_type"] == "TfLiteGpuDelegateV2"
    assert rows[0]["start_ms"] == 0.0 and rows[0]["avg_ms"] == 7.1 and rows[0]["first_ms"] == 7.3
    assert rows[0]["percent"] == 95.0 and rows[1]["cdf_percent"] == 100.0 and rows[1]["percent"] == 5.0
    assert rows[1]["times_called"] == 1 and rows[1]["mem_kb"] == 0.0 and rows[1]["name"] == "[model/topk]:150"


def test_csv_op_profile_keeps_commas_in_names():
    table = parse(S.CSV_OP_PROFILE).table("Run Order")
    assert table.columns[:4] == ["node_type", "start_ms", "first_ms", "avg_ms"]
    assert table.rows[0]["name"] == "[model/stem/conv, with a comma]:0"
    assert table.rows[1]["avg_ms"] == 0.25 and table.rows[1]["percent"] == 8.7


def test_crash_output_keeps_what_was_printed():
    out = parse(S.CRASH_PARTIAL)
    assert not out.has_timings and out.init_us == pytest.approx(50100)


@pytest.mark.parametrize("line, expected", [
    ("count=1 curr=12345", dict(count=1, avg=12345, min=12345, std=0.0)),
    ("count=5 curr=900(all same)", dict(count=5, avg=900, max=900)),
    ("count=0", dict(count=0, avg=None)),
    ("count=3 first=10 curr=12 min=10 max=14 avg=12 std=1.63299 p5=10 median=12 p95=14",
     dict(count=3, median=12, std=1.63299)),
])
def test_run_stats_variants(line, expected):
    stats = RunStats.parse(line)
    for key, value in expected.items():
        assert getattr(stats, key) == value


def test_rows_from_outputs_classify_success_refusal_and_silent_cpu_fallback():
    ok = record_from_output(S.GPU_RUN, 0, "gpu")
    assert ok["status"] == "ok" and ok["avg_ms"] == 7.5126 and ok["delegate_kernels"] == 1
    assert ok["p50_ms"] is None and ok["init_ms"] == 812.4
    refused = record_from_output(S.GPU_REFUSED, 1, "gpu")
    assert refused["status"] == "refused" and refused["error"].endswith("Failed to apply GPU delegate.")
    cpu_only = record_from_output(S.NNAPI_UNAVAILABLE, 0, "nnapi")
    assert cpu_only["status"] == "not delegated" and cpu_only["avg_ms"] == 14.25
    assert "NNAPI acceleration is unsupported on this platform" in cpu_only["error"]
    assert record_from_output(S.NNAPI_RUN, 0, "nnapi")["status"] == "ok"
    crashed = record_from_output(S.CRASH_PARTIAL, -11, "cpu")
    assert crashed["status"] == "crashed" and "SIGSEGV" in crashed["error"]
    assert record_from_output("", 0, "cpu")["status"] == "failed"


def test_adb_device_listing_states_and_attributes():
    from edgevit.profile.adb import parse_devices

    text = S.ADB_DEVICES_TWO + "\n".join([
        "R58M12ABCDE            unauthorized usb:1-2 transport_id:3",
        "0123456789ABCDEF       no permissions (user in plugdev group; are your udev rules wrong?); "
        "see [http://developer.android.com/tools/device.html] usb:1-3 transport_id:5",
        "* daemon started successfully",
    ])
    devices = {d.serial: d for d in parse_devices(text)}
    assert devices["0A1B2C3D4E5F"].state == "device" and devices["0A1B2C3D4E5F"].attrs["model"] == "Pixel_7"
    assert devices["R58M12ABCDE"].state == "unauthorized"
    assert devices["0123456789ABCDEF"].state == "no permissions"
    assert "udev rule" in devices["0123456789ABCDEF"].problem()
    assert devices["0A1B2C3D4E5F"].problem() is None and len(devices) == 4


def test_getprop_and_thermal_parsing():
    from edgevit.profile.adb import parse_getprop, parse_thermal

    props = parse_getprop(S.GETPROP_PIXEL7)
    assert props["ro.soc.model"] == "GS201" and props["ro.build.version.sdk"] == "34"
    assert parse_thermal(S.THERMAL_PIXEL7) == {"status": "light", "max_temp_c": 41.5, "hottest_sensor": "BIG"}
    assert parse_thermal("Thermal Status: 3\n") == {"status": "severe"}
    assert parse_thermal("Can't find service: thermalservice") == {}
