"""A training run, from a command's arguments to the saved model: what
`edgevit finetune` and `edgevit qat` (and the benchmarks) run.

:class:`TrainingRun` owns the order of the work, which is the same for both:

1. check the output and inputs, before TensorFlow loads (seconds): the
   output writable and not an input, the dataset's layout, the weights file;
2. start the tf.distribute strategy before any op runs, build the model in
   its scope;
3. hold the checkpoint folder (the chief's lock; another run's checkpoint
   refused before any image is read) and the stage's memory;
4. stream the data, prepare the model to train (what the command is for),
   fit, choose the kept epoch and, on the chief, save the model and remove
   its checkpoint.

:class:`Finetune` and :class:`QuantizationAwareTraining` fill in only what
is theirs: the model they train and how it is validated.
"""
from __future__ import annotations

import hashlib
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgevit.errors import EdgevitError
from edgevit.progress import Progress
from edgevit.writing import refuse_existing

# QAT starts from a trained model and only has to adapt it to the int8 grids.
# On hymenoptera (mobilevit_v3_xxs, 160 px, 242 train images, 10 QAT epochs)
# lr 2e-4 lost 3.9 points of val top-1 from the calibrated model while the
# training set was fitted further; 2e-5 kept it (docs/training.md).
QAT_LR = 2e-5
FINETUNE_LR = 1e-3
EPOCHS = 10
# what the val top-1 of `edgevit qat` measures
FAKE_QUANT_TOP1 = "the fake-quant model (the int8 file's own: edgevit eval FILE.tflite)"


@dataclass
class RunOptions:
    """What every training command takes."""
    model: str                 # a registered name or a .keras file
    data_dir: str
    output: str                # the .keras file the run writes
    weights: str | None = None
    epochs: int = EPOCHS
    steps_per_epoch: int | None = None
    batch_size: int = 32
    lr: float = FINETUNE_LR
    input_size: int | None = None
    val_split: float | None = None
    checkpoint_dir: str | None = None   # default: OUTPUT.ckpt
    worker_timeout: float | None = None
    overwrite: bool = False
    # outputs the command writes besides the model (qat --export): checked with it
    other_outputs: list[Path] = field(default_factory=list)


