"""`edgevit bench` and `edgevit check`: latency on this machine and on phones,
instructions on LiteRT's Arm64 kernels (emulated), and which ops the phone
delegates take."""
from __future__ import annotations

import click

from edgevit.cli.options import Seconds
from edgevit.cli.output import plain, print_json, stderr_console, user_errors
from edgevit.errors import EdgevitError, about
from edgevit.litert.accelerator import DEFAULT_IMAGES as DEFAULT_GPU_IMAGES
from edgevit.litert.arm import DEFAULT_IMAGES as DEFAULT_ARM_IMAGES

# what `edgevit check --arm` runs by default: the big dotprod core, an i8mm
# core and the little core; on two photos (emulated fp32 at 256 px runs about
# 20 s per inference on two cores)
DEFAULT_ARM_PROFILES = ("a76", "max", "a55")


@click.command("bench")
@click.argument("models", nargs=-1, required=True, metavar="MODEL.tflite...")
@click.option("--models", "sweep", is_flag=True,
              help="Compare several files in one table and plot (precision sweep): "
                   "`--models a_fp32.tflite a_int8.tflite`.")
@click.option("--delegate", "delegates", default="cpu", show_default=True,
              help="Comma list of cpu, gpu, nnapi (gpu/nnapi run on phones).")
@click.option("--threads", default=None,
              help="CPU thread counts, comma list (default 1,2,4, those up to this machine's core count; --arm "
                   "counts 1 thread).")
@click.option("--host-kernels", default="xnnpack,reference", show_default=True,
              help="Kernels for this machine: xnnpack, builtin, reference.")
@click.option("--no-host", is_flag=True, help="Do not measure on this machine.")
@click.option("--device", "device", default=None, metavar="SERIAL", help="Also run on this adb device.")
@click.option("--all-devices", is_flag=True, help="Also run on every attached adb device.")
@click.option("--benchmark-binary", "binaries", multiple=True, type=click.Path(dir_okay=False),
              help="An official benchmark_model build (repeatable: one per architecture). "
                   "Runs on this machine when built for it, and is pushed to phones of its ABI.")
@click.option("--arm", "arm_profiles", default=None, metavar="PROFILE[,PROFILE]",
              help="Count exact instructions per inference on LiteRT's Arm64 kernels under emulation instead of "
                   "timing: a76 (Cortex-A76 kernels, dotprod), max (i8mm), a55 (little core), a53 (ARMv8.0), or "
                   "all. Totals and kernel families per file; instructions are not cycles.")
@click.option("--arm-kernels", default="xnnpack", show_default=True,
              help="With --arm: the kernels counted (xnnpack, builtin or reference).")
@click.option("--runs", type=click.IntRange(1, 100000), default=None,
              help="Counted runs (default 50; with --arm, counted inferences, default 2).")
@click.option("--warmup", type=click.IntRange(0, 10000), default=None,
              help="Warm-up runs (default 5; with --arm 1).")
@click.option("--max-secs", type=Seconds(0.1), default=20.0, show_default=True,
              help="Time cap for the counted runs of one host configuration.")
@click.option("--op-profiling", is_flag=True, help="Phones: per-op timings (--enable_op_profiling).")
@click.option("--peak-memory", is_flag=True, help="benchmark_model: --report_peak_memory_footprint.")
@click.option("--nnapi-accelerator", default=None, metavar="NAME",
              help="NNAPI accelerator name (e.g. google-edgetpu, qti-dsp).")
@click.option("--timeout", type=Seconds(1), default=None,
              help="Seconds one configuration may take (default 300; with --arm, one emulated process, 1800).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--csv", "csv_path", default=None, metavar="PATH", help="Also write the rows as CSV.")
@click.option("--plot", "plot_path", default=None, metavar="PATH.png",
              help="Also draw latency by delegate x precision (and accuracy vs latency with --eval).")
@click.option("--eval", "eval_paths", multiple=True, metavar="PATH.json",
              help="Accuracy for the plot (repeatable): `edgevit eval --json` output, or "
                   "{\"a_int8.tflite\": {\"top1\": 0.71}, ...}.")
