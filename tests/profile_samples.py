"""Real-format text samples for the profiling tests: what `benchmark_model`,
`adb devices -l`, `getprop` and `dumpsys thermalservice` print.

The benchmark lines follow tflite/tools/benchmark/benchmark_model.cc and
benchmark_tflite_model.cc, the tables tensorflow/core/util/stats_calculator.cc
(LiteRT @ f6745779, 2026-08); numbers are made up but consistent."""

T = "\t"


def _row(*cells):
    return T + T.join(str(c) for c in cells)


RUN_ORDER_HEADER = _row("             [node type]", "  [first]", " [avg ms]", "     [%]", "  [cdf%]",
                        "  [mem KB]", "[times called]", "[Name]")
# An older build that also prints [start], with the columns in another order.
RUN_ORDER_HEADER_WITH_START = _row("             [node type]", "  [start]", " [avg ms]", "  [first]",
                                   "  [cdf%]", "     [%]", "[times called]", "  [mem KB]", "[Name]")

CPU_OP_PROFILE = "\n".join([
    "INFO: Operator-wise Profiling Info for Regular Benchmark Runs:",
    "============================== Run Order ==============================",
    RUN_ORDER_HEADER,
    _row("                 CONV_2D", "    1.210", "    1.150", " 40.000%", " 40.000%", "     0.000", "        1",
         "[model/stem/conv]:0"),
    _row("       DEPTHWISE_CONV_2D", "    0.400", "    0.375", " 13.043%", " 53.043%", "     0.000", "        1",
         "[model/block1/dw]:1"),
    _row("           BATCH_MATMUL", "    0.900", "    0.850", " 29.565%", " 82.609%", "     0.000", "        1",
         "[model/attn/qk]:2"),
    _row("                 SOFTMAX", "    0.300", "    0.250", "  8.696%", " 91.304%", "     0.000", "        1",
         "[model/attn/softmax]:3"),
    _row("         FULLY_CONNECTED", "    0.260", "    0.250", "  8.696%", "100.000%", "     0.000", "        1",
         "[model/head]:4"),
    "",
    "============================== Top by Computation Time ==============================",
    RUN_ORDER_HEADER,
    _row("                 CONV_2D", "    1.210", "    1.150", " 40.000%", " 40.000%", "     0.000", "        1",
         "[model/stem/conv]:0"),
    _row("           BATCH_MATMUL", "    0.900", "    0.850", " 29.565%", " 69.565%", "     0.000", "        1",
         "[model/attn/qk]:2"),
    "",
    "Number of nodes executed: 5",
    "============================== Summary by node type ==============================",
    _row("             [Node type]", "  [count]", "  [avg ms]", "    [avg %]", "    [cdf %]", "  [mem KB]",
         "[times called]"),
    _row("                 CONV_2D", "        1", "     1.150", "    40.000%", "    40.000%", "     0.000",
         "        1"),
    _row("           BATCH_MATMUL", "        1", "     0.850", "    29.565%", "    69.565%", "     0.000",
         "        1"),
    _row("       DEPTHWISE_CONV_2D", "        1", "     0.375", "    13.043%", "    82.608%", "     0.000",
         "        1"),
    _row("                 SOFTMAX", "        1", "     0.250", "     8.696%", "    91.304%", "     0.000",
         "        1"),
    _row("         FULLY_CONNECTED", "        1", "     0.250", "     8.696%", "   100.000%", "     0.000",
         "        1"),
    "",
    "Timings (microseconds): count=70 first=2900 curr=2870 min=2800 max=3100 avg=2875 std=40",
    "Memory (bytes): count=0",
    "5 nodes observed",
    "",
])