def check_output(output: str, inputs: list[str | None], checkpoint_dir: str | None) -> tuple[Path, str]:
    """The output .keras path and the checkpoint folder, checked before any
    work: the output must be writable (and its default checkpoint folder
    OUTPUT.ckpt makeable) and must not be one of the command's ``inputs``,
    which training would overwrite."""
    from edgevit.writing import check_folder_writable, check_writable

    out = Path(output)
    if out.suffix != ".keras":
        raise EdgevitError(f"Output {output!r} must end in .keras.")
    if checkpoint_dir is not None and _same_file(Path(checkpoint_dir), out):
        raise EdgevitError(f"-o {output} is also the --checkpoint-dir: the checkpoint folder and the trained model "
                           "cannot share a path (the save would fail after the training); choose another -o or "
                           "--checkpoint-dir.")
    checkpoint = checkpoint_dir or str(out) + ".ckpt"
    check_writable([out], folders=[] if checkpoint_dir else [Path(checkpoint)])
    if checkpoint_dir:
        check_folder_writable(Path(checkpoint_dir), "Checkpoint folder")
    for given in inputs:
        if given is not None and _same_file(Path(given), out):
            raise EdgevitError(f"-o {output} is the input {given}: the trained model would overwrite it; "
                               "choose another -o.")
    return out, checkpoint


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def file_identity(path: str | Path) -> str:
    """A file's name and the start of the SHA-256 of its content: which
    model or weights a run started from, whatever its name."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return f"{Path(path).name} sha256:{digest.hexdigest()[:16]}"


def kept_epoch(history: list[dict], metric: str = "val_top1") -> dict:
    """Which epoch's weights the output holds (the last) and, when an
    earlier epoch scored higher on the validation images (by ``metric``),
    which one and why it is not the one kept."""
    if not history or history[-1].get(metric) is None:
        return {}
    last = history[-1]
    sign = -1 if metric in LOWER_IS_BETTER else 1
    best = max(history, key=lambda record: sign * record[metric])  # the first of equals
    kept = {"kept_epoch": last["epoch"], "best_val_epoch": best["epoch"]}
    name = METRIC_NAMES.get(metric, metric)
    note = f"the last epoch's weights (epoch {last['epoch']}, {name} {last[metric]})"
    if sign * best[metric] > sign * last[metric]:
        note += (f"; epoch {best['epoch']} scored {'lower' if sign < 0 else 'higher'} ({best[metric]}), but the run "
                 f"ends where its "
                 f"learning-rate schedule does, and a model chosen by its validation images would make their {name} "
                 f"an optimistic estimate (to stop earlier, train with --epochs {best['epoch']})")
    return {**kept, "kept": note}


# how a run's log names its validation figure
METRIC_NAMES = {"val_top1": "val top-1", "val_miou": "val mIoU", "val_loss": "val loss"}
# validation figures of which less is better
LOWER_IS_BETTER = {"val_loss"}
# what a folder for each kind of model holds, and where it goes
FOLDER_KINDS = {
    "classifier": ("class folders", "class folders: DIR/train/<class>/*.jpg"),
    "segmenter": ("a segmentation folder (classes.txt, images and masks)",
                  "a segmentation folder: DIR/classes.txt, DIR/train/images + DIR/train/masks"),
    "detector": ("a detection folder (boxes)", "a detection folder: DIR/annotations/instances_train.json with "
                 "DIR/train/ images (COCO), or a VOC devkit (Annotations/, JPEGImages/, ImageSets/Main/)"),
}


def model_task(model_arg: str) -> str | None:
    """The task of a registered model name, or of the model a .keras file
    holds (from its description, before TensorFlow loads); None when the
    name is none of edgevit's."""
    from edgevit.registry import get_spec

    name = model_arg
    if model_arg.endswith(".keras") or Path(model_arg).is_file():
        import json

        from edgevit.saving import model_description

        name = json.loads(model_description(model_arg)).get("config", {}).get("name", "")
    try:
        return get_spec(name).task
    except EdgevitError:
        return None


