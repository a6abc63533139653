"""`edgevit finetune`, `edgevit qat` and `edgevit eval`."""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
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
    from edgevit.data.folders import find_dataset

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
    from edgevit.train.checkpoints import remove_checkpoint

    try:
        save_model(model, out)
    except EdgevitError as err:
        raise EdgevitError(f"{err} The trained model stays in the checkpoint {checkpoint!r}: rerun the command with "
                           f"--checkpoint-dir {checkpoint} (and another -o) to save it without training again.") \
            from None
    remove_checkpoint(checkpoint)


def _kept_epoch(history: list[dict]) -> dict:
    """Which epoch's weights the output holds (the last) and, when an
    earlier epoch scored higher on the validation images, which one and why
    it is not the one kept."""
    if not history or "val_top1" not in history[-1]:
        return {}
    last = history[-1]
    best = max(history, key=lambda record: record["val_top1"])  # the first of equals
    kept = {"kept_epoch": last["epoch"], "best_val_epoch": best["epoch"]}
    note = f"the last epoch's weights (epoch {last['epoch']}, val top-1 {last['val_top1']})"
    if best["val_top1"] > last["val_top1"]:
        note += (f"; epoch {best['epoch']} scored higher ({best['val_top1']}), but the run ends where its "
                 "learning-rate schedule does, and a model chosen by its validation images would make their top-1 "
                 f"an optimistic estimate (to stop earlier, train with --epochs {best['epoch']})")
    return {**kept, "kept": note}


def _run(command: str, spec, classes: list[str], size: int, sizes: list[int], steps_per_epoch: int | None,
         mixed_precision: bool = False) -> dict:
    """What a training run is, as its checkpoint records it."""
    run = {"command": command, "model": spec.name, "input_size": size, "classes": list(classes), "sizes": list(sizes)}
    if steps_per_epoch:
        run["steps_per_epoch"] = steps_per_epoch
    if mixed_precision:
        run["mixed_precision"] = True
    return run


def _start_strategy(worker_timeout: float):
    """TensorFlow imported and the training strategy made, before any op
    runs (see :mod:`edgevit.train.distribute`)."""
    import_tensorflow_quietly()
    from edgevit.train.distribute import strategy_for_environment

    return strategy_for_environment(worker_timeout)


@contextmanager
def _training(strategy, checkpoint: str, run: dict):
    """The checkpoint folder held by this run (the chief's), another run's
    checkpoint refused before any image is read; a worker that stops
    answering ends the run as one error line."""
    from edgevit.train.checkpoints import checkpoint_lock, checkpoint_state
    from edgevit.train.distribute import is_chief, worker_failures

    with worker_failures(strategy):
        if not is_chief(strategy):
            yield
            return
        with checkpoint_lock(checkpoint):
            checkpoint_state(checkpoint, run)
            yield


def _common_options(lr: float):
    """The options finetune and qat share; ``lr`` is the command's default learning rate."""
    from edgevit.train.distribute import WORKER_TIMEOUT

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
        click.option("--steps-per-epoch", type=click.IntRange(1, 10**9), default=None,
                     help="Epochs of this many steps, each of a fresh random order of the images (default: every "
                          "image once an epoch)."),
        click.option("--batch-size", type=click.IntRange(1, 4096), default=32, show_default=True,
                     help="Images per step, over every device and worker together."),
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
                          "once OUTPUT is saved). Across workers (TF_CONFIG) only the chief uses it."),
        click.option("--worker-timeout", type=click.FloatRange(1, 86400), default=WORKER_TIMEOUT, show_default=True,
                     metavar="SECONDS",
                     help="Across workers (TF_CONFIG): how long a worker waits for the others to start before the "
                          "run ends with an error (a worker lost later ends the run within a minute)."),
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
@click.option("--mixed-precision", is_flag=True,
              help="Compute in float16 with float32 weights and a scaled loss (for GPUs with float16 units; off "
                   "by default). The saved model computes in float32.")
