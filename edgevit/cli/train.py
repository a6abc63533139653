"""`edgevit finetune`, `edgevit qat` and `edgevit eval`."""
from __future__ import annotations

import os
from pathlib import Path

import click
import numpy as np

from edgevit.cli.options import (IMAGENET_DOWNLOAD, InputSize, InputSizes, leads_somewhere, open_fraction,
                                 overwrite_option, positive_learning_rate, refuse_existing)
from edgevit.cli.output import log, print_json, print_table, user_errors
from edgevit.errors import EdgevitError
from edgevit.native_output import import_tensorflow_quietly

# QAT starts from a trained model and only has to adapt it to the int8 grids.
# On hymenoptera (mobilevit_v3_xxs, 160 px, 242 train images, 10 QAT epochs)
# lr 2e-4 lost 3.9 points of val top-1 from the calibrated model while the
# training set was fitted further; 2e-5 kept it (docs/training.md).
QAT_LR = 2e-5
FINETUNE_LR = 1e-3
EPOCHS = 10
# what the val top-1 of `edgevit qat` measures
FAKE_QUANT_TOP1 = "the fake-quant model (the int8 file's own: edgevit eval FILE.tflite)"


def _check_output(output: str, inputs: list[str | None], checkpoint_dir: str | None) -> tuple[Path, str]:
    """The output .keras path and the checkpoint folder, checked before any
    work: the output must be writable (and its default checkpoint folder
    OUTPUT.ckpt makeable) and must not be one of the command's ``inputs``,
    which training would overwrite."""
    from edgevit.writing import check_folder_writable, check_writable

    out = Path(output)
    if out.suffix != ".keras":
        raise EdgevitError(f"Output {output!r} must end in .keras.")
    checkpoint = checkpoint_dir or str(out) + ".ckpt"
    check_writable([out], folders=[] if checkpoint_dir else [Path(checkpoint)])
    if checkpoint_dir:
        check_folder_writable(Path(checkpoint_dir), "Checkpoint folder")
    for given in inputs:
        if given is not None and _same_file(Path(given), out):
            raise EdgevitError(f"-o {output} is the input {given}: the trained model would overwrite it; "
                               "choose another -o.")
    return out, checkpoint


def _check_inputs(data_dir: str, val_split: float | None, weights: str | None):
    """The dataset's layout and the weights file, checked before TensorFlow
    loads (seconds) and the model is built."""
    from edgevit.pretrained import is_imagenet
    from edgevit.saving import existing_file
    from edgevit.train.data import find_dataset

    if weights is not None and not is_imagenet(weights):
        existing_file(weights, "Weights file")
    return find_dataset(data_dir, val_split=val_split)


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _save_trained(model, out: Path, checkpoint: str) -> None:
    """Save the trained model, then remove its checkpoint; when the save
    fails, the checkpoint stays and the error says how to use it."""
    from edgevit.saving import save_model
    from edgevit.train.loop import remove_checkpoint

    try:
        save_model(model, out)
    except EdgevitError as err:
        raise EdgevitError(f"{err} The trained model stays in the checkpoint {checkpoint!r}: rerun the command with "
                           f"--checkpoint-dir {checkpoint} (and another -o) to save it without training again.") \
            from None
    remove_checkpoint(checkpoint)


def _run(command: str, spec, classes: list[str], size: int, sizes: list[int]) -> dict:
    """What a training run is, as its checkpoint records it."""
    return {"command": command, "model": spec.name, "input_size": size, "classes": list(classes),
            "sizes": list(sizes)}


