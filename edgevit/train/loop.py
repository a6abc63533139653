"""The training loop behind `edgevit finetune` and `edgevit qat`.

- Input: an :class:`~edgevit.data.stream.ImageStream`, read through
  tf.data one epoch plan at a time; every worker's input pipeline reads the
  images of its own replicas (``distribute_datasets_from_function``).
- Distribution (:mod:`edgevit.train.distribute`): models, optimizer and
  steps live under the strategy's scope. A step computes each replica's
  gradients of the loss over the global batch, sums them across replicas,
  and applies them once: the optimizer clips the global gradient, as on one
  device. BatchNorm statistics are the global batch's on every replica, and
  QAT ranges follow the global batch's min and max.
- Multi-scale sampler (MobileViT, Mehta & Rastegari 2021): every batch draws
  a resolution from ``sizes`` and scales its batch size by
  ``(base_size / size) ** 2`` so each batch holds about as many pixels. One
  model per resolution shares the weights of the base model: before a step
  the resolution's model takes the base weights, its gradients update the
  base weights (one optimizer, one state), and its BatchNorm statistics and
  quantization ranges are copied back.
- Epochs: every image once, or ``steps_per_epoch`` steps. After every
  epoch the chief writes a checkpoint (:mod:`edgevit.train.checkpoints`);
  a run restarted with the same folder resumes after the last finished one.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgevit.data.stream import ImageStream, plan_epoch
from edgevit.data.transforms import normalise
from edgevit.errors import EdgevitError
from edgevit.progress import Progress
from edgevit.train.checkpoints import read_checkpoint, write_checkpoint
from edgevit.train.distribute import (
    broadcast_from_chief,
    is_chief,
    synchronise_batchnorm,
    synchronised_batchnorm,
    workers,
)
from edgevit.train.objectives import objective_for


@dataclass
class TrainConfig:
    epochs: int = 5
    batch_size: int = 32     # the global batch, shared by the replicas
    lr: float = 1e-3
    weight_decay: float = 0.01
    label_smoothing: float = 0.1
    warmup_epochs: float = 0.0
    sizes: list[int] = field(default_factory=list)   # multi-scale resolutions; [] = base size only
    steps_per_epoch: int | None = None               # None: every image once an epoch
    checkpoint_dir: str | None = None
    # What this run trains (model, classes, sizes): a checkpoint is resumed
    # only by the run that wrote it.
    run: dict = field(default_factory=dict)
    seed: int = 0
    mixed_precision: bool = False   # the models compute in float16; the loss is scaled
    worker_timeout: float | None = None   # across workers, how long the start's broadcast waits (None: no limit)


class Trainer:
    """Trains ``build(size)`` models that share the weights of ``build(base_size)``."""

    def __init__(self, base_model, build: Callable[[int], object] | None, base_size: int, cfg: TrainConfig,
                 strategy=None, log: Callable[[str], None] = print, progress: Progress | None = None):
        import keras
        import tensorflow as tf

        self.cfg, self.log = cfg, log
        self.progress = progress or Progress(enabled=False)
        self.strategy = strategy or tf.distribute.get_strategy()
        self.objective = objective_for(base_model, cfg.label_smoothing)
        replicas = self.strategy.num_replicas_in_sync
        if cfg.batch_size % replicas:
            raise EdgevitError(f"--batch-size {cfg.batch_size} does not split evenly over the {replicas} replicas "
                               f"that train together: pass a multiple of {replicas}.")
        self.chief = is_chief(self.strategy)
        self.base_size = base_size
        self.base = base_model
        self.build = build
        self.models = {base_size: base_model}
        with self.strategy.scope():
            optimizer = keras.optimizers.AdamW(learning_rate=cfg.lr, weight_decay=cfg.weight_decay,
                                               global_clipnorm=5.0)
            self.optimizer = keras.optimizers.LossScaleOptimizer(optimizer) if cfg.mixed_precision else optimizer
            self.optimizer.build(self.base.trainable_variables)
        self._steps: dict[int, Callable] = {}
        self.start_epoch = 0
        self.history: list[dict] = []
        self.seconds_to_first_step: float | None = None

    # -- models and steps ---------------------------------------------------------------------
    def model_at(self, size: int):
        if size not in self.models:
            with self.strategy.scope():
                model = self.build(size)
            synchronise_batchnorm(self.strategy, model)
            src, dst = self.base.weights, model.weights
            if [tuple(w.shape) for w in src] != [tuple(w.shape) for w in dst]:
                raise EdgevitError(f"The model at {size} px does not share the weights of the model at "
                                   f"{self.base_size} px; leave {size} out of --multiscale.")
            self.models[size] = model
        return self.models[size]

    def _step_fn(self, size: int, element_spec, pre):
        """The training step at ``size`` px, on the (uint8 pixels, targets,
        real) batches of ``element_spec``, normalised by ``pre``."""
        if size in self._steps:
            return self._steps[size]
        import tensorflow as tf

        from edgevit.quantize import graph_rewrites

        model = self.model_at(size)
        base = self.base
        shared = model is not base
        objective = self.objective
        optimizer = self.optimizer
        strategy = self.strategy
        scaled = self.cfg.mixed_precision
        # which variables get a gradient is known when the step is traced
        trained: list[int] = []

        def replica_step(x, y, real):
            context = tf.distribute.get_replica_context()
            # a place no image could fill (every substitute unreadable) is left out of the step
            x = normalise(tf.boolean_mask(tf.ensure_shape(x, (None, size, size, 3)), real), pre)
            y = tf.boolean_mask(y, real)
            units = context.all_reduce("SUM", objective.units(y))  # what the loss is the mean over
            images = context.all_reduce("SUM", tf.cast(tf.shape(y)[0], tf.float32))
            if shared:
                for dst, src in zip(model.weights, base.weights):
                    dst.assign(src)
            with tf.GradientTape() as tape:
                logits = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), model(x, training=True))
                loss = tf.math.divide_no_nan(objective.loss_sum(logits, y), units)  # this replica's share of the mean
                scaled_loss = optimizer.scale_loss(loss) if scaled else loss
            grads = tape.gradient(scaled_loss, model.trainable_variables)
            trained[:] = [i for i, g in enumerate(grads) if g is not None]
            grads = context.all_reduce("SUM", [grads[i] for i in trained]) if trained else []
            if shared:
                for dst, src in zip(base.non_trainable_variables, model.non_trainable_variables):
                    dst.assign(src)
            return loss, objective.hits(logits, y), units, images, grads

        def step(x, y, real):
            loss, correct, units, images, grads = strategy.run(replica_step, args=(x, y, real))
            summed = strategy.experimental_local_results(grads)[0] if trained else []
            variables = base.trainable_variables
            optimizer.apply(list(summed), [variables[i] for i in trained])
            return (strategy.reduce("SUM", loss, axis=None), strategy.reduce("SUM", correct, axis=None),
                    strategy.experimental_local_results(units)[0], strategy.experimental_local_results(images)[0])

        # Traced without AutoGraph (nothing here or in the layers branches on a tensor in Python): converting
        # every call cost 17% of tracing a QAT step (mobilevit_v3_xxs at 64 px: 126 -> 105 CPU seconds).
        # One graph for every batch size: an epoch's smaller last batch traced the whole step again
        # (mobilevit_v3_xxs QAT at 128 px: 134 s a trace, 3 s a step).
        traced = tf.function(step, input_signature=list(element_spec), autograph=False)
        self._steps[size] = graph_rewrites.for_model(model, traced)
        return self._steps[size]

    # -- checkpoints ----------------------------------------------------------------------------
    def restore(self) -> int:
        """Resume from ``checkpoint_dir`` if it holds a finished epoch of this
        run (the chief reads it; every worker takes the chief's state)."""
        if self.chief and self.cfg.checkpoint_dir:
            self._read_checkpoint()
        if workers(self.strategy) > 1:
            with self.strategy.scope():
                (epoch,) = broadcast_from_chief(self.strategy, [*self.base.weights, *self.optimizer.variables],
                                                [np.int64(self.start_epoch)], self.cfg.worker_timeout)
            self.start_epoch = int(epoch)
        if self.start_epoch >= self.cfg.epochs:
            self.log(f"{self.cfg.checkpoint_dir} holds all {self.start_epoch} epoch(s) of this run "
                     "(it stopped before saving): saving that model")
        elif self.start_epoch:
            self.log(f"Resuming from {self.cfg.checkpoint_dir}: {self.start_epoch} epoch(s) done")
        return self.start_epoch

    def _read_checkpoint(self) -> None:
        state = read_checkpoint(self.cfg.checkpoint_dir, self.cfg.run, self.base, self.optimizer)
        if state is not None:
            self.start_epoch = int(state["epochs_done"])
            self.history = state.get("history", [])

    def save_checkpoint(self, epochs_done: int) -> None:
        if self.cfg.checkpoint_dir and self.chief:
            write_checkpoint(self.cfg.checkpoint_dir, self.base, self.optimizer, epochs_done, self.history,
                             self.cfg.run)

    # -- the loop -------------------------------------------------------------------------------
    def _lr_at(self, progress: float) -> float:
        """Linear warm-up then cosine decay; ``progress`` in epochs."""
        cfg = self.cfg
        if cfg.warmup_epochs and progress < cfg.warmup_epochs:
            return cfg.lr * (progress + 1e-3) / cfg.warmup_epochs
        span = max(cfg.epochs - cfg.warmup_epochs, 1e-6)
        t = min(1.0, (progress - cfg.warmup_epochs) / span)
        return cfg.lr * (0.5 * (1 + math.cos(math.pi * t)) * 0.99 + 0.01)

    def _epoch_batches(self, train: ImageStream, epoch: int):
        """(plan, distributed dataset) of ``epoch``."""
        cfg, strategy = self.cfg, self.strategy
        plan = plan_epoch(len(train), cfg.batch_size, strategy.num_replicas_in_sync, self.base_size, cfg.sizes,
                          np.random.default_rng(cfg.seed + epoch), cfg.steps_per_epoch)
        seed = cfg.seed * 1_000_003 + epoch

        def dataset(context):
            local = context.num_replicas_in_sync // context.num_input_pipelines
            return train.training_dataset(plan, seed, context.input_pipeline_id, local)

        return plan, strategy.distribute_datasets_from_function(dataset)

    def fit(self, train: ImageStream, evaluate: Callable[[object], dict] | None = None,
            started: float | None = None) -> list[dict]:
        """Train on ``train``; ``evaluate(base_model)`` gives validation
        metrics after each epoch. ``started``: when the command started
        (``time.perf_counter()``), for ``seconds_to_first_step``."""
        with synchronised_batchnorm(self.strategy, self.base):
            self.restore()
            for epoch in range(self.start_epoch, self.cfg.epochs):
                self._train_epoch(train, epoch, evaluate, started)
        return self.history

    def _train_epoch(self, train, epoch: int, evaluate, started) -> None:
        cfg = self.cfg
        plan, batches = self._epoch_batches(train, epoch)
        start, total_loss, total_correct, units_seen, seen = time.perf_counter(), 0.0, 0.0, 0.0, 0
        single = self.strategy.num_replicas_in_sync == 1
        with self.progress.bar(f"epoch {epoch + 1}/{cfg.epochs}", len(plan), "steps") as advance:
            for i, (size, batch) in enumerate(zip(plan.sizes, batches)):
                if single and not bool(np.any(batch[2])):  # every image of the batch unreadable
                    advance()
                    continue
                self.optimizer.learning_rate = self._lr_at(epoch + i / len(plan))
                if int(size) not in self._steps:  # its first call traces it
                    self.progress.step(f"Building the training step's graph at {int(size)} px (once per "
                                       "resolution: a minute or two on a CPU)")
                loss, correct, units, images = self._step_fn(int(size), batches.element_spec, train.pre)(*batch)
                loss = float(loss)
                if not math.isfinite(loss):
                    raise EdgevitError(f"Training diverged (loss {loss}) in epoch {epoch + 1}; try a lower --lr.")
                if self.seconds_to_first_step is None and started is not None:
                    self.seconds_to_first_step = round(time.perf_counter() - started, 1)
                total_loss += loss * float(units)
                total_correct += float(correct)
                units_seen += float(units)
                seen += int(images)
                advance(status=f"loss {total_loss / max(units_seen, 1):.4f}")
        if not seen:
            raise EdgevitError(f"None of the images of epoch {epoch + 1} could be read"
                               + (f": {train.tally.summary()}." if len(train.tally) else "."))
        record = {"epoch": epoch + 1, "loss": round(total_loss / max(units_seen, 1), 4),
                  self.objective.train_metric: round(total_correct / max(units_seen, 1), 4),
                  "images": seen, "seconds": round(time.perf_counter() - start, 1)}
        if cfg.sizes:
            record["sizes"] = sorted({int(s) for s in plan.sizes})
        if evaluate is not None:
            record.update(evaluate(self.base))
        self.history.append(record)
        self.log(f"epoch {epoch + 1}/{cfg.epochs}: " + ", ".join(f"{k} {v}" for k, v in record.items() if k != "epoch"))
        self.save_checkpoint(epoch + 1)