@click.option("-o", "--output", required=True, help="Output .keras file (an existing one only with --overwrite).")
@user_errors
def finetune_command(model, data_dir, weights, epochs, steps_per_epoch, batch_size, lr, input_size, val_split,
                     checkpoint_dir, worker_timeout, as_json, overwrite, multiscale, mixed_precision, output):
    """Fine-tune MODEL (a registered name or a .keras file) on an image folder."""
    started = time.perf_counter()
    out, checkpoint = _check_output(output, [model, weights], checkpoint_dir)
    refuse_existing([out], overwrite)
    dataset = _check_inputs(data_dir, val_split, weights)
    strategy = _start_strategy(worker_timeout)
    from edgevit.export.memory import memory_of
    from edgevit.progress import Progress
    from edgevit.registry import create_model
    from edgevit.train.distribute import is_chief
    from edgevit.train.loop import TrainConfig, Trainer
    from edgevit.train.precision import mixed_precision_copy
    from edgevit.train.prepare import build_model, first_images, load_data, val_metrics

    progress = Progress(enabled=not as_json)
    sizes = multiscale or []
    with strategy.scope():
        keras_model, spec = build_model(model, dataset.classes, weights=weights, input_size=input_size, log=log,
                                        sizes=sizes)
    size = int(keras_model.inputs[0].shape[1])
    run = _run("finetune", spec, dataset.classes, size, sizes, steps_per_epoch, mixed_precision)
    # BatchNorm estimation runs batches as large as training's: the stage's need is checked before it
    with _training(strategy, checkpoint, run), memory_of("training", keras_model, batch_size):
        train, val = load_data(dataset, spec, size, sizes, log)
        with strategy.scope():
            if weights is None and not (model.endswith(".keras") or Path(model).is_file()):
                from edgevit.models.batchnorm import recalibrate_batchnorm

                progress.step("No weights given: estimating BatchNorm statistics on the training images")
                images = np.concatenate(first_images(train, size, 64))
                with progress.bar("BatchNorm statistics", len(images), "images") as advance:
                    recalibrate_batchnorm(keras_model, images, on_batch=advance)
            classes = len(dataset.classes)

            def build(s):
                built = create_model(spec.name, num_classes=classes, input_size=s)
                return mixed_precision_copy(built) if mixed_precision else built

            trained = mixed_precision_copy(keras_model) if mixed_precision else keras_model
        cfg = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, sizes=sizes, steps_per_epoch=steps_per_epoch,
                          warmup_epochs=min(1.0, epochs / 10), checkpoint_dir=checkpoint, run=run,
                          mixed_precision=mixed_precision, worker_timeout=worker_timeout)
        trainer = Trainer(trained, build, size, cfg, strategy, log=progress.step, progress=progress)
        history = trainer.fit(train, val_metrics(val, size, strategy, progress), started)
        if mixed_precision:
            keras_model.set_weights(trained.get_weights())  # the float32 model is saved
        kept = _kept_epoch(history)
        if is_chief(strategy):
            progress.step(f"Saving {out}" + (f": {kept['kept']}" if kept else ""))
            _save_trained(keras_model, out, checkpoint)
    result = {"model": spec.name, "output": str(out), "classes": dataset.classes, "input_size": size,
              "multiscale": sizes, "mixed_precision": mixed_precision, **_run_facts(trainer, train),
              "history": history, "val_top1": history[-1].get("val_top1") if history else None, **kept}
    _print_result(result, as_json, strategy)


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
def qat_command(model, data_dir, weights, epochs, steps_per_epoch, batch_size, lr, input_size, val_split,
                checkpoint_dir, worker_timeout, as_json, overwrite, calib_batches, export_int8, output):
    """Quantization-aware training of MODEL (a .keras file or a registered name) on an image folder.

    Its validation top-1 is the fake-quant model's, as QAT frameworks measure it while training; the int8
    file's own comes from `edgevit eval` of the file (see --export)."""
    started = time.perf_counter()
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
    strategy = _start_strategy(worker_timeout)
    from edgevit.export.memory import memory_of
    from edgevit.progress import Progress
    from edgevit.quantize.qat import calibrate, quantize_model
    from edgevit.saving import set_class_names
    from edgevit.train.distribute import is_chief
    from edgevit.train.loop import TrainConfig, Trainer
    from edgevit.train.prepare import build_model, first_images, load_data, val_metrics

    progress = Progress(enabled=not as_json)
    with strategy.scope():
        keras_model, spec = build_model(model, dataset.classes, weights=weights, input_size=input_size, log=log)
    size = int(keras_model.inputs[0].shape[1])
    run = _run("qat", spec, dataset.classes, size, [], steps_per_epoch)
    # calibration and validation run batches as large as training's: the stage's need is checked before them
    with _training(strategy, checkpoint, run), memory_of("quantization-aware training", keras_model, batch_size):
        train, val = load_data(dataset, spec, size, [], log)
        # the fake-quant graph alone: the exact kernel arithmetic's first call took 35-50 s, this ~12 s (issue 40)
        evaluate = val_metrics(val, size, strategy, progress, kernel_arithmetic=False)
        float_top1 = evaluate(keras_model)["val_top1"]
        progress.step(f"Float model: val top-1 {float_top1}")
        # every worker calibrates on the same images; training starts from the chief's ranges
        calib = first_images(train, size, calib_batches * batch_size, seed=0, batch_size=batch_size)
        progress.step(f"Rewriting {spec.name} with fake quantization at every int8 tensor")
        with strategy.scope():
            qat = quantize_model(keras_model, input_range=spec.preprocessing_at(size).value_range)
            set_class_names(qat, dataset.classes)
            progress.step(f"Calibrating the activation ranges of the QAT model on {len(calib)} batches")
            with progress.bar("calibrating", len(calib), "batches") as advance:
                calibrate(qat, calib, on_batch=advance)
        before = evaluate(qat)["val_top1"]
        progress.step(f"QAT model after range calibration: val top-1 {before} (fake quantization)")
        cfg = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, warmup_epochs=0.0,
                          steps_per_epoch=steps_per_epoch, checkpoint_dir=checkpoint, run=run,
                          worker_timeout=worker_timeout)
        trainer = Trainer(qat, None, size, cfg, strategy, log=progress.step, progress=progress)
        history = trainer.fit(train, evaluate, started)
        kept = _kept_epoch(history)
        if is_chief(strategy):
            progress.step(f"Saving {out}" + (f": {kept['kept']}" if kept else ""))
            _save_trained(qat, out, checkpoint)
    result = {"model": spec.name, "output": str(out), "classes": dataset.classes, "input_size": size,
              "float_val_top1": float_top1, "qat_val_top1_calibrated": before, **_run_facts(trainer, train),
              "history": history, "val_top1": history[-1].get("val_top1") if history else before,
              "val_top1_of": FAKE_QUANT_TOP1, **kept}
    if export_int8 and is_chief(strategy):
        from edgevit.export.pipeline import ExportOptions, export

        # The trained ranges quantize the file; the images validate it.
        opts = ExportOptions(precision="int8", output=str(export_files.model), weights_label=str(out),
                             calib_dir=str(Path(data_dir) / "val") if (Path(data_dir) / "val").is_dir() else data_dir)
        exported = export(qat, spec, opts, progress)
        result["export"] = {"file": str(exported.files.model), "agreement": exported.agreement,
                            "probability_agreement": exported.probability_agreement,
                            "checks": [c.to_dict() for c in exported.checks], "verdict": exported.verdict.to_dict()}
    _print_result(result, as_json, strategy)


