"""`edgevit list`, `info`, `convert` and `bundle`: the registry and the export
pipeline from the command line."""
from __future__ import annotations

from pathlib import Path

import click

from edgevit.cli.options import InputSize, classifier_classes, precision_options
from edgevit.cli.output import print_json, print_table, user_errors
from edgevit.errors import EdgevitError
from edgevit.native_output import import_tensorflow_quietly


@click.command("list")
@click.argument("pattern", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@user_errors
def list_command(pattern, as_json):
    """List registered models (optionally matching a shell PATTERN, e.g. 'mobilevit_v3*')."""
    import_tensorflow_quietly()  # the registry builds on Keras
    from edgevit.registry import get_spec, list_models

    specs = [get_spec(n) for n in list_models(pattern)]
    if not specs:
        raise EdgevitError(f"No model matches {pattern!r}.")
    if as_json:
        print_json([{"name": s.name, "family": s.family, "input_size": s.default_input_size} for s in specs])
        return
    print_table(None, ["model", "family", "input size"],
                [[s.name, s.family, s.default_input_size] for s in specs])


@click.command("info")
@click.argument("name")
@click.option("--input-size", type=InputSize(), default=None, help="Count MACs at this input size.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@user_errors
def info_command(name, input_size, as_json):
    """Parameters, MACs, input size and preprocessing of model NAME (a registered name, see `edgevit list`)."""
    if Path(name).suffix in (".tflite", ".keras", ".h5") or Path(name).is_file():
        raise EdgevitError(f"{name!r} is a file; `edgevit info` describes registered models (`edgevit list`). "
                           "For a converted .tflite file, its NAME.json holds the metadata and "
                           "`edgevit check FILE.tflite` lists its ops per delegate.")
    import_tensorflow_quietly()
    from edgevit.info import model_info

    info = model_info(name, input_size=input_size)
    if as_json:
        print_json(info)
        return
    rows = [[k, v] for k, v in info.items() if k != "preprocessing"]
    rows += [[f"preprocessing.{k}", v] for k, v in info["preprocessing"].items()]
    print_table(name, ["field", "value"], rows)


@click.command("convert")
@click.argument("model")
@precision_options
@click.option("--weights", type=str, default=None, help="Keras weights (.weights.h5 or .keras).")
@click.option("--input-size", type=InputSize(), default=None,
              help="Square input size (multiple of the patch grid).")
@click.option("--num-classes", type=int, default=None, callback=classifier_classes,
              help="Classifier classes (default 1000).")
@click.option("--calib", "calib_dir", type=str, default=None,
              help="Folder of images for int8 calibration (default: built-in sample photos).")
@click.option("--calib-samples", type=click.IntRange(1, 10000), default=64, show_default=True)
@click.option("--io", "io_dtype", type=click.Choice(["int8", "uint8", "float32"]), default=None,
              help="Input/output tensor type (default int8 for --int8, float32 otherwise).")
@click.option("-o", "--output", type=str, default=None, help="Output .tflite path.")
@click.option("--android-demo", "android_demo", type=str, default=None, metavar="DIR",
              help="Also copy the model, metadata and labels into this Android demo app (android_demo/).")
@click.option("--no-gpu-run", is_flag=True,
              help="Do not run the file on LiteRT's GPU accelerator against XNNPACK (it runs where this "
                   "machine has a Vulkan device; see `edgevit check --help`).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of a table.")
@user_errors
def convert_command(model, precision, weights, input_size, num_classes, calib_dir, calib_samples,
                    io_dtype, output, android_demo, no_gpu_run, as_json):
    """Convert MODEL (a registered name or a .keras file) to a validated .tflite file."""
    from edgevit.export.pipeline import ExportOptions, Progress, check_options, export

    from_file = model.endswith(".keras")
    opts = ExportOptions(precision=precision, io_dtype=io_dtype, calib_dir=calib_dir,
                         calib_samples=calib_samples, output=output,
                         weights_label=weights or (model if from_file else "random-init"),
                         recalibrate_batchnorm=weights is None and not from_file,
                         diagnose_below_cosine=0.98, **({"gpu_images": 0} if no_gpu_run else {}))
    check_options(opts)  # before the model is built, not after converting
    from edgevit.saving import check_model_file, existing_file

    if from_file:
        check_model_file(model)
    if weights is not None:
        existing_file(weights, "Weights file")
    if android_demo is not None:
        from edgevit.export.android_bundle import check_demo_folder

        check_demo_folder(android_demo)
    import_tensorflow_quietly()
    from edgevit.export.report import print_report
    from edgevit.saving import resolve_model

    progress = Progress(enabled=True)
    progress.step(f"Building {model}")
    keras_model, spec = resolve_model(model, num_classes=num_classes, input_size=input_size, weights=weights)
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


def _print_bundle(result: dict, demo_dir: str) -> None:
    assets = result["assets"]
    click.echo(f"Android demo: {assets['model']}, {assets['metadata']} and {assets['labels']} written.")
    click.echo(f"  Build and install: cd {demo_dir} && ./gradlew installDebug   (see {demo_dir}/README.md)")


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
