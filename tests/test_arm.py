"""LiteRT's Arm64 kernels under emulation (edgevit.litert.arm, edgevit.profile.arm).

Without the emulator: the CPU profiles and the guest root they build, the
plugin's dump format, address naming from a process's memory map and ELF
symbols (this process's own libc), kernel families, and the one-line errors.
With it (scripts/install-arm-emulator.sh; skipped with the reason
otherwise): one small model per precision path agrees with x86 XNNPACK on
the Arm64 kernels and gets an exact, repeatable instruction count whose
kernel families fit the precision."""
import ctypes
import ctypes.util
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgevit.cli import main
from edgevit.errors import EdgevitError
from edgevit.litert import arm
from edgevit.profile.arm import count_many, parse_counts, read_counts
from edgevit.profile.kernels import OTHER, family_of
from edgevit.profile.symbols import AddressNamer, parse_maps
from tests.helpers import export_variant, needs_arm, tiny_tflite

SIZE = 64
PRECISIONS = ("fp32", "int8", "int8_mixed")


# ---------------------------------------------------------------- without the emulator
def test_profiles_name_their_core_for_xnnpack_and_fix_the_topology(tmp_path):
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr").mkdir(parents=True)
    root = arm.make_root(tmp_path, arm.PROFILES["a55"], rootfs)
    cpuinfo = (root / "proc" / "cpuinfo").read_text()
    assert cpuinfo.count("processor\t:") == arm.CORES and cpuinfo.count("CPU part\t: 0xd05") == arm.CORES
    assert "asimddp" in cpuinfo
    cpus = root / "sys/devices/system/cpu"
    assert (cpus / "possible").read_text() == f"0-{arm.CORES - 1}\n"
    assert (cpus / "cpu3/topology/core_siblings_list").read_text() == f"0-{arm.CORES - 1}\n"
    assert (root / "usr").resolve() == (rootfs / "usr").resolve()
    assert arm.PROFILES["a55"].qemu_cpu == "cortex-a76"   # qemu 7.2 has no A55 model: the same ISA (v8.2, dotprod)
    assert "CPU part" not in arm.PROFILES["max"].cpuinfo()  # no core named: kernels by instruction set
    assert "asimddp" not in arm.PROFILES["a53"].cpuinfo()


def test_profiles_parse_with_aliases_and_reject_unknown_names():
    assert [p.name for p in arm.parse_profiles("cortex-a76, i8mm,a55")] == ["a76", "max", "a55"]
    assert [p.name for p in arm.parse_profiles("all")] == list(arm.PROFILES)
    with pytest.raises(EdgevitError, match="Unknown Arm CPU profile a77"):
        arm.parse_profiles("a76,a77")


def _libc_function(name: str) -> int:
    return ctypes.cast(getattr(ctypes.CDLL(ctypes.util.find_library("c")), name), ctypes.c_void_p).value


def test_addresses_are_named_from_the_memory_map_and_the_elf_symbols():
    """This process's own libc: an exported function's address gets its name."""
    maps = Path("/proc/self/maps").read_text()
    namer = AddressNamer(maps)
    assert namer.name(_libc_function("getpid")) in ("getpid", "__getpid")
    assert namer.name(_libc_function("qsort") + 4) == "qsort"
    assert namer.name(8) == "[unmapped]"
    assert all(m.path.startswith("/") for m in parse_maps(maps))


def test_counts_become_instructions_per_inference_by_function_and_family():
    """A dump of two counted inferences, its blocks in libc's qsort: the
    per-inference count is the regions' mean, and every instruction is named."""
    address = _libc_function("qsort")
    dump = "insn_regions 1\nregions 2\nregion 0 350\nregion 1 350\n" \
           f"block {address:x} 10 50\nblock {address + 4:x} 5 20\nblock 8 4 25\nend\n"
    count = read_counts(dump, Path("/proc/self/maps").read_text(), "a76", "xnnpack", 1)
    assert count.per_inference == [350, 350] and count.instructions == 350
    assert count.functions == {"qsort": 300, "[unmapped]": 50}   # (10*50 + 5*20) / 2, 4*25 / 2
    assert count.to_dict()["profile"] == "a76" and "not cycles" in count.to_dict()["note"]