def _common_options(lr: float):
    """The options finetune and qat share; ``lr`` is the command's default learning rate."""
    options = [
        click.option("--data", "data_dir", required=True, metavar="DIR", callback=leads_somewhere,
                     help="Image folder: DIR/train/<class>/*, DIR/val/<class>/* (or DIR/<class>/* with --val-split). "
                          "The class folders' names become the model's labels: a name that is not valid UTF-8 "
                          "or spans lines is refused (rename the folder), not re-encoded."),
        click.option("--weights", default=None,
                     help="Start from these weights (.weights.h5 or .keras), or `imagenet`: the official ImageNet "
                          f"weights ({IMAGENET_DOWNLOAD}), with a new classifier when DIR has another number of "
                          "classes."),
        click.option("--epochs", type=click.IntRange(1, 10000), default=EPOCHS, show_default=True),
        click.option("--batch-size", type=click.IntRange(1, 4096), default=32, show_default=True),
        click.option("--lr", type=float, default=lr, show_default=True, callback=positive_learning_rate,
                     help="Peak learning rate (AdamW, cosine decay)."),
        click.option("--input-size", type=InputSize(), default=None,
                     help="Training resolution (default: the model's)."),
        click.option("--val-split", type=float, default=None, callback=open_fraction,
                     help="Hold out this fraction when DIR has no train/val folders (default 0.1)."),
        click.option("--checkpoint-dir", default=None,
                     help="Checkpoint every epoch here; rerunning the same run with it resumes, another run is "
                          "refused, and so is any run while one uses it (it holds a lock file there, which the "
                          "system releases when that run ends, however it ends) (default: OUTPUT.ckpt/, removed "
                          "once OUTPUT is saved)."),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
        overwrite_option,
    ]

    def decorate(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


@click.command("finetune")
@click.argument("model")
@_common_options(lr=FINETUNE_LR)
@click.option("--multiscale", type=InputSizes(), default=None,
              help="Multi-scale sampler over these resolutions, e.g. 160,192,224,256 (batch size scaled per size).")
@click.option("-o", "--output", required=True, help="Output .keras file (an existing one only with --overwrite).")
@user_errors
def finetune_command(model, data_dir, weights, epochs, batch_size, lr, input_size, val_split, checkpoint_dir,
                     as_json, overwrite, multiscale, output):
    """Fine-tune MODEL (a registered name or a .keras file) on an image folder."""
    out, checkpoint = _check_output(output, [model, weights], checkpoint_dir)
    refuse_existing([out], overwrite)
    dataset = _check_inputs(data_dir, val_split, weights)
    import_tensorflow_quietly()
    from edgevit.export.memory import memory_of
    from edgevit.progress import Progress
    from edgevit.registry import create_model
    from edgevit.train.loop import TrainConfig, Trainer, checkpoint_lock, checkpoint_state
    from edgevit.train.prepare import build_model, load_data, val_metrics

    progress = Progress(enabled=not as_json)
    sizes = multiscale or []
    keras_model, spec = build_model(model, dataset.classes, weights=weights, input_size=input_size, log=log,
                                    sizes=sizes)
    size = int(keras_model.inputs[0].shape[1])
    run = _run("finetune", spec, dataset.classes, size, sizes)
    with checkpoint_lock(checkpoint):
        checkpoint_state(checkpoint, run)  # another run's checkpoint is refused before the images load
        train, val, skipped = load_data(dataset, spec, size, sizes, log)
        if weights is None and not (model.endswith(".keras") or Path(model).is_file()):
            from edgevit.models.batchnorm import recalibrate_batchnorm

            images = train.eval_batch(np.arange(min(len(train), 64)), size)
            progress.step("No weights given: estimating BatchNorm statistics on the training images")
            with progress.bar("BatchNorm statistics", len(images), "images") as advance:
                recalibrate_batchnorm(keras_model, images, on_batch=advance)
        classes = len(dataset.classes)
        cfg = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, sizes=sizes,
                          warmup_epochs=min(1.0, epochs / 10), checkpoint_dir=checkpoint, run=run)
        trainer = Trainer(keras_model, lambda s: create_model(spec.name, num_classes=classes, input_size=s),
                          size, cfg, log=progress.step, progress=progress)
        with memory_of("training", keras_model, batch_size):
            history = trainer.fit(train, val_metrics(val, size, progress))
        progress.step(f"Saving {out}")
        _save_trained(keras_model, out, checkpoint)
    result = {"model": spec.name, "output": str(out), "classes": dataset.classes, "input_size": size,
              "multiscale": sizes, "unreadable_skipped": len(skipped), "history": history,
              "val_top1": history[-1].get("val_top1") if history else None}
    _print_result(result, as_json)