@user_errors
def bench_command(models, sweep, delegates, threads, host_kernels, no_host, device, all_devices, binaries,
                  arm_profiles, arm_kernels, runs, warmup, max_secs, op_profiling, peak_memory, nnapi_accelerator,
                  timeout, as_json, csv_path, plot_path, eval_paths):
    """How fast is MODEL, where, and why: this machine (LiteRT XNNPACK and reference
    kernels, threads), phones over adb (benchmark_model on CPU, GPU, NNAPI), or,
    with --arm, exact instructions per inference on LiteRT's Arm64 kernels
    (emulated: counts, not milliseconds)."""
    from pathlib import Path

    from edgevit.litert.interpreter import KERNELS
    from edgevit.profile import bench, report
    from edgevit.profile.benchmark_binary import DELEGATES

    outputs = _check_bench_outputs(csv_path, plot_path)
    if arm_profiles is not None:
        _bench_arm(models, arm_profiles, arm_kernels, threads, runs, warmup, timeout, as_json, outputs,
                   conflicting={"--device": device, "--all-devices": all_devices, "--benchmark-binary": binaries,
                                "--no-host": no_host, "--eval": eval_paths, "--op-profiling": op_profiling,
                                "--peak-memory": peak_memory})
        return
    opts = bench.BenchOptions(
        delegates=bench.parse_list(delegates, "delegate", DELEGATES),
        threads=bench.parse_threads(threads) if threads else list(bench.DEFAULT_THREADS),
        threads_asked=bool(threads),
        host_kernels=bench.parse_list(host_kernels, "host-kernels", KERNELS), runs=runs or 50,
        warmup=5 if warmup is None else warmup,
        max_secs=max_secs, op_profiling=op_profiling, peak_memory=peak_memory,
        # absolute: `--benchmark-binary ./bm` runs that file, not a `bm` found on PATH
        binaries=[Path(b).absolute() for b in binaries], device=device, all_devices=all_devices, host=not no_host,
        nnapi_accelerator=nnapi_accelerator, timeout=timeout or 300.0)
    if no_host and not (device or all_devices):
        raise EdgevitError("--no-host leaves nothing to measure: add --device SERIAL or --all-devices.")
    accuracies = report.load_eval(eval_paths) if eval_paths else None
    console = stderr_console()
    result = bench.run_bench(models, opts, step=lambda m: console.print(f"[bold]>[/bold] {plain(m)}"),
                             warn=lambda m: console.print(f"[yellow]warning:[/yellow] {plain(m)}"))
    failure = _failed_target(result)
    if outputs and failure is None:
        from edgevit.writing import staged

        with staged(outputs) as staging:  # the CSV and the plot are written together or not at all
            if csv_path:
                with staging.writing(Path(csv_path)) as path:
                    report.write_csv(result, path)
            if plot_path:
                with staging.writing(Path(plot_path)) as path:
                    report.plot(result, path, accuracies)
    if as_json:
        print_json(result)
    else:
        report.print_bench(result)
    if failure is not None:
        raise EdgevitError(failure)


def _check_bench_outputs(csv_path: str | None, plot_path: str | None) -> list:
    """The --csv and --plot paths, checked before anything is measured."""
    from pathlib import Path

    from edgevit.writing import check_writable

    if plot_path:
        if not plot_path.lower().endswith(".png"):
            raise EdgevitError(f"--plot writes a PNG file: give a path ending in .png (got {plot_path!r}).")
        from edgevit.profile.report import require_matplotlib

        require_matplotlib()
    outputs = [(flag, Path(path)) for flag, path in (("--csv", csv_path), ("--plot", plot_path)) if path]
    if len(outputs) == 2 and outputs[0][1].resolve() == outputs[1][1].resolve():
        raise EdgevitError(f"--csv and --plot name the same file {csv_path!r}: give each its own.")
    for flag, path in outputs:
        check_writable([path], flag=flag)
    return [path for _, path in outputs]