CPU_RUN = "\n".join([
    "INFO: STARTING!",
    "INFO: Log parameter values verbosely: [0]",
    "INFO: Min num runs: [50]",
    "INFO: Num threads: [4]",
    "INFO: Graph: [/data/local/tmp/edgevit-1234/model.tflite]",
    "INFO: Enable op profiling: [1]",
    "INFO: #threads used for CPU inference: [4]",
    "INFO: Loaded model /data/local/tmp/edgevit-1234/model.tflite",
    "INFO: Initialized TensorFlow Lite runtime.",
    "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",
    "VERBOSE: Replacing 150 out of 152 node(s) with delegate (TfLiteXNNPackDelegate) node, "
    "yielding 3 partitions for subgraph 0 (main).",
    "INFO: The input model file size (MB): 1.53",
    "INFO: Initialized session in 52.687ms.",
    "INFO: Running benchmark for at least 1 iterations and at least 0.5 seconds but terminate if "
    "exceeding 150 seconds.",
    "INFO: count=35 first=19105 curr=14102 min=13950 max=19105 avg=14452.5 std=874 p5=13960 median=14211 "
    "p95=16012",
    "",
    "INFO: Running benchmark for at least 50 iterations and at least 1 seconds but terminate if exceeding "
    "150 seconds.",
    "INFO: count=70 first=14941 curr=14066 min=13728 max=16145 avg=14290.9 std=452 p5=13801 median=14190 "
    "p95=15320",
    "",
    CPU_OP_PROFILE,
    "INFO: Inference timings in us: Init: 52687, First inference: 19105, Warmup (avg): 14452.5, "
    "Inference (avg): 14290.9",
    "INFO: Note: as the benchmark tool itself affects memory footprint, the following is only APPROXIMATE "
    "to the actual memory footprint of the model at runtime. Take the information at your discretion.",
    "INFO: Memory footprint delta from the start of the tool (MB): init=6.21875 overall=13.1289",
    "INFO: Overall peak memory footprint (MB) via periodic monitoring: 21.4531",
    "INFO: Memory status at the end of exeution:",
    "INFO: - VmRSS              : 30 MB",
    "",
])

# TFLite 2.x build without percentiles, GPU delegate taking most of the graph.
GPU_RUN = "\n".join([
    "INFO: STARTING!",
    "INFO: Use gpu: [1]",
    "INFO: Loaded model /data/local/tmp/edgevit-1234/model.tflite",
    "INFO: Created TensorFlow Lite delegate for GPU.",
    "INFO: GPU delegate created.",
    "INFO: Replacing 148 out of 152 node(s) with delegate (TfLiteGpuDelegateV2) node, yielding 2 partitions "
    "for subgraph 0 (main).",
    "INFO: Initialized OpenCL-based API.",
    "INFO: Created 1 GPU delegate kernels.",
    "INFO: Explicitly applied GPU delegate, and the model graph will be partially executed by the delegate w/ "
    "1 delegate kernels.",
    "INFO: The input model file size (MB): 5.1",
    "INFO: Initialized session in 812.4ms.",
    "INFO: Running benchmark for at least 1 iterations and at least 0.5 seconds but terminate if exceeding "
    "150 seconds.",
    "INFO: count=61 first=30511 curr=7512 min=7301 max=30511 avg=8190.2 std=2920",
    "",
    "INFO: Running benchmark for at least 50 iterations and at least 1 seconds but terminate if exceeding "
    "150 seconds.",
    "INFO: count=130 first=7602 curr=7433 min=7290 max=8804 avg=7512.6 std=201",
    "",
    "INFO: Inference timings in us: Init: 812400, First inference: 30511, Warmup (avg): 8190.2, "
    "Inference (avg): 7512.6",
    "INFO: Note: as the benchmark tool itself affects memory footprint, the following is only APPROXIMATE "
    "to the actual memory footprint of the model at runtime. Take the information at your discretion.",
    "INFO: Memory footprint delta from the start of the tool (MB): init=41.5 overall=43.25",
    "",
])