@click.command("qat")
@click.argument("model")
@_common_options(lr=QAT_LR)
@click.option("--calib-batches", type=click.IntRange(1, 1000), default=8, show_default=True,
              help="Batches that initialise the activation ranges.")
@click.option("--export", "export_int8", is_flag=True,
              help="Also convert to int8 (trained ranges) and validate: OUTPUT_int8.tflite beside OUTPUT.keras, as "
                   "`edgevit convert --int8 OUTPUT.keras` names it.")
@click.option("-o", "--output", required=True,
              help="Output .keras file, the QAT model (an existing one only with --overwrite).")
@user_errors
def qat_command(model, data_dir, weights, epochs, batch_size, lr, input_size, val_split, checkpoint_dir,
                as_json, overwrite, calib_batches, export_int8, output):
    """Quantization-aware training of MODEL (a .keras file or a registered name) on an image folder.

    Its validation top-1 is the fake-quant model's, as QAT frameworks measure it while training; the int8
    file's own comes from `edgevit eval` of the file (see --export)."""
    out, checkpoint = _check_output(output, [model, weights], checkpoint_dir)
    outputs = [out]
    if export_int8:
        from edgevit.export.pipeline import check_output_paths, default_output_path
        from edgevit.export.result import ExportFiles

        export_files = ExportFiles.beside(out.with_name(default_output_path(out.stem, "int8").name))
        check_output_paths(export_files)
        outputs += export_files.all()
    refuse_existing(outputs, overwrite)
    dataset = _check_inputs(data_dir, val_split, weights)
    import_tensorflow_quietly()
    from edgevit.export.memory import memory_of
    from edgevit.progress import Progress
    from edgevit.quantize.qat import calibrate, quantize_model
    from edgevit.saving import set_class_names
    from edgevit.train.loop import TrainConfig, Trainer, checkpoint_lock, checkpoint_state
    from edgevit.train.prepare import build_model, load_data, val_metrics

    progress = Progress(enabled=not as_json)
    keras_model, spec = build_model(model, dataset.classes, weights=weights, input_size=input_size, log=log)
    size = int(keras_model.inputs[0].shape[1])
    run = _run("qat", spec, dataset.classes, size, [])
    with checkpoint_lock(checkpoint):
        checkpoint_state(checkpoint, run)  # another run's checkpoint is refused before the images load
        train, val, skipped = load_data(dataset, spec, size, [], log)
        # the fake-quant graph alone: the exact kernel arithmetic's first call took 35-50 s, this ~12 s (issue 40)
        evaluate = val_metrics(val, size, progress, kernel_arithmetic=False)
        float_top1 = evaluate(keras_model)["val_top1"]
        progress.step(f"Float model: val top-1 {float_top1}")
        rng = np.random.default_rng(0)
        order = rng.permutation(len(train))
        calib = [train.eval_batch(order[i:i + batch_size], size)
                 for i in range(0, min(len(train), calib_batches * batch_size), batch_size)]
        progress.step(f"Rewriting {spec.name} with fake quantization at every int8 tensor")
        qat = quantize_model(keras_model, input_range=spec.preprocessing_at(size).value_range)
        set_class_names(qat, dataset.classes)
        progress.step(f"Calibrating the activation ranges of the QAT model on {len(calib)} batches")
        with progress.bar("calibrating", len(calib), "batches") as advance:
            calibrate(qat, calib, on_batch=advance)
        before = evaluate(qat)["val_top1"]
        progress.step(f"QAT model after range calibration: val top-1 {before} (fake quantization)")
        cfg = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, warmup_epochs=0.0,
                          checkpoint_dir=checkpoint, run=run)
        trainer = Trainer(qat, None, size, cfg, log=progress.step, progress=progress)
        with memory_of("training", qat, batch_size):
            history = trainer.fit(train, evaluate)
        progress.step(f"Saving {out}")
        _save_trained(qat, out, checkpoint)
    result = {"model": spec.name, "output": str(out), "classes": dataset.classes, "input_size": size,
              "float_val_top1": float_top1, "qat_val_top1_calibrated": before, "history": history,
              "val_top1": history[-1].get("val_top1") if history else before, "val_top1_of": FAKE_QUANT_TOP1,
              "unreadable_skipped": len(skipped)}
    if export_int8:
        from edgevit.export.pipeline import ExportOptions, export

        # The trained ranges quantize the file; the images validate it.
        opts = ExportOptions(precision="int8", output=str(export_files.model), weights_label=str(out),
                             calib_dir=str(Path(data_dir) / "val") if (Path(data_dir) / "val").is_dir() else data_dir)
        exported = export(qat, spec, opts, progress)
        result["export"] = {"file": str(exported.files.model), "agreement": exported.agreement,
                            "probability_agreement": exported.probability_agreement,
                            "checks": [c.to_dict() for c in exported.checks], "verdict": exported.verdict.to_dict()}
    _print_result(result, as_json)


