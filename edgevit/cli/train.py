"""`edgevit finetune`, `edgevit qat` and `edgevit eval`: their options and
how their results are shown. The runs themselves are
:mod:`edgevit.train.run`'s."""
from __future__ import annotations

from pathlib import Path

import click

from edgevit.cli.options import (
    IMAGENET_DOWNLOAD,
    InputSize,
    InputSizes,
    Seconds,
    leads_somewhere,
    open_fraction,
    overwrite_option,
    positive_learning_rate,
)
from edgevit.cli.output import log, print_json, print_table, user_errors
from edgevit.evaluate import MEDIAPIPE_NMS, NMS_CHOICES
from edgevit.train.run import EPOCHS, FINETUNE_LR, QAT_LR, RunOptions


def _common_options(lr: float):
    """The options finetune and qat share; ``lr`` is the command's default learning rate."""
    from edgevit.train.distribute import WORKER_TIMEOUT

    options = [
        click.option("--data", "data_dir", required=True, metavar="DIR", callback=leads_somewhere,
                     help="Image folder: DIR/train/<class>/*, DIR/val/<class>/* (or DIR/<class>/* with --val-split); "
                          "a segmentation folder for a segmenter, a detection folder (COCO or VOC) for a detector. "
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
        click.option("--worker-timeout", type=Seconds(1, 86400), default=WORKER_TIMEOUT, show_default=True,
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
    from edgevit.progress import Progress
    from edgevit.train.run import Finetune

    options = RunOptions(model, data_dir, output, weights, epochs, steps_per_epoch, batch_size, lr, input_size,
                         val_split, checkpoint_dir, worker_timeout, overwrite)
    run = Finetune(options, multiscale, mixed_precision, progress=Progress(enabled=not as_json), log=log)
    _print_result(run.execute(), as_json, run.is_chief)


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
    from edgevit.progress import Progress
    from edgevit.train.run import QuantizationAwareTraining

    progress = Progress(enabled=not as_json)
    export_files = None
    if export_int8:
        from edgevit.export.pipeline import check_output_paths, default_output_path
        from edgevit.export.result import ExportFiles

        export_files = ExportFiles.beside(Path(output).with_name(default_output_path(Path(output).stem, "int8").name))
        check_output_paths(export_files)
    options = RunOptions(model, data_dir, output, weights, epochs, steps_per_epoch, batch_size, lr, input_size,
                         val_split, checkpoint_dir, worker_timeout, overwrite,
                         other_outputs=export_files.all() if export_files else [])
    run = QuantizationAwareTraining(options, calib_batches, progress=progress, log=log)
    result = run.execute()
    if export_files is not None and run.is_chief:
        result["export"] = _export_trained(run, export_files, progress)
    _print_result(result, as_json, run.is_chief)


def _export_trained(run, export_files, progress) -> dict:
    """Convert the QAT model to int8 (its trained ranges quantize the file)
    and validate the file on the dataset's images."""
    from edgevit.export.pipeline import ExportOptions, export

    data = Path(run.options.data_dir)
    opts = ExportOptions(precision="int8", output=str(export_files.model), weights_label=str(run.output),
                         calib_dir=str(data / "val") if (data / "val").is_dir() else str(data))
    exported = export(run.model, run.spec, opts, progress)
    return {"file": str(exported.files.model), "agreement": exported.agreement,
            "probability_agreement": exported.probability_agreement,
            "checks": [c.to_dict() for c in exported.checks], "verdict": exported.verdict.to_dict()}


@click.command("eval")
@click.argument("model_file", metavar="MODEL.keras|MODEL.tflite")
@click.option("--data", "data_dir", required=True, metavar="DIR", callback=leads_somewhere,
              help="Image folder: every image of DIR/val/<class>/* when DIR has val/, else of DIR/<class>/*; for "
                   "a segmenter, a segmentation folder (classes.txt, val/images and val/masks, or a VOC devkit); for "
                   "a detector, a detection folder (annotations/instances_val.json with val/, or a VOC devkit).")
@click.option("--threads", type=click.IntRange(1, 64), default=2, show_default=True, help="LiteRT threads.")
@click.option("--nms", type=click.Choice(NMS_CHOICES), default=MEDIAPIPE_NMS, show_default=True,
              help="A detector's suppression of overlapping boxes. mediapipe: what MediaPipe's ObjectDetector shows "
                   "(a raw file or a .keras model: one NMS over all classes at IoU 0.3, MediaPipe's fixed default; "
                   "a --add-postprocessing-op file: the op's own options, what every client shows). cvnets: "
                   "per-class NMS at IoU 0.5, as cvnets evaluates its SSD models (published figures; edgevit's "
                   "Android demo on a raw file).")
# edgevit.quantize.kernel_arithmetic.TARGET_KERNELS, spelled out: importing it here would load Keras for --help
@click.option("--int8-kernels", type=click.Choice(["x86", "arm64"]), default=None,
              help="A QAT .keras model computes the int8 SOFTMAX and BATCH_MATMUL of LiteRT's x86 or Arm64 kernels "
                   "(phones, Apple Silicon), whose roundings differ: what its int8 file computes there (default: "
                   "this machine's kernels).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@user_errors
def eval_command(model_file, data_dir, threads, nms, int8_kernels, as_json):
    """Top-1/top-5 accuracy and a confusion summary of a .keras or .tflite
    classifier on every image of an image folder (class folders matched to
    the model's classes by name); mIoU, per-class IoU and pixel accuracy of
    a segmenter on the val/ images of a segmentation folder; COCO mAP
    (0.5:0.95), AP50 and per-class AP of a detector on the val/ images of
    a detection folder."""
    from edgevit.evaluate import evaluate
    from edgevit.progress import Progress

    report = evaluate(model_file, data_dir, threads=threads, progress=Progress(enabled=not as_json), nms=nms,
                      int8_kernels=int8_kernels)
    if as_json:
        print_json(report)
        return
    skipped = ", ".join(f"{count} {reason}" for reason, count in report["skipped_reasons"].items())
    if report.get("task") == "detection":
        left_out = ", ".join(f"{count} {reason}" for reason, count in report["left_out"].items() if count)
        print_table(f"{report['model']} on {report['data']} (val)", ["metric", "value"],
                    [["images scored", f"{report['images']} of {report['found']}"], ["boxes", report["boxes"]],
                     ["mAP (IoU 0.5:0.95)", report["map"]], ["AP50", report["ap50"]], ["AP75", report["ap75"]],
                     ["NMS", _nms_summary(report["postprocessing"])],
                     ["unreadable skipped", report["unreadable_skipped"] if not skipped else skipped],
                     ["left out of the annotations", left_out or 0]])
        print_table("per class", ["class", "boxes", "AP"],
                    [[c, report["boxes_per_class"][c], ap] for c, ap in report["per_class_ap"].items()])
        return
    if report.get("task") == "segmentation":
        print_table(f"{report['model']} on {report['data']} (val)", ["metric", "value"],
                    [["images scored", f"{report['images']} of {report['found']}"],
                     ["pixels scored", f"{report['pixels']:,}"], ["mIoU", report["miou"]],
                     ["pixel accuracy", report["pixel_accuracy"]],
                     ["unreadable skipped", report["unreadable_skipped"] if not skipped else skipped]])
        print_table("per class", ["class", "IoU"], [[c, v] for c, v in report["per_class_iou"].items()])
        return
    k5 = next(k for k in report if k.startswith("top") and k != "top1" and k != "top_confusions")
    print_table(f"{report['model']} on {report['data']} ({report['split']})", ["metric", "value"],
                [["images scored", f"{report['images']} of {report['found']}"], ["top-1", report["top1"]],
                 [k5.replace("top", "top-"), report[k5]],
                 ["unreadable skipped", report["unreadable_skipped"] if not skipped else skipped]])
    print_table("per class", ["class", "images", "top-1"],
                [[c, v["images"], v["top1"]] for c, v in report["per_class"].items()])
    if report["top_confusions"]:
        print_table("most confused", ["true", "predicted", "count"],
                    [[c["true"], c["predicted"], c["count"]] for c in report["top_confusions"]])


def _nms_summary(postprocessing: dict) -> str:
    return (f"{postprocessing['nms']}, IoU {postprocessing['iou_threshold']}, score > "
            f"{postprocessing['score_threshold']}, at most {postprocessing['max_detections']} ({postprocessing['as']})")


def _print_result(result: dict, as_json: bool, chief: bool) -> None:
    """The result table (or JSON) on standard output; a worker other than
    the chief prints one line on standard error instead."""
    if not chief:
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