GPU_REFUSED = "\n".join([
    "INFO: STARTING!",
    "INFO: Use gpu: [1]",
    "INFO: Loaded model /data/local/tmp/edgevit-1234/model.tflite",
    "INFO: Created TensorFlow Lite delegate for GPU.",
    "ERROR: Can not open OpenCL library on this device - undefined symbol: clGetCommandBufferInfoKHR",
    "ERROR: Falling back to OpenGL",
    "ERROR: TfLiteGpuDelegate Init: OpenGL-based API disabled",
    "ERROR: TfLiteGpuDelegate Prepare: delegate is not initialized",
    "ERROR: Node number 152 (TfLiteGpuDelegateV2) failed to prepare.",
    "ERROR: Restored original execution plan after delegate application failure.",
    "ERROR: Failed to apply GPU delegate.",
    "ERROR: Benchmarking failed.",
    "",
])

NNAPI_RUN = "\n".join([
    "INFO: STARTING!",
    "INFO: Use NNAPI: [1]",
    "INFO: NNAPI accelerator name: [google-edgetpu]",
    "INFO: NNAPI accelerators available: [google-edgetpu,nnapi-reference]",
    "INFO: Loaded model /data/local/tmp/edgevit-1234/model.tflite",
    "INFO: Created TensorFlow Lite delegate for NNAPI.",
    "INFO: Replacing 97 out of 152 node(s) with delegate (TfLiteNnapiDelegate) node, yielding 9 partitions "
    "for subgraph 0 (main).",
    "INFO: Explicitly applied NNAPI delegate, and the model graph will be partially executed by the delegate "
    "w/ 3 delegate kernels.",
    "INFO: Initialized session in 301.2ms.",
    "INFO: count=12 first=60012 curr=22010 min=21005 max=60012 avg=25510 std=10500",
    "INFO: count=51 first=22101 curr=21950 min=21500 max=23904 avg=22004.1 std=420",
    "INFO: Inference timings in us: Init: 301200, First inference: 60012, Warmup (avg): 25510, "
    "Inference (avg): 22004.1",
    "",
])

# The process died part-way (signal 11): partial output, no summary line.
CRASH_PARTIAL = "\n".join([
    "INFO: STARTING!",
    "INFO: Loaded model /data/local/tmp/edgevit-1234/model.tflite",
    "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",
    "INFO: Initialized session in 50.1ms.",
    "INFO: Running benchmark for at least 1 iterations and at least 0.5 seconds but terminate if exceeding "
    "150 seconds.",
    "Segmentation fault ",
    "",
])

# TFLite 1.x / early 2.x summary line.
OLD_FORMAT = "\n".join([
    "Timings (microseconds): count=50 first=79449 curr=81350 min=77385 max=88213 avg=79732 std=1929",
    "Memory (bytes): count=0",
    "31 nodes observed",
    "",
    "",
    "Average inference timings in us: Warmup: 83235, Init: 38467, Inference: 79760.9",
])

# --op_profiling_output_mode=csv: "node type, start, first, avg_ms, ..." rows.
CSV_OP_PROFILE = "\n".join([
    "Operator-wise Profiling Info for Regular Benchmark Runs:",
    "============================== Run Order ==============================",
    "node type, start, first, avg_ms, %, cdf%, mem KB, times called, name",
    "CONV_2D, 0, 1.21, 1.15, 40%, 40%, 0, 1, [model/stem/conv, with a comma]:0",
    "SOFTMAX, 1.2, 0.3, 0.25, 8.7%, 48.7%, 0, 1, [model/attn/softmax]:3",
    "",
])

GPU_DELEGATE_PROFILE = "\n".join([
    "INFO: Operator-wise Profiling Info for Regular Benchmark Runs:",
    "============================== Run Order ==============================",
    RUN_ORDER_HEADER_WITH_START,
    _row("     TfLiteGpuDelegateV2", "    0.000", "    7.100", "    7.300", " 95.000%", " 95.000%", "        1",
         "     0.000", "[model/gpu_partition]:152"),
    _row("                 TOPK_V2", "    7.101", "    0.380", "    0.390", "100.000%", "  5.000%", "        1",
         "     0.000", "[model/topk]:150"),
    "",
])

