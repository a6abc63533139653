"""`edgevit import-weights`: an official PyTorch checkpoint -> a Keras weights file (or model)."""
from __future__ import annotations

import click

from edgevit.cli.options import InputSize, classifier_classes, overwrite_option
from edgevit.cli.output import print_json, print_table, user_errors
from edgevit.converters.api import SOURCES
from edgevit.native_output import import_tensorflow_quietly, native_output_captured
from edgevit.registry import get_spec
from edgevit.writing import refuse_existing


@click.command("import-weights")
@click.argument("checkpoint")
@click.option("--model", "model_name", required=True, help="edgevit variant, e.g. mobilevit_v3_xs.")
@click.option("-o", "--output", type=str, default=None,
              help="Output NAME.weights.h5, or NAME.keras for a model whose checkpoints need a builder option "
                   "(ml-cvnets' v2 segmenters, the v2-based MobileViTv3 ones) (default: MODEL.weights.h5 in the "
                   "current folder).")
@overwrite_option
@click.option("--source", type=click.Choice(["auto", *SOURCES]), default="auto", show_default=True,
              help="Checkpoint naming (auto: detected from the tensor names).")
@click.option("--num-classes", type=int, default=None, callback=classifier_classes,
              help="Classifier classes (default: the checkpoint's).")
@click.option("--input-size", type=InputSize(), default=None,
              help="Square input size; position embeddings are resampled to it (default: the variant's).")
@click.option("--trained-on", "channel_order", type=click.Choice(["auto", "rgb", "bgr"], case_sensitive=False),
              default="auto", show_default=True,
              help="Channel order of the checkpoint's training images (auto: BGR for Apple cvnets v0.1 MobileViT v1 "
                   "and the v1-based MobileViTv3 files, RGB otherwise); BGR checkpoints get their stem's input "
                   "channels reversed, so the model takes RGB like every edgevit model.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@user_errors
def import_weights_command(checkpoint, model_name, output, overwrite, source, num_classes, input_size, channel_order,
                           as_json):
    """Import CHECKPOINT (timm / cvnets / MobileViTv3 .pth/.pt/.bin/.safetensors,
    classifiers and DeepLabV3 segmenters, Hugging Face CvT and MobileViT
    segmenters, official PVT v2 / Swin / CSWin / T2T-ViT releases) into
    edgevit MODEL and write a .weights.h5 file for `edgevit convert MODEL --weights FILE`
    (or a .keras model for `edgevit convert FILE`, which ml-cvnets' v2
    segmenters and the v2-based MobileViTv3 ones need: their dilated blocks
    are a build option).

    PyTorch files are read with torch's weights-only loader: Python objects
    besides tensors are not unpickled, and code a file asks to run is never
    run. A zip checkpoint with a member that would inflate beyond 64 MiB and
    100x its stored size (a decompression bomb) is refused before torch
    reads it."""
    from pathlib import Path

    from edgevit.converters.checkpoints import check_checkpoint_file
    from edgevit.writing import check_writable

    output = output or f"{model_name}.weights.h5"
    check_writable([Path(output)])
    refuse_existing([Path(output)], overwrite)
    check_checkpoint_file(checkpoint)
    import_tensorflow_quietly()
    from edgevit.converters.api import import_weights

    with native_output_captured():  # TensorFlow's native start-up chatter
        result = import_weights(checkpoint, model_name, output, source=source, num_classes=num_classes,
                                input_size=input_size,
                                channel_order=None if channel_order == "auto" else channel_order.upper())
    report = dict(result.report)
    report["ignored"] = len(report["ignored"])  # buffers such as num_batches_tracked
    if as_json:
        print_json(report)
        return
    rows = [[k, v] for k, v in report.items() if v not in (None, [], "", 0, {})]
    print_table(f"Imported {checkpoint}", ["field", "value"], rows)
    extra = f" --input-size {report['input_size']}" if input_size else ""
    default_classes = get_spec(model_name).num_classes
    extra += f" --num-classes {report['num_classes']}" if report["num_classes"] != default_classes else ""
    if report["output"].endswith(".keras"):  # the model file rebuilds itself, options and all
        click.echo(f"Next: edgevit convert --int8 {report['output']}")
        return
    click.echo(f"Next: edgevit convert --int8 {model_name} --weights {report['output']}{extra}")