@click.command("eval")
@click.argument("model_file", metavar="MODEL.keras|MODEL.tflite")
@click.option("--data", "data_dir", required=True, metavar="DIR", callback=leads_somewhere,
              help="Image folder: every image of DIR/val/<class>/* when DIR has val/, else of DIR/<class>/*.")
@click.option("--threads", type=click.IntRange(1, 64), default=2, show_default=True, help="LiteRT threads.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@user_errors
def eval_command(model_file, data_dir, threads, as_json):
    """Top-1/top-5 accuracy and a confusion summary of a .keras or .tflite model
    on every image of an image folder (class folders matched to the model's
    classes by name)."""
    from edgevit.evaluate import evaluate
    from edgevit.progress import Progress

    report = evaluate(model_file, data_dir, threads=threads, progress=Progress(enabled=not as_json))
    if as_json:
        print_json(report)
        return
    k5 = next(k for k in report if k.startswith("top") and k != "top1" and k != "top_confusions")
    skipped = ", ".join(f"{count} {reason}" for reason, count in report["skipped_reasons"].items())
    print_table(f"{report['model']} on {report['data']} ({report['split']})", ["metric", "value"],
                [["images scored", f"{report['images']} of {report['found']}"], ["top-1", report["top1"]],
                 [k5.replace("top", "top-"), report[k5]],
                 ["unreadable skipped", report["unreadable_skipped"] if not skipped else skipped]])
    print_table("per class", ["class", "images", "top-1"],
                [[c, v["images"], v["top1"]] for c, v in report["per_class"].items()])
    if report["top_confusions"]:
        print_table("most confused", ["true", "predicted", "count"],
                    [[c["true"], c["predicted"], c["count"]] for c in report["top_confusions"]])


def _print_result(result: dict, as_json: bool) -> None:
    if as_json:
        print_json(result)
        return
    rows = [[k, v] for k, v in result.items() if k not in ("history", "export", "classes")]
    rows.append(["classes", ", ".join(result["classes"][:10])])
    if "export" in result:
        a = result["export"]["agreement"]
        rows += [["int8 file", result["export"]["file"]],
                 ["int8 top-1 agreement", a["top1_agreement"]], ["int8 cosine mean", round(a["cosine_mean"], 5)]]
    print_table(None, ["field", "value"], rows)
    if "export" in result:
        verdict = result["export"]["verdict"]
        click.echo(f"why: {verdict['why']}.\nnext: {verdict['next']}.\n{verdict['text']}")