def _run_facts(trainer, train) -> dict:
    """What the report says of the run besides its history."""
    from edgevit.train.distribute import workers

    skipped = train.tally
    return {"replicas": trainer.strategy.num_replicas_in_sync, "workers": workers(trainer.strategy),
            "steps_per_epoch": trainer.cfg.steps_per_epoch, "seconds_to_first_step": trainer.seconds_to_first_step,
            "unreadable_skipped": len(skipped), "skipped_reasons": skipped.counts()}


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


def _print_result(result: dict, as_json: bool, strategy) -> None:
    """The result table (or JSON) on standard output; a worker other than
    the chief prints one line on standard error instead."""
    from edgevit.train.distribute import is_chief

    if not is_chief(strategy):
        click.echo(f"> This worker's part is done; the chief writes {result['output']} and its report.", err=True)
        return
    if as_json:
        print_json(result)
        return
    rows = [[k, v] for k, v in result.items()
            if k not in ("history", "export", "classes", "skipped_reasons", "kept")]
    rows.append(["classes", ", ".join(result["classes"][:10])])
    if "export" in result:
        a = result["export"]["agreement"]
        rows += [["int8 file", result["export"]["file"]],
                 ["int8 top-1 agreement", a["top1_agreement"]], ["int8 cosine mean", round(a["cosine_mean"], 5)]]
    print_table(None, ["field", "value"], rows)
    if "export" in result:
        verdict = result["export"]["verdict"]
        click.echo(f"why: {verdict['why']}.\nnext: {verdict['next']}.\n{verdict['text']}")