class TrainingRun(ABC):
    """One run of a training command (see the module docstring). Making one
    checks its outputs and inputs; :meth:`execute` does the work and returns
    the result the command reports."""

    command = ""            # as the checkpoint records it
    memory_stage = ""       # the stage edgevit.memory estimates
    warmup = True           # a linear warm-up over the first tenth of the epochs (at most one)

    def __init__(self, options: RunOptions, progress: Progress | None = None, log: Callable[[str], None] = print):
        from edgevit.data.boxes import find_detection_dataset, is_detection_folder
        from edgevit.data.folders import find_dataset
        from edgevit.data.masks import find_segmentation_dataset, is_segmentation_folder
        from edgevit.registry import is_imagenet
        from edgevit.saving import existing_file
        from edgevit.train.objectives import Classification, Detection, Segmentation

        self.options, self.log = options, log
        self.progress = progress or Progress(enabled=False)
        self.started = time.perf_counter()
        self.output, self.checkpoint = check_output(options.output, [options.model, options.weights],
                                                    options.checkpoint_dir)
        refuse_existing([self.output, *options.other_outputs], options.overwrite)
        if options.weights is not None and not is_imagenet(options.weights):
            existing_file(options.weights, "Weights file")
        self.segments = is_segmentation_folder(options.data_dir)
        # a VOC devkit holds both masks and boxes: a detector reads its boxes
        self.detects = is_detection_folder(options.data_dir) and (
            not self.segments or model_task(options.model) == "detection")
        self.segments = self.segments and not self.detects
        if (self.segments or self.detects) and options.val_split is not None:
            raise EdgevitError(f"{options.data_dir} is a {'detection' if self.detects else 'segmentation'} folder, "
                               "whose val images validate the training: leave --val-split out.")
        if self.detects:
            self.dataset = find_detection_dataset(options.data_dir)
        elif self.segments:
            self.dataset = find_segmentation_dataset(options.data_dir)
        else:
            self.dataset = find_dataset(options.data_dir, val_split=options.val_split)
        # what validation reports and epochs are compared by
        self.metric = (Detection if self.detects else Segmentation if self.segments else Classification).metric
        self.strategy = None
        self.model = self.spec = None  # the saved model and its spec, once executed

    # -- what a command fills in -----------------------------------------------------------------
    def build(self, spec_sizes: list[int]):
        """(model, spec) to start from, built in the strategy's scope."""
        from edgevit.train.prepare import build_model

        o = self.options
        return build_model(o.model, self.dataset.classes, weights=o.weights, input_size=o.input_size, log=self.log,
                           sizes=spec_sizes)

    def sizes(self) -> list[int]:
        """Multi-scale resolutions ([]: the base size only)."""
        return []

    @abstractmethod
    def prepare(self, model, spec, size: int, train, val) -> tuple[object, Callable | None, Callable]:
        """(model to train, its builder at other sizes or None, evaluate(model) -> metrics)."""

    def saved_model(self, trained, model):
        """The model the output holds, from the trained one."""
        return trained

    def describe(self, spec, size: int) -> dict:
        """What this run is, as its checkpoint records it: a checkpoint of
        `qat A.keras` is no checkpoint of `qat B.keras`, whatever their model."""
        run = {"command": self.command, "model": spec.name, "input_size": size, "classes": list(self.dataset.classes),
               "sizes": list(self.sizes())}
        source = self.source()
        if source:
            run["source"] = source
        if self.options.steps_per_epoch:
            run["steps_per_epoch"] = self.options.steps_per_epoch
        return run

    def source(self) -> str | None:
        """The identity of the model file and the weights a run starts
        from (None: a registered model's random weights)."""
        from edgevit.registry import is_imagenet

        o = self.options
        parts = [file_identity(o.model)] if o.model.endswith(".keras") or Path(o.model).is_file() else []
        if o.weights is not None:
            parts.append("weights " + ("imagenet" if is_imagenet(o.weights) else file_identity(o.weights)))
        return "; ".join(parts) or None

    def agreed(self, run: dict) -> dict:
        """What every worker of a run across workers must share before step
        1: the run and every option that changes what it trains, the data by
        its file lists; the same keys on every worker."""
        o = self.options
        return {**run, "source": run.get("source"), "steps_per_epoch": o.steps_per_epoch, "epochs": o.epochs,
                "batch_size": o.batch_size, "lr": o.lr, "val_split": o.val_split, "data": self.dataset.fingerprint(),
                **self.config_options()}

    def facts(self) -> dict:
        """What the command's result says besides what every run's does."""
        return {}

    # -- the run ---------------------------------------------------------------------------------
    def start_strategy(self):
        """TensorFlow imported and the training strategy made, before any op
        runs (see :mod:`edgevit.train.distribute`)."""
        from edgevit.native_output import import_tensorflow_quietly
        from edgevit.train.distribute import WORKER_TIMEOUT, strategy_for_environment

        import_tensorflow_quietly()
        timeout = self.options.worker_timeout
        self.strategy = strategy_for_environment(WORKER_TIMEOUT if timeout is None else timeout)
        return self.strategy

    @property
    def is_chief(self) -> bool:
        from edgevit.train.distribute import is_chief

        return is_chief(self.strategy)

    @contextmanager
    def _held(self, run: dict):
        """The checkpoint folder held by this run (the chief's), another run's
        checkpoint refused before any image is read; a worker that stops
        answering ends the run as one error line."""
        from edgevit.train.checkpoints import checkpoint_lock, checkpoint_state
        from edgevit.train.distribute import worker_failures

        with worker_failures(self.strategy):
            if not self.is_chief:
                yield
                return
            with checkpoint_lock(self.checkpoint):
                checkpoint_state(self.checkpoint, run)
                yield

    def execute(self) -> dict:
        from edgevit.data.stream import scaled_batch_size
        from edgevit.memory import memory_of
        from edgevit.train.distribute import WORKER_TIMEOUT, agree_on_run, workers
        from edgevit.train.loop import TrainConfig, Trainer
        from edgevit.train.prepare import load_data

        o = self.options
        strategy = self.strategy or self.start_strategy()
        sizes = self.sizes()
        with strategy.scope():
            model, spec = self.build(sizes)
        self._check_task(model, spec)
        size = int(model.inputs[0].shape[1])
        run = self.describe(spec, size)
        # before anything is held or read: workers started with other commands refuse together, naming the field
        agree_on_run(strategy, self.agreed(run), WORKER_TIMEOUT if o.worker_timeout is None else o.worker_timeout)
        # calibration, BatchNorm estimation and validation run batches as large as training's: the stage's need
        # is checked before them (with --multiscale, at the resolution whose steps need the most)
        batches = {s: int(scaled_batch_size(o.batch_size, size, s)) for s in sizes} or None
        with self._held(run), memory_of(self.memory_stage, model, o.batch_size, batches):
            train, val = load_data(self.dataset, spec, size, sizes, self.progress.step)
            trained, build, evaluate = self.prepare(model, spec, size, train, val)
            cfg = TrainConfig(epochs=o.epochs, batch_size=o.batch_size, lr=o.lr, sizes=sizes,
                              steps_per_epoch=o.steps_per_epoch,
                              warmup_epochs=min(1.0, o.epochs / 10) if self.warmup else 0.0,
                              checkpoint_dir=self.checkpoint, run=run, worker_timeout=o.worker_timeout,
                              **self.config_options())
            trainer = Trainer(trained, build, size, cfg, strategy, log=self.progress.step, progress=self.progress)
            history = trainer.fit(train, evaluate, self.started)
            final = self.saved_model(trained, model)
            kept = kept_epoch(history, self.metric)
            if self.is_chief:
                self.progress.step(f"Saving {self.output}" + (f": {kept['kept']}" if kept else ""))
                self._save(final)
        self.model, self.spec = final, spec
        return {"model": spec.name, "output": str(self.output), "classes": self.dataset.classes, "input_size": size,
                **self.facts(), "replicas": strategy.num_replicas_in_sync, "workers": workers(strategy),
                "steps_per_epoch": o.steps_per_epoch, "seconds_to_first_step": trainer.seconds_to_first_step,
                "unreadable_skipped": len(train.tally), "skipped_reasons": train.tally.counts(),
                "history": history, self.metric: history[-1].get(self.metric) if history else None, **kept}

    def _check_task(self, model, spec) -> None:
        """A detector trains on a detection folder, a segmenter on a
        segmentation folder, a classifier on class folders."""
        from edgevit.models.ssdlite import is_detector

        kind = "detector" if is_detector(model) else "segmenter" if len(model.outputs[0].shape) == 4 else "classifier"
        folder = "detector" if self.detects else "segmenter" if self.segments else "classifier"
        if kind != folder:
            raise EdgevitError(f"{spec.name} is a {kind} and {self.options.data_dir} holds {FOLDER_KINDS[folder][0]}: "
                               f"it trains on {FOLDER_KINDS[kind][1]}.")

    def config_options(self) -> dict:
        """TrainConfig fields of this command's own."""
        return {}

    def _save(self, model) -> None:
        """Save the trained model, then remove its checkpoint; when the save
        fails, the checkpoint stays and the error says how to use it."""
        from edgevit.saving import save_model
        from edgevit.train.checkpoints import remove_checkpoint

        try:
            save_model(model, self.output)
        except EdgevitError as err:
            raise EdgevitError(f"{err} The trained model stays in the checkpoint {self.checkpoint!r}: rerun the "
                               f"command with --checkpoint-dir {self.checkpoint} (and another -o) to save it without "
                               "training again.") from None
        remove_checkpoint(self.checkpoint)