def test_an_incomplete_dump_is_a_clear_error():
    with pytest.raises(EdgevitError, match="no complete result"):
        parse_counts("insn_regions 1\nregions 1\nregion 0 5\n")
    assert parse_counts("insn_regions 1\nregions 0\nend\n") == ([], [])


@pytest.mark.parametrize("symbol, family", [
    ("xnn_qs8_qc8w_gemm_minmax_fp32_ukernel_4x16c4__asm_aarch64_neondot_ld128", "int8 GEMM (dense, 1x1 conv, matmul)"),
    ("xnn_qs8_qc8w_igemm_minmax_fp32_ukernel_4x16c8__neoni8mm", "int8 conv (kxk)"),
    ("xnn_qs8_qc8w_dwconv_minmax_fp32_ukernel_9p16c__neonv8_mla8_ld64", "int8 depthwise conv"),
    ("xnn_f32_gemm_minmax_ukernel_6x8__asm_aarch64_neonfma_cortex_a75_prfm", "fp32 GEMM (dense, 1x1 conv, matmul)"),
    ("xnn_f32_vsigmoid_ukernel__neonfma_rr1_lut64_p2_nr2recps_u16", "fp32 sigmoid"),
    ("xnn_x8_lut_ukernel__aarch64_neon_tbx128x4_u64", "int8 table lookup (LOGISTIC, TANH, ...)"),
    ("xnn_xx_pad_ukernel_p16__neon_u16", "pad"),
    ("__memcpy_generic", "transpose / copy"),
    ("void tflite::optimized_ops::SoftmaxInt8LUT<signed char, signed char>(tflite::SoftmaxParams const&)",
     "softmax (builtin kernel)"),
    ("ruy::Kernel8bitNeonDotprod(ruy::KernelParams8bit<8, 8> const&)",
     "ruy matmul (builtin BATCH_MATMUL, FULLY_CONNECTED)"),
    ("xnn_f32_gemm_minmax_ukernel_7x32__avx512f_broadcast", "fp32 GEMM (dense, 1x1 conv, matmul)"),
    ("_PyEval_EvalFrameDefault", OTHER),
])
def test_kernel_families(symbol, family):
    assert family_of(symbol) == family


@pytest.fixture(scope="module")
def plain_file(tmp_path_factory):
    return tiny_tflite(tmp_path_factory.mktemp("plain") / "m.tflite")


@pytest.fixture
def no_emulator(tmp_path, monkeypatch):
    monkeypatch.setenv(arm.HOME_ENV, str(tmp_path / "no-emulator"))


@pytest.mark.parametrize("args", [["check", "--arm", "m.tflite"], ["bench", "--arm", "a76", "m.tflite"]],
                         ids=["check", "bench"])
def test_without_the_emulator_arm_commands_say_how_to_install_it(args, no_emulator, plain_file, monkeypatch):
    monkeypatch.chdir(plain_file.parent)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "install-arm-emulator.sh" in lines[0]


def test_without_the_emulator_the_check_is_a_not_run_record(no_emulator, plain_file):
    check = arm.check_on_arm(plain_file, [arm.PROFILES["a76"]])
    assert not check.ran and check.agrees is None
    assert check.summary().startswith("not run: the Arm64 emulator is not installed")
    assert "install-arm-emulator.sh" in check.summary()