def _failed_target(result: dict) -> str | None:
    """Why the run failed: a place asked for (this machine, a phone) that
    produced no timings; None when every place did."""
    targets = list(dict.fromkeys(r.get("target") for r in result["results"]))
    failed = [t for t in targets if not any(r.get("status") == "ok" for r in result["results"] if r.get("target") == t)]
    if not failed and targets:
        return None
    where = failed[0] if failed else "anywhere"
    first = next((r.get("error") for r in result["results"] if r.get("target") == where and r.get("error")),
                 "no configuration ran")
    return f"No configuration produced timings on {where} ({first})."


def _bench_arm(models, profiles, kernels, threads, runs, warmup, timeout, as_json, outputs: list,
               conflicting: dict) -> None:
    """`edgevit bench --arm`: instruction counts instead of timings."""
    from edgevit.litert.arm import parse_profiles
    from edgevit.profile import report
    from edgevit.profile.arm import bench_on_arm

    given = [flag for flag, value in conflicting.items() if value]
    if given:
        raise EdgevitError(f"--arm counts instructions on emulated Arm64 kernels; it does not take {given[0]} "
                           "(run the timings without --arm).")
    if threads not in (None, "1"):
        raise EdgevitError("--arm counts one thread: with several, the count would include the thread pool's "
                           "spinning (and the plugin's counters are not atomic).")
    console = stderr_console()
    result = bench_on_arm(models, parse_profiles(profiles), kernels.strip().lower(), runs=runs or 2,
                          warmup=1 if warmup is None else warmup, timeout=timeout or 1800.0,
                          step=lambda m: console.print(f"[bold]>[/bold] {plain(m)}"))
    if outputs:
        from edgevit.writing import staged

        with staged(outputs) as staging:  # the CSV and the plot are written together or not at all
            for out in outputs:
                with staging.writing(out) as path:
                    (report.plot_arm if out.suffix.lower() == ".png" else report.write_arm_csv)(result, path)
    if as_json:
        print_json(result)
    else:
        report.print_arm_bench(result)


@click.command("check")
@click.argument("model", metavar="MODEL.tflite")
@click.option("--gpu", is_flag=True, help="Check the GPU: the delegate rule table and a run on LiteRT's GPU "
                                           "accelerator (default: GPU and NNAPI).")
@click.option("--nnapi", is_flag=True, help="Check the NNAPI delegate (default: both).")
@click.option("--android-api", type=click.IntRange(27, 40), default=33, show_default=True,
              help="Android API level whose NNAPI rules apply.")
@click.option("--nnapi-accelerator", "nnapi_accelerator", is_flag=True,
              help="NNAPI rules for a run that names its accelerator (it then takes MUL version 3 and "
                   "large quantized average pools).")
@click.option("--arm", is_flag=True,
              help="Run the file on LiteRT's Arm64 kernels under emulation (the phone's CPU kernels) against this "
                   "machine's x86 XNNPACK on sample photos (without --gpu/--nnapi: only this).")
@click.option("--arm-profiles", default=",".join(DEFAULT_ARM_PROFILES), show_default=True,
              help="With --arm: CPU profiles (a76, max, a55, a53 or all).")
@click.option("--arm-kernels", default="xnnpack,builtin", show_default=True,
              help="With --arm: the Arm64 kernel sets to run (xnnpack, builtin, reference).")
@click.option("--images", type=click.IntRange(1, 256), default=None,
              help=f"Held-out sample photos (preprocessed as the file's metadata says) the GPU run (default "
                   f"{DEFAULT_GPU_IMAGES}) and the Arm64 runs (default {DEFAULT_ARM_IMAGES}) compare on.")
@click.option("--no-gpu-run", is_flag=True, help="Apply the GPU rule table only; do not run the file.")
@click.option("--require-gpu-run", is_flag=True,
              help="Exit with status 4 when the GPU run could not happen (no Vulkan device).")