class Finetune(TrainingRun):
    """`edgevit finetune`: a float model trained on the images, optionally
    multi-scale and in mixed precision."""

    command = "finetune"
    memory_stage = "training"

    def __init__(self, options: RunOptions, multiscale: list[int] | None = None, mixed_precision: bool = False,
                 **kwargs):
        super().__init__(options, **kwargs)
        self.multiscale, self.mixed_precision = list(multiscale or []), mixed_precision

    def sizes(self) -> list[int]:
        return self.multiscale

    def describe(self, spec, size: int) -> dict:
        run = super().describe(spec, size)
        if self.mixed_precision:
            run["mixed_precision"] = True
        return run

    def config_options(self) -> dict:
        return {"mixed_precision": self.mixed_precision}

    def prepare(self, model, spec, size, train, val):
        from edgevit.registry import rebuild
        from edgevit.train.precision import mixed_precision_copy
        from edgevit.train.prepare import first_images, val_metrics

        o, progress = self.options, self.progress
        with self.strategy.scope():
            if o.weights is None and not (o.model.endswith(".keras") or Path(o.model).is_file()):
                from edgevit.models.batchnorm import recalibrate_batchnorm

                progress.step("No weights given: estimating BatchNorm statistics on the training images")
                images = np.concatenate(first_images(train, size, 64))
                with progress.bar("BatchNorm statistics", len(images), "images") as advance:
                    recalibrate_batchnorm(model, images, on_batch=advance)
            classes = len(self.dataset.classes)

            def build(s):
                built = rebuild(model, num_classes=classes, input_size=s)
                return mixed_precision_copy(built) if self.mixed_precision else built

            trained = mixed_precision_copy(model) if self.mixed_precision else model
        return trained, build, val_metrics(val, size, self.strategy, progress)

    def saved_model(self, trained, model):
        if self.mixed_precision:
            model.set_weights(trained.get_weights())  # the float32 model is saved
        return model

    def facts(self) -> dict:
        return {"multiscale": self.multiscale, "mixed_precision": self.mixed_precision}