def test_an_x86_kernel_set_that_aborts_leaves_the_floor_to_the_others(plain_file, monkeypatch):
    """LiteRT 2.3's x86 reference kernels abort on some int8 files (pit_ti
    and cvt_13 at 224 px) that XNNPACK and the builtin kernels run: the Arm64
    check then takes its floor from the builtin kernels, not the abort."""
    from types import SimpleNamespace

    from edgevit.litert import run_model

    x86 = np.array([[1.0, 0.5, -0.5]], np.float32)
    builtin = np.array([[1.0, 0.6, -0.5]], np.float32)

    def run_in_child(path, inputs, num_threads=1, kernels="xnnpack", timeout=900):
        if kernels == "reference":
            raise EdgevitError(f"LiteRT failed running {Path(path).name}: the interpreter process was killed by "
                               "SIGABRT")
        return {"xnnpack": x86, "builtin": builtin}[kernels]

    monkeypatch.setattr(run_model, "run_in_child", run_in_child)
    monkeypatch.setattr(arm, "emulator_missing", lambda: None)
    monkeypatch.setattr(arm, "find_emulator", lambda: SimpleNamespace(runtime="ai-edge-litert 1.4.0 (fake)"))
    monkeypatch.setattr(arm, "precision_of", lambda content: "int8")
    monkeypatch.setattr(arm, "run_guest", lambda emulator, path, inputs, profile, kernels, timeout:
                        arm.GuestRun(profile.name, {"xnnpack": x86}, {"xnnpack": x86}, None))
    check = arm.check_on_arm(plain_file, [arm.PROFILES["a76"]], ("xnnpack",),
                             inputs=np.zeros((1, 8, 8, 3), np.float32))
    expected = float(np.dot(x86[0], builtin[0]) / np.linalg.norm(x86[0]) / np.linalg.norm(builtin[0]))
    assert check.ran and check.agrees
    assert check.x86_kernels_cosine == pytest.approx(expected, abs=1e-6)


# ---------------------------------------------------------------- on the emulator
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """mobilevit_v3_xxs at 64 px in each precision path, with the convert
    report's Arm64 line (2 held-out images, Cortex-A76 XNNPACK kernels)."""
    import keras

    if arm.emulator_missing():
        pytest.skip(f"{arm.emulator_missing()}: run scripts/install-arm-emulator.sh")
    folder = tmp_path_factory.mktemp("arm")
    reports = {}
    for precision in PRECISIONS:
        keras.utils.set_random_seed(0)
        reports[precision] = export_variant(folder, "mobilevit_v3_xxs", precision, SIZE, gpu=False, arm_images=2)
    return reports


@pytest.fixture(scope="module")
def counts(exported):
    """Exact instructions per inference: every file on the Cortex-A76
    kernels, the int8 file also on the i8mm and the Cortex-A55 kernels."""
    paths = {p: r["file"] for p, r in exported.items()}
    a76 = count_many(list(paths.values()), [arm.PROFILES["a76"]])
    others = count_many([paths["int8"]], [arm.PROFILES["max"], arm.PROFILES["a55"]])
    return {**{(p, "a76"): c for p, (_, c) in zip(paths, a76)},
            **{("int8", c.profile): c for _, c in others}}


@needs_arm
@pytest.mark.parametrize("precision", PRECISIONS)
def test_arm64_kernels_compute_what_x86_xnnpack_computes(exported, precision):
    run = exported[precision]["arm64"]
    assert run["ran"] and run["agrees"], run
    (row,) = run["rows"]
    assert (row["profile"], row["kernels"]) == ("a76", "xnnpack")
    assert row["agreement"]["top1_agreement"] == 1.0
    if precision == "int8":  # the same integer kernels' arithmetic: not one step apart
        assert row["int8_steps_max"] == 0 and row["agreement"]["max_abs_logit_error"] == 0.0, row
    else:
        assert row["agreement"]["cosine_mean"] > 0.9999, row
    check = next(c for c in exported[precision]["checks"] if c["check"].startswith("Arm64"))
    assert check["passed"], check