@click.option("--fail-on-fallback", is_flag=True,
              help="Exit with status 2 when an op falls back to the CPU (by the rule tables, or in the GPU run), "
                   "and with status 3 when the GPU may give another answer than the CPU: an op GPUs compute "
                   "wrongly (an adjoint BATCH_MATMUL, a constant operand laid out differently) or a GPU run "
                   "that disagrees with XNNPACK.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@user_errors
def check_command(model, gpu, nnapi, android_api, nnapi_accelerator, arm, arm_profiles, arm_kernels, images,
                  no_gpu_run, require_gpu_run, fail_on_fallback, as_json):
    """Which ops of MODEL the GPU / NNAPI delegates would leave on the CPU, and
    into how many delegate partitions the graph splits (no phone needed); and,
    where this machine has a Vulkan device, whether LiteRT's GPU accelerator
    runs every op and gives the same answer as XNNPACK on real photos. With
    --arm, whether LiteRT's Arm64 kernels (XNNPACK and builtin, per CPU
    profile; LiteRT 1.4 aarch64 under emulation) compute what x86 XNNPACK does.

    \b
    Exit status:
      0  checked (whatever was found, unless a flag below says otherwise)
      1  a user error (missing or unreadable file, --arm without the emulator)
      2  with --fail-on-fallback: an op falls back to the CPU
      3  with --fail-on-fallback: the GPU may give another answer than the CPU
      4  with --require-gpu-run: no GPU run happened
      5  with --arm: the Arm64 kernels give another answer than x86 XNNPACK
    """
    import sys
    from pathlib import Path

    from edgevit.litert.accelerator import run_file_on_gpu
    from edgevit.litert.delegates import check
    from edgevit.litert.flatbuffer import read, read_file
    from edgevit.litert.gpu_rules import computed_wrongly
    from edgevit.litert.metadata_check import metadata_summary
    from edgevit.profile import report
    from edgevit.profile.bench import parse_list as bench_parse_list
    from edgevit.progress import Progress

    progress = Progress(enabled=not as_json)
    path = Path(model)
    content = read_file(path)
    if not gpu and not nnapi and not arm:
        gpu = nnapi = True
    with about(path):
        read(content)  # a clear error for a file that is not a .tflite flatbuffer
        metadata = metadata_summary(content)
    arm_check = None
    if arm:
        from edgevit.litert import arm as arm_mod

        profiles = arm_mod.parse_profiles(arm_profiles)
        kernels = tuple(bench_parse_list(arm_kernels, "arm-kernels", arm_mod.KERNEL_SETS))
        arm_mod.find_emulator()  # not installed: one error line, before any work
        with progress.bar("Arm64 check", None):
            arm_check = arm_mod.check_on_arm(path, profiles, kernels, images=images or DEFAULT_ARM_IMAGES,
                                             step=progress.step)
    with about(path):
        reports = check(content, gpu=gpu, nnapi=nnapi, android_api=android_api,
                        nnapi_accelerator_specified=nnapi_accelerator) if gpu or nnapi else {}
        run = None
        if gpu and not no_gpu_run:
            with progress.bar("GPU accelerator and XNNPACK (one child process)", None):
                run = run_file_on_gpu(path, images or DEFAULT_GPU_IMAGES)
    if as_json:
        print_json({"model": str(path), "metadata": metadata, **{k: r.to_dict() for k, r in reports.items()},
                    **({"gpu_accelerator": run.to_dict()} if run else {}),
                    **({"arm64": arm_check.to_dict()} if arm_check else {})})
    else:
        report.print_metadata(path.name, metadata)
        report.print_check(path.name, reports, run)
        if arm_check is not None:
            report.print_arm_check(path.name, arm_check)
    wrong_answer = (gpu and bool(computed_wrongly(read(content)))) or (run is not None and run.ran and not run.agrees)
    fallback = any(r.fallbacks for r in reports.values()) or (run is not None and run.ran
                                                                and not run.fully_accelerated)
    if fail_on_fallback and wrong_answer:
        sys.exit(3)
    if fail_on_fallback and fallback:
        sys.exit(2)
    if require_gpu_run and not (run and run.ran):
        sys.exit(4)
    if arm_check is not None and not arm_check.agrees:
        sys.exit(5)