class QuantizationAwareTraining(TrainingRun):
    """`edgevit qat`: the model rewritten with fake quantization at every
    int8 tensor, its ranges calibrated, then trained; validated on the
    fake-quant graph, as QAT frameworks measure it while training."""

    command = "qat"
    memory_stage = "quantization-aware training"
    warmup = False

    def __init__(self, options: RunOptions, calib_batches: int = 8, **kwargs):
        super().__init__(options, **kwargs)
        self.calib_batches = calib_batches
        self.scores: dict = {}

    def build(self, spec_sizes):
        from edgevit.train.prepare import build_model

        o = self.options
        return build_model(o.model, self.dataset.classes, weights=o.weights, input_size=o.input_size, log=self.log)

    def prepare(self, model, spec, size, train, val):
        from edgevit.quantize.qat import calibrate, quantize_model
        from edgevit.saving import set_class_names
        from edgevit.train.prepare import first_images, val_metrics

        o, progress = self.options, self.progress
        # the fake-quant graph alone: the exact kernel arithmetic's first call took 35-50 s, this ~12 s (issue 40)
        evaluate = val_metrics(val, size, self.strategy, progress, kernel_arithmetic=False)
        metric, name = self.metric, METRIC_NAMES[self.metric]
        self.scores[f"float_{metric}"] = evaluate(model)[metric]
        progress.step(f"Float model: {name} {self.scores[f'float_{metric}']}")
        # every worker calibrates on the same images; training starts from the chief's ranges
        calib = first_images(train, size, self.calib_batches * o.batch_size, seed=0, batch_size=o.batch_size)
        progress.step(f"Rewriting {spec.name} with fake quantization at every int8 tensor")
        with self.strategy.scope():
            qat = quantize_model(model, input_range=spec.preprocessing_at(size).value_range)
            set_class_names(qat, self.dataset.classes)
            progress.step(f"Calibrating the activation ranges of the QAT model on {len(calib)} batches")
            with progress.bar("calibrating", len(calib), "batches") as advance:
                calibrate(qat, calib, on_batch=advance)
        self.scores[f"qat_{metric}_calibrated"] = evaluate(qat)[metric]
        progress.step(f"QAT model after range calibration: {name} {self.scores[f'qat_{metric}_calibrated']} "
                      "(fake quantization)")
        return qat, None, evaluate

    def facts(self) -> dict:
        return dict(self.scores)

    def execute(self) -> dict:
        result = super().execute()
        if result[self.metric] is None:
            result[self.metric] = self.scores.get(f"qat_{self.metric}_calibrated")
        return {**result, f"{self.metric}_of": FAKE_QUANT_TOP1}