@needs_arm
@pytest.mark.parametrize("precision", PRECISIONS)
def test_instruction_counts_are_exact_and_fit_the_precision(exported, counts, precision):
    count = counts[(precision, "a76")]
    families = count.families
    if "ruy matmul (builtin BATCH_MATMUL, FULLY_CONNECTED)" in families:
        # ruy re-checks its CPU tuning every 250 ms of wall time (about 100 instructions each time)
        assert max(count.per_inference) - min(count.per_inference) <= 1e-4 * count.instructions, count.per_inference
    else:  # every counted inference: the same count
        assert len(set(count.per_inference)) == 1, count.per_inference
    assert abs(sum(families.values()) - count.instructions) <= len(families)
    macs = exported[precision]["macs"]
    top = next(iter(families))
    if precision == "fp32":
        assert top == "fp32 GEMM (dense, 1x1 conv, matmul)" and not any(f.startswith("int8") for f in families)
        # NEON multiplies 4 floats per instruction: GEMM instructions follow the MACs
        assert macs / 8 < families[top] < macs, (families[top], macs)
    else:
        assert top == "int8 GEMM (dense, 1x1 conv, matmul)", families
        assert any("neondot" in k for k in count.xnnpack_kernels())   # the dotprod kernels of a Cortex-A76
        assert count.instructions < 0.6 * counts[("fp32", "a76")].instructions
    if precision == "int8_mixed":  # XNNPACK takes the whole graph: no builtin kernel, no ruy
        assert {"fp32 softmax", "int8 GEMM (dense, 1x1 conv, matmul)"} <= set(families)
        assert not {"softmax (builtin kernel)", "ruy matmul (builtin BATCH_MATMUL, FULLY_CONNECTED)"} & set(families)


@needs_arm
def test_each_profile_runs_its_own_kernels(counts):
    """i8mm on `max`, the in-order core's own kernels on `a55`: more
    instructions than the A76's (instructions are not cycles)."""
    assert any("neoni8mm" in k for k in counts[("int8", "max")].xnnpack_kernels())
    assert any("cortex_a55" in k for k in counts[("int8", "a55")].xnnpack_kernels())
    assert counts[("int8", "max")].instructions < counts[("int8", "a76")].instructions \
        < counts[("int8", "a55")].instructions


@needs_arm
def test_check_and_bench_commands_on_arm64(exported, tmp_path):
    """`edgevit check --arm` with the builtin kernels of the little core and
    `edgevit bench --arm` with a plot: JSON naming each count's profile."""
    path = exported["int8"]["file"]
    # random weights: logits close together, where kernel sets' rounding shows; 6 images average it out
    result = CliRunner().invoke(main, ["check", "--arm", "--arm-profiles", "a55", "--arm-kernels", "builtin",
                                       "--images", "6", "--json", path])
    assert result.exit_code == 0, result.output
    run = json.loads(result.output[result.output.index("{"):])["arm64"]
    assert run["agrees"] and [(r["profile"], r["kernels"]) for r in run["rows"]] == [("a55", "builtin")]
    plot = tmp_path / "counts.png"
    result = CliRunner().invoke(main, ["bench", "--arm", "a76", "--runs", "1", "--json", "--plot", str(plot),
                                       "--models", exported["int8_mixed"]["file"], path])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output[result.output.index("{"):])
    assert [(r["precision"], r["profile"]) for r in doc["results"]] == [("int8_mixed", "a76"), ("int8", "a76")]
    assert all(r["instructions_per_inference"] > 0 and r["families"] for r in doc["results"])
    assert "not cycles" in doc["arm"]["note"] and doc["arm"]["versions"]["litert"] == "1.4.0"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_outputs_of_integer_files_are_compared_in_quantization_steps():
    x86 = np.array([[0.5, -0.25, 1.0]], np.float32)
    row = arm.compare("a76", "builtin", x86, x86 + np.array([[0.0, 0.25, -0.5]], np.float32), 0.99, scale=0.25)
    assert row.int8_steps_max == 2 and row.int8_outputs_off == pytest.approx(2 / 3)
    assert arm.compare("a76", "xnnpack", x86, x86, 0.999, scale=None).int8_steps_max is None