ADB_DEVICES_TWO = "\n".join([
    "List of devices attached",
    "0A1B2C3D4E5F           device usb:1-1 product:panther model:Pixel_7 device:panther transport_id:1",
    "emulator-5554          device product:sdk_gphone64_x86_64 model:sdk_gphone64_x86_64 "
    "device:emu64xa transport_id:2",
    "",
])
ADB_DEVICES_UNAUTHORIZED = "\n".join([
    "List of devices attached",
    "R58M12ABCDE            unauthorized usb:1-2 transport_id:3",
    "",
])
ADB_DEVICES_OFFLINE = "\n".join([
    "List of devices attached",
    "192.168.1.50:5555      offline transport_id:4",
    "",
])
ADB_DEVICES_NONE = "List of devices attached\n\n"


def getprop(model, manufacturer, soc, board, release, sdk, abi):
    return "\n".join([
        "[dalvik.vm.heapsize]: [512m]",
        f"[ro.board.platform]: [{board}]",
        f"[ro.build.version.release]: [{release}]",
        f"[ro.build.version.sdk]: [{sdk}]",
        "[ro.hardware]: [" + board + "]",
        f"[ro.product.cpu.abi]: [{abi}]",
        f"[ro.product.cpu.abilist]: [{abi},armeabi-v7a,armeabi]",
        f"[ro.product.manufacturer]: [{manufacturer}]",
        f"[ro.product.model]: [{model}]",
        f"[ro.soc.manufacturer]: [{manufacturer}]",
        f"[ro.soc.model]: [{soc}]",
        "",
    ])


GETPROP_PIXEL7 = getprop("Pixel 7", "Google", "GS201", "gs201", "14", "34", "arm64-v8a")
GETPROP_EMULATOR = getprop("sdk_gphone64_x86_64", "Google", "", "ranchu", "13", "33", "x86_64")

THERMAL_PIXEL7 = "\n".join([
    "IsStatusOverride: false",
    "ThermalEventListeners:",
    "\tcallbacks: 1",
    "ThermalStatusListeners:",
    "\tcallbacks: 1",
    "Thermal Status: 1",
    "Cached temperatures:",
    "\tTemperature{mValue=38.2, mType=2, mName=battery, mStatus=0}",
    "HAL Ready: true",
    "HAL connection:",
    "\tThermalHAL 2.0 connected: yes",
    "Current temperatures from HAL:",
    "\tTemperature{mValue=41.5, mType=0, mName=BIG, mStatus=1}",
    "\tTemperature{mValue=39.0, mType=1, mName=G3D, mStatus=0}",
    "\tTemperature{mValue=38.2, mType=2, mName=battery, mStatus=0}",
    "\tTemperature{mValue=36.9, mType=3, mName=skin, mStatus=0}",
    "Current cooling devices from HAL:",
    "",
])

# NNAPI missing on the device: benchmark_model falls back to the CPU silently.
NNAPI_UNAVAILABLE = "\n".join([
    "INFO: STARTING!",
    "INFO: Use NNAPI: [1]",
    "INFO: Loaded model /data/local/tmp/edgevit-1234/model.tflite",
    "WARNING: NNAPI acceleration is unsupported on this platform.",
    "INFO: Initialized session in 48.0ms.",
    "INFO: count=30 first=16000 curr=14100 min=13900 max=16000 avg=14300 std=300",
    "INFO: count=50 first=14200 curr=14100 min=13800 max=15000 avg=14250 std=210",
    "INFO: Inference timings in us: Init: 48000, First inference: 16000, Warmup (avg): 14300, "
    "Inference (avg): 14250",
    "",
])
