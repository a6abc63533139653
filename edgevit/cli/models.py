"""`edgevit list`, `info`, `convert` and `bundle`: the registry and the export
pipeline from the command line."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from edgevit.cli.options import IMAGENET_DOWNLOAD, InputSize, classifier_classes, overwrite_option, precision_options
from edgevit.cli.output import log, print_json, print_table, user_errors
from edgevit.errors import EdgevitError
from edgevit.litert.accelerator import DEFAULT_IMAGES as DEFAULT_GPU_IMAGES
from edgevit.litert.arm import DEFAULT_IMAGES as DEFAULT_ARM_IMAGES
from edgevit.native_output import import_tensorflow_quietly
from edgevit.registry import DETECTION, TOP1
from edgevit.writing import refuse_existing


@click.command("list")
@click.argument("pattern", required=False)
@click.option("--pretrained", is_flag=True,
              help="Only models with official ImageNet weights (--weights imagenet), with their tag, source, "
                   "top-1, preprocessing and licence.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@user_errors
def list_command(pattern, pretrained, as_json):
    """List registered models (optionally matching a shell PATTERN, e.g. 'mobilevit_v3*')."""
    from edgevit.registry import Pretrained, get_spec, list_models

    specs = [get_spec(n) for n in list_models(pattern)]
    if pretrained:
        specs = [s for s in specs if isinstance(s.pretrained, Pretrained)]
    if not specs:
        raise EdgevitError(f"No model{' with ImageNet weights' if pretrained else ''} matches {pattern!r}.")
    if pretrained:
        _print_pretrained(specs, as_json)
        return
    if as_json:
        print_json([{"name": s.name, "family": s.family, "input_size": s.default_input_size} for s in specs])
        return
    print_table(None, ["model", "family", "input size"],
                [[s.name, s.family, s.default_input_size] for s in specs])


def _print_pretrained(specs, as_json: bool) -> None:
    if as_json:
        print_json([{"name": s.name, **s.pretrained.to_dict(), "preprocessing": s.preprocessing.to_dict()}
                    for s in specs])
        return
    rows = [[s.name, s.pretrained.where, f"{s.pretrained.top1}%" + ("" if s.pretrained.metric == TOP1 else
                                                                      f" ({s.pretrained.metric})"),
             _fmt_preprocessing(s.preprocessing, s.task),
             s.pretrained.channel_order, s.pretrained.licence] for s in specs]
    print_table("Official pretrained weights (--weights imagenet): top-1 (or the metric named) as published, "
                "measured with this preprocessing; 'trained on' BGR weights are made RGB at import",
                ["model", "checkpoint", "top-1", "preprocessing", "trained on", "licence"], rows, width=180)


def _fmt_preprocessing(pre, task: str) -> str:
    """The recipe the published figure was measured with: a detector's is
    the whole image resized to the square (the SSD recipes), others' the
    centre crop of the resized shorter side."""
    if pre.mean == (0.0, 0.0, 0.0) and pre.std == (1.0, 1.0, 1.0):
        norm = "pixels in [0, 1]"
    elif pre.mean == (0.5, 0.5, 0.5) and pre.std == (0.5, 0.5, 0.5):
        norm = "mean/std 0.5"
    else:
        norm = f"mean {list(pre.mean)} std {list(pre.std)}"
    if task == DETECTION:
        return f"whole image to {pre.input_size}x{pre.input_size} ({pre.interpolation}), {norm}"
    return f"shorter side {pre.resize_size} ({pre.interpolation}), crop {pre.input_size}, {norm}"


@click.command("info")
@click.argument("name")
@click.option("--input-size", type=InputSize(), default=None,
              help="Count parameters and MACs at this input size: builds and converts the model (without it: the "
                   "counts recorded at the default size).")
@click.option("--weights", type=click.Choice(["imagenet"], case_sensitive=False), default=None,
              help="Also fetch, verify, import and cache the official ImageNet weights (e.g. before going offline) "
                   "and say where they are (HF_ENDPOINT and EDGEVIT_WEIGHTS_MIRROR=URL point the downloads to "
                   "mirrors). A download without a published checksum (the MobileViTv3, CSWin and T2T-ViT release "
                   "files) is checked by reading it (zip CRCs, then the checkpoint); one that does not read is "
                   "deleted, so the next run downloads it again. Archive members that would inflate beyond 64 MiB "
                   "and 100x their stored size are refused.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@user_errors
def info_command(name, input_size, weights, as_json):
    """Parameters, MACs, input size, preprocessing and official ImageNet weights (tag, source, top-1, licence)
    of model NAME (a registered name, see `edgevit list`)."""
    if Path(name).suffix in (".tflite", ".keras", ".h5") or Path(name).is_file():
        raise EdgevitError(f"{name!r} is a file; `edgevit info` describes registered models (`edgevit list`). "
                           "For a converted .tflite file, its NAME.json holds the metadata and "
                           "`edgevit check FILE.tflite` lists its ops per delegate.")
    from edgevit.info import CONVERSION_BYTES_PER_PARAMETER, model_info
    from edgevit.pretrained import cached_weights, entry_of
    from edgevit.registry import check_input_size, get_spec

    spec = get_spec(name)
    if input_size is not None:
        check_input_size(spec, input_size)
    if weights is not None:
        entry_of(spec)  # no official weights: say so before any work
    if weights is not None or input_size is not None:
        import_tensorflow_quietly()  # a model is built and counted, or weights imported
    info = model_info(name, input_size=input_size)
    if weights is not None:
        info["pretrained"]["cached"] = str(cached_weights(spec, info["input_size"], log=log))
    if as_json:
        print_json(info)
        return
    macs = _multiply_accumulates(info["macs"]) if info["macs"] is not None else \
        (f"not recorded for a model this large: --input-size {info['input_size']} counts them on an fp32 "
         f"conversion (about {info['parameters'] * CONVERSION_BYTES_PER_PARAMETER / 1e9:.0f} GB of memory)")
    shown = {**info, "parameters": f"{info['parameters']:,}", "macs": macs}
    rows = [[k, v] for k, v in shown.items() if k not in ("preprocessing", "pretrained")]
    rows += [[f"preprocessing.{k}", v] for k, v in info["preprocessing"].items()]
    rows += [[f"imagenet_weights.{k}", v] for k, v in info["pretrained"].items() if v is not None]
    print_table(name, ["field", "value"], rows)


def _multiply_accumulates(macs: int) -> str:
    return f"{macs / 1e9:,.2f} G" if macs >= 1e9 else f"{macs / 1e6:.1f} M"


@click.command("convert")
@click.argument("model")
@precision_options
@click.option("--weights", type=str, default=None,
              help=f"Keras weights (.weights.h5 or .keras), or `imagenet`: the official ImageNet weights, "
                   f"{IMAGENET_DOWNLOAD}.")
@click.option("--input-size", type=InputSize(), default=None,
              help="Square input size (multiple of the patch grid).")
@click.option("--num-classes", type=int, default=None, callback=classifier_classes,
              help="Classifier classes (default 1000).")
@click.option("--calib", "calib_dir", type=str, default=None,
              help="Folder of images for int8 calibration (default: built-in sample photos).")
@click.option("--calib-samples", type=click.IntRange(1, 10000), default=64, show_default=True)
@click.option("--io", "io_dtype", type=click.Choice(["uint8", "int8", "float32"]), default=None,
              help="Input/output tensor type. Default for --int8: uint8, the camera's RGB bytes in (the file "
                   "normalises them) and probabilities on the 1/256 grid out, what MediaPipe Tasks and the Task "
                   "Library load; int8 takes the normalised image quantized (those clients refuse it). "
                   "float32 otherwise.")
@click.option("--logits", is_flag=True,
              help="Output raw logits instead of probabilities (by default the file ends in the softmax, as "
                   "image classifiers do, so client scores and thresholds are probabilities). A segmenter's file "
                   "always outputs its map of logits; its metadata names the softmax MediaPipe applies.")
@click.option("--add-postprocessing-op", "add_postprocessing_op", is_flag=True,
              help="A detector's file ends in TFLite's detection post-processing op (box decoding and NMS: "
                   "outputs location, category, score, number of detections, float32), what the TFLite Task "
                   "Library requires; the op runs on the CPU. By default a detector's file outputs its raw boxes "
                   "and scores (uint8) with the anchors in its metadata, as MediaPipe's ObjectDetector reads them, "
                   "every op on the delegates.")
@click.option("-o", "--output", type=str, default=None,
              help="Output .tflite path (default: NAME_PRECISION.tflite in the current folder, named after where "
                   "the weights come from: model_int8.tflite for model.keras or --weights model.weights.h5, "
                   "MODEL_imagenet_int8.tflite for --weights imagenet, MODEL_int8.tflite for random weights).")
@overwrite_option
@click.option("--android-demo", "android_demo", type=str, default=None, metavar="DIR",
              help="Also copy the model, metadata and labels into this Android demo app (android_demo/).")
@click.option("--no-gpu-run", is_flag=True,
              help=f"Do not run the file on LiteRT's GPU accelerator against XNNPACK ({DEFAULT_GPU_IMAGES} held-out "
                   "sample photos, "
                   "those `edgevit check --gpu` judges it on; it runs where this machine has a Vulkan device).")
@click.option("--no-arm-run", is_flag=True,
              help=f"Do not run the file on LiteRT's Arm64 kernels against x86 XNNPACK ({DEFAULT_ARM_IMAGES} held-out "
                   "sample photos, those `edgevit check --arm` judges it on, Cortex-A76 XNNPACK kernels, emulated; "
                   "it runs where "
                   "scripts/install-arm-emulator.sh installed the emulator).")
@click.option("--no-diagnosis", is_flag=True,
              help="Do not compare the file layer by layer with an fp32 conversion when it agrees poorly with the "
                   "Keras model (a second conversion, and every tensor of both files kept).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of a table.")
@user_errors
def convert_command(model, precision, weights, input_size, num_classes, calib_dir, calib_samples,
                    io_dtype, logits, add_postprocessing_op, output, overwrite, android_demo, no_gpu_run, no_arm_run,
                    no_diagnosis, as_json):
    """Convert MODEL (a registered name or a .keras file) to a validated .tflite file, with its metadata
    (.json), labels (.labels.txt) and report (.report.json) beside it.

    A .keras file is checked before Keras opens it: one whose model
    description (config.json, metadata.json) is beyond 64 MiB, or with a
    member that would inflate beyond 64 MiB and 100x its stored size (a
    decompression bomb; Keras stores members uncompressed), is refused, and
    so is one holding Python code (a Lambda layer), which edgevit never runs.
    """
    from edgevit.export.pipeline import ExportOptions, check_options, default_output_path, export
    from edgevit.export.result import ExportFiles
    from edgevit.pretrained import IMAGENET_CLASSES, RANDOM_INIT, is_imagenet
    from edgevit.progress import Progress

    from_file = model.endswith(".keras")
    imagenet = is_imagenet(weights)
    output = output or str(default_output_path(_named_after(model, weights, imagenet), precision))
    opts = ExportOptions(precision=precision, io_dtype=io_dtype, outputs="logits" if logits else "probabilities",
                         calib_dir=calib_dir,
                         calib_samples=calib_samples, output=output,
                         weights_label=weights or (model if from_file else RANDOM_INIT),
                         recalibrate_batchnorm=weights is None and not from_file,
                         show_top5_photos=imagenet and num_classes in (None, IMAGENET_CLASSES),
                         diagnose_below_cosine=None if no_diagnosis else 0.98,
                         **({"gpu_images": 0} if no_gpu_run else {}),
                         arm_images=0 if no_arm_run else DEFAULT_ARM_IMAGES,
                         add_postprocessing_op=add_postprocessing_op)
    check_options(opts)  # before the model is built, not after converting
    refuse_existing(ExportFiles.beside(Path(output)).all(), overwrite)
    from edgevit.saving import check_model_file, existing_file

    if from_file:
        check_model_file(model)
    if weights is not None and not imagenet:
        existing_file(weights, "Weights file")
    if android_demo is not None:
        from edgevit.export.android_bundle import check_demo_folder

        check_demo_folder(android_demo)
    import_tensorflow_quietly()
    from edgevit.export.report import print_report
    from edgevit.pretrained import weights_label as weights_label_of
    from edgevit.saving import resolve_model

    progress = Progress(enabled=not as_json)
    progress.step(f"Building {model}")
    keras_model, spec = resolve_model(model, num_classes=num_classes, input_size=input_size, weights=weights)
    if imagenet:
        from edgevit.pretrained import entry_of

        opts = dataclasses.replace(opts, weights_label=weights_label_of(spec), licence=entry_of(spec).licence)
    result = export(keras_model, spec, opts, progress)
    bundled = None
    if android_demo is not None:
        from edgevit.export.android_bundle import bundle

        bundled = bundle(result.files.model, android_demo)
    if as_json:
        report = result.to_dict()
        if bundled is not None:
            report["android_demo"] = bundled
        print_json(report)
    else:
        print_report(result)
        if bundled is not None:
            _print_bundle(bundled, android_demo)


def _named_after(model: str, weights: str | None, imagenet: bool) -> str:
    """What a converted file is named after: where its weights come from, so
    that files made from different weights do not share a name."""
    if model.endswith(".keras"):
        return Path(model).stem
    if imagenet:
        return f"{model}_imagenet"
    if weights is not None:
        return Path(weights).name.removesuffix(".h5").removesuffix(".keras").removesuffix(".weights")
    return model


def _print_bundle(result: dict, demo_dir: str) -> None:
    assets = result["assets"]
    click.echo(f"Android demo: {assets['model']}, {assets['metadata']} and {assets['labels']} written.")
    click.echo(f"  Build and install (JDK 17, Android SDK, a phone adb sees; {demo_dir}/README.md):")
    for command in result["build"]:
        click.echo(f"    {command}")


@click.command("bundle")
@click.argument("model_file", metavar="MODEL.tflite")
@click.option("--android-demo", "android_demo", type=str, required=True, metavar="DIR",
              help="The Android demo app folder (android_demo/ of the edgevit repository).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@user_errors
def bundle_command(model_file, android_demo, as_json):
    """Copy an exported MODEL.tflite with its metadata and labels into the Android demo app."""
    from edgevit.export.android_bundle import bundle

    result = bundle(model_file, android_demo)
    if as_json:
        print_json(result)
    else:
        _print_bundle(result, android_demo)
