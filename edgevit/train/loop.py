"""The training loop behind `edgevit finetune` and `edgevit qat`.

- Distribution: :func:`strategy_for_environment` picks MultiWorkerMirrored
  when TF_CONFIG is set, Mirrored when several GPUs are visible, the default
  strategy otherwise; models, optimizer and steps live under its scope.
- Multi-scale sampler (MobileViT, Mehta & Rastegari 2021): every batch draws
  a resolution from ``sizes`` and scales its batch size by
  ``(base_size / size) ** 2`` so each batch holds about as many pixels. One
  model per resolution shares the weights of the base model: before a step
  the resolution's model takes the base weights, its gradients update the
  base weights (one optimizer, one state), and its BatchNorm statistics and
  quantization ranges are copied back.
- Checkpoints: after every epoch the weights, optimizer state and epoch go
  to ``checkpoint_dir`` with a description of the run (``TrainConfig.run``);
  a run started with the same directory resumes after the last finished epoch
  when it is the same run and is refused when it is not. The command removes
  the checkpoint once the trained model is saved. While a run uses the
  directory it holds a lock there (:func:`checkpoint_lock`), so that a second
  run started meanwhile is refused rather than sharing it.
"""
from __future__ import annotations

import errno
import fcntl
import io
import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

import numpy as np

from edgevit.errors import EdgevitError, cause, first_line
from edgevit.progress import Progress
from edgevit.writing import staged, weights_h5


def strategy_for_environment():
    import tensorflow as tf

    if os.environ.get("TF_CONFIG"):
        try:
            config = json.loads(os.environ["TF_CONFIG"])
            if not (isinstance(config, dict) and "cluster" in config and "task" in config):
                raise ValueError("a JSON object with cluster and task is expected")
            return tf.distribute.MultiWorkerMirroredStrategy()
        except (ValueError, KeyError, TypeError) as err:  # bad JSON, a task outside the cluster ...
            raise EdgevitError(f"TF_CONFIG does not describe a cluster this process is part of "
                               f"({first_line(err)}): fix it, or unset it to train on this machine alone.") from None
        except RuntimeError as err:  # "Collective ops must be configured at program startup"
            raise EdgevitError(f"Training across workers (TF_CONFIG) failed to start ({first_line(err)}): unset "
                               "TF_CONFIG to train on this machine alone.") from None
    if len(tf.config.list_logical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def scaled_batch_size(base_batch: int, base_size: int, size: int) -> int:
    """Batch size at ``size`` keeping about ``base_batch * base_size**2`` pixels."""
    return max(1, int(round(base_batch * (base_size / size) ** 2)))


def multiscale_batches(num_samples: int, base_batch: int, base_size: int, sizes: list[int],
                       rng: np.random.Generator) -> list[tuple[int, np.ndarray]]:
    """One epoch of (resolution, sample indices): every sample once, each
    batch at a random resolution with its scaled batch size."""
    order = rng.permutation(num_samples)
    batches, start = [], 0
    while start < num_samples:
        size = int(rng.choice(sizes)) if sizes else base_size
        bs = scaled_batch_size(base_batch, base_size, size)
        batches.append((size, order[start:start + bs]))
        start += bs
    return batches


@dataclass
class TrainConfig:
    epochs: int = 5
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    label_smoothing: float = 0.1
    warmup_epochs: float = 0.0
    sizes: list[int] = field(default_factory=list)   # multi-scale resolutions; [] = base size only
    checkpoint_dir: str | None = None
    # What this run trains (model, classes, sizes): a checkpoint is resumed
    # only by the run that wrote it.
    run: dict = field(default_factory=dict)
    seed: int = 0


# Written together through a staging folder (edgevit.writing.staged): a failed or
# interrupted save leaves the last checkpoint whole and nothing else.
CHECKPOINT_FILES = ("last.weights.h5", "optimizer.npz", "state.json")
# Held (flock) by the run that uses the folder; the kernel releases it when that process ends, however it ends.
LOCK_FILE = ".edgevit-run.lock"


def _describe_run(run: dict) -> str:
    if not run:
        return "a run this edgevit did not record"
    classes = run.get("classes") or []
    return (f"{run.get('command', '?')} of {run.get('model', '?')} at {run.get('input_size', '?')} px, "
            f"{len(classes)} classes ({', '.join(map(str, classes[:4]))}{' ...' if len(classes) > 4 else ''})")


def checkpoint_state(checkpoint_dir: str | Path, run: dict) -> dict | None:
    """The saved state of ``checkpoint_dir`` when it holds a checkpoint of
    ``run`` (None when it holds none); an error naming the folder and how to
    start fresh when it holds another run's or a damaged one."""
    folder = Path(checkpoint_dir)
    if folder.exists() and not folder.is_dir():
        raise EdgevitError(f"Checkpoint folder {str(folder)!r} is a file, not a folder: "
                           "pass another --checkpoint-dir.")
    state = folder / "state.json"
    if not state.exists():
        return None
    try:
        info = json.loads(state.read_text())
        epochs_done = int(info["epochs_done"])
    except (OSError, ValueError, KeyError, TypeError):
        raise EdgevitError(f"Checkpoint folder {str(folder)!r} is damaged (state.json unreadable): "
                           f"{_start_fresh(folder)}.") from None
    saved = info.get("run") or {}
    if saved != run:
        raise EdgevitError(f"Checkpoint folder {str(folder)!r} holds another run ({_describe_run(saved)}, "
                           f"{epochs_done} epoch(s) done; this run: {_describe_run(run)}): {_start_fresh(folder)}.")
    return info


@contextmanager
def checkpoint_lock(checkpoint_dir: str | Path):
    """Hold ``checkpoint_dir`` for this run while the block runs: another
    edgevit run that asks for it meanwhile is refused (two runs that had not
    yet saved a checkpoint both went on, and the first to finish deleted the
    folder under the other). Made here when missing, and removed afterwards
    when this made it and nothing is left in it. The workers of one
    distributed run (TF_CONFIG) share the folder, so they take no lock."""
    folder = Path(checkpoint_dir)
    if os.environ.get("TF_CONFIG") or (folder.exists() and not folder.is_dir()):
        yield  # a file there is refused by checkpoint_state, in words
        return
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = _locked(folder / LOCK_FILE)
    except OSError as err:
        raise EdgevitError(f"Could not make the checkpoint folder {str(folder)!r}: {cause(err)}.") from None
    try:
        yield
    finally:
        if fd is not None:
            _remove_own_lock(folder / LOCK_FILE, fd)
            os.close(fd)
        if made:
            try:
                folder.rmdir()
            except OSError:  # it holds a checkpoint to resume from, or files of the user's
                pass


def _locked(lock: Path) -> int | None:
    """A descriptor of ``lock`` holding an exclusive flock with this
    process's id in it; None on a file system without locks."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                return None
            raise EdgevitError(f"Checkpoint folder {str(lock.parent)!r} is in use by another edgevit run (process "
                               f"{holder}): wait for it to end, or pass another --checkpoint-dir.") from None
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the run that held it ended and removed it meanwhile: take a fresh one
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _remove_own_lock(lock: Path, fd: int) -> None:
    """Remove ``lock`` before its flock is released (a run that starts then
    finds a free folder), unless it is already another run's."""
    try:
        if os.stat(lock).st_ino == os.fstat(fd).st_ino:
            lock.unlink()
    except FileNotFoundError:  # removed with the checkpoint
        pass


def _start_fresh(folder: Path) -> str:
    """How to start afresh, deleting only what a Trainer wrote."""
    if folder.is_dir() and any(p.name not in (*CHECKPOINT_FILES, LOCK_FILE) for p in folder.iterdir()):
        return (f"delete its checkpoint files ({', '.join(CHECKPOINT_FILES)}) to start fresh, "
                "or pass another --checkpoint-dir")
    return f"delete it (rm -r {str(folder)!r}) to start fresh, or pass another --checkpoint-dir"


def remove_checkpoint(checkpoint_dir: str | Path) -> None:
    """Delete the files a Trainer wrote to ``checkpoint_dir`` and the run's
    lock, and the folder when nothing else is in it."""
    folder = Path(checkpoint_dir)
    for name in (*CHECKPOINT_FILES, LOCK_FILE):
        (folder / name).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:  # absent, or holds files of the user's: left as it is
        pass


class Trainer:
    """Trains ``build(size)`` models that share the weights of ``build(base_size)``."""

    def __init__(self, base_model, build: Callable[[int], object], base_size: int, cfg: TrainConfig,
                 strategy=None, log: Callable[[str], None] = print, progress: Progress | None = None):
        import keras

        self.cfg, self.log = cfg, log
        self.progress = progress or Progress(enabled=False)
        self.strategy = strategy or strategy_for_environment()
        self.base_size = base_size
        self.base = base_model
        self.build = build
        self.models = {base_size: base_model}
        with self.strategy.scope():
            self.optimizer = keras.optimizers.AdamW(learning_rate=cfg.lr, weight_decay=cfg.weight_decay,
                                                    global_clipnorm=5.0)
            self.optimizer.build(self.base.trainable_variables)
        self._steps: dict[int, Callable] = {}
        self.start_epoch = 0
        self.history: list[dict] = []

    # -- models and steps ---------------------------------------------------------------------
    def model_at(self, size: int):
        if size not in self.models:
            with self.strategy.scope():
                model = self.build(size)
            src, dst = self.base.weights, model.weights
            if [tuple(w.shape) for w in src] != [tuple(w.shape) for w in dst]:
                raise EdgevitError(f"The model at {size} px does not share the weights of the model at "
                                   f"{self.base_size} px; leave {size} out of --multiscale.")
            self.models[size] = model
        return self.models[size]

    def _step_fn(self, size: int):
        if size in self._steps:
            return self._steps[size]
        import keras
        import tensorflow as tf

        from edgevit.quantize import graph_rewrites

        model = self.model_at(size)
        base = self.base
        shared = model is not base
        smoothing = self.cfg.label_smoothing
        classes = int(base.outputs[0].shape[-1])
        optimizer = self.optimizer
        strategy = self.strategy

        def replica_step(x, y):
            if shared:
                for dst, src in zip(model.weights, base.weights):
                    dst.assign(src)
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                target = tf.one_hot(y, classes) * (1.0 - smoothing) + smoothing / classes
                per_sample = keras.losses.categorical_crossentropy(target, logits, from_logits=True)
                loss = tf.nn.compute_average_loss(per_sample)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, base.trainable_variables)
            if shared:
                for dst, src in zip(base.non_trainable_variables, model.non_trainable_variables):
                    dst.assign(src)
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), y), tf.float32))
            return loss, correct

        def step(x, y):
            loss, correct = strategy.run(replica_step, args=(x, y))
            return (strategy.reduce("SUM", loss, axis=None), strategy.reduce("SUM", correct, axis=None))

        # Traced without AutoGraph (nothing here or in the layers branches on a tensor in Python): converting
        # every call cost 17% of tracing a QAT step (mobilevit_v3_xxs at 64 px: 126 -> 105 CPU seconds).
        if strategy.num_replicas_in_sync == 1:
            # One graph for every batch size: an epoch's smaller last batch traced the whole step again
            # (mobilevit_v3_xxs QAT at 128 px: 134 s a trace, 3 s a step).
            signature = [tf.TensorSpec((None, *model.inputs[0].shape[1:]), tf.float32),
                         tf.TensorSpec((None,), tf.int64)]
            traced = tf.function(step, input_signature=signature, autograph=False)
        else:  # distributed batches are per-replica values, which a signature of tensors does not describe
            traced = tf.function(step, reduce_retracing=True, autograph=False)
        self._steps[size] = graph_rewrites.for_model(model, traced)
        return self._steps[size]

    def _distribute(self, x, y):
        if self.strategy.num_replicas_in_sync == 1:
            return x, y
        import tensorflow as tf

        ds = tf.data.Dataset.from_tensors((x, y))
        return next(iter(self.strategy.experimental_distribute_dataset(ds)))

    # -- checkpoints ----------------------------------------------------------------------------
    def _ckpt_paths(self):
        d = Path(self.cfg.checkpoint_dir)
        return tuple(d / name for name in CHECKPOINT_FILES)

    def restore(self) -> int:
        """Resume from ``checkpoint_dir`` if it holds a finished epoch of this run."""
        if not self.cfg.checkpoint_dir:
            return 0
        info = checkpoint_state(self.cfg.checkpoint_dir, self.cfg.run)
        if info is None:
            return 0
        weights, opt, _ = self._ckpt_paths()
        try:
            self.base.load_weights(weights)
            saved = np.load(opt)
        except Exception as err:  # h5py, Keras and NumPy raise many types for missing or damaged files
            raise EdgevitError(f"Checkpoint folder {self.cfg.checkpoint_dir!r} is damaged ({first_line(err)}): "
                               f"{_start_fresh(Path(self.cfg.checkpoint_dir))}.") from None
        variables = self.optimizer.variables
        if len(saved.files) != len(variables):
            raise EdgevitError(f"Checkpoint in {self.cfg.checkpoint_dir} does not fit this run "
                               "(different model or optimizer); use another --checkpoint-dir.")
        for i, var in enumerate(variables):
            var.assign(saved[f"v{i}"])
        self.start_epoch = int(info["epochs_done"])
        self.history = info.get("history", [])
        if self.start_epoch >= self.cfg.epochs:
            self.log(f"{self.cfg.checkpoint_dir} holds all {self.start_epoch} epoch(s) of this run "
                     "(it stopped before saving): saving that model")
        else:
            self.log(f"Resuming from {self.cfg.checkpoint_dir}: {self.start_epoch} epoch(s) done")
        return self.start_epoch

    def save_checkpoint(self, epochs_done: int) -> None:
        if not self.cfg.checkpoint_dir:
            return
        folder = Path(self.cfg.checkpoint_dir)
        made = not folder.exists()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise EdgevitError(f"Could not make the checkpoint folder {str(folder)!r}: {cause(err)}.") from None
        optimizer_state = io.BytesIO()
        np.savez(optimizer_state, **{f"v{i}": np.asarray(v) for i, v in enumerate(self.optimizer.variables)})
        state = {"epochs_done": epochs_done, "history": self.history, "run": self.cfg.run}
        try:
            with staged(list(self._ckpt_paths())) as staging:
                weights, opt, state_file = self._ckpt_paths()
                staging.write_bytes(weights, weights_h5(self.base))
                staging.write_bytes(opt, optimizer_state.getvalue())
                staging.write_text(state_file, json.dumps(state))
        except BaseException:
            if made:  # the first save: nothing of this run is left behind
                remove_checkpoint(folder)
            raise

    # -- the loop -------------------------------------------------------------------------------
    def _lr_at(self, progress: float) -> float:
        """Linear warm-up then cosine decay; ``progress`` in epochs."""
        cfg = self.cfg
        if cfg.warmup_epochs and progress < cfg.warmup_epochs:
            return cfg.lr * (progress + 1e-3) / cfg.warmup_epochs
        span = max(cfg.epochs - cfg.warmup_epochs, 1e-6)
        t = min(1.0, (progress - cfg.warmup_epochs) / span)
        return cfg.lr * (0.5 * (1 + math.cos(math.pi * t)) * 0.99 + 0.01)

    def fit(self, train, evaluate: Callable[[object], dict] | None = None) -> list[dict]:
        """Train on ``train`` (an ArrayData); ``evaluate(base_model)`` gives
        validation metrics after each epoch."""
        cfg = self.cfg
        self.restore()
        for epoch in range(self.start_epoch, cfg.epochs):
            rng = np.random.default_rng(cfg.seed + epoch)
            batches = multiscale_batches(len(train), cfg.batch_size, self.base_size, cfg.sizes, rng)
            start, total_loss, total_correct, seen = time.perf_counter(), 0.0, 0.0, 0
            with self.progress.bar(f"epoch {epoch + 1}/{cfg.epochs}", len(batches), "steps") as advance:
                for i, (size, index) in enumerate(batches):
                    self.optimizer.learning_rate = self._lr_at(epoch + i / len(batches))
                    x = train.train_batch(index, size, rng)
                    y = train.labels[index]
                    loss, correct = self._step_fn(size)(*self._distribute(x, y.astype(np.int64)))
                    loss = float(loss)
                    if not math.isfinite(loss):
                        raise EdgevitError(f"Training diverged (loss {loss}) in epoch {epoch + 1}; "
                                           "try a lower --lr.")
                    total_loss += loss * len(index)
                    total_correct += float(correct)
                    seen += len(index)
                    advance(status=f"loss {total_loss / seen:.4f}")
            record = {"epoch": epoch + 1, "loss": round(total_loss / seen, 4),
                      "train_top1": round(total_correct / seen, 4),
                      "seconds": round(time.perf_counter() - start, 1)}
            if cfg.sizes:
                record["sizes"] = sorted({s for s, _ in batches})
            if evaluate is not None:
                record.update(evaluate(self.base))
            self.history.append(record)
            self.log(f"epoch {epoch + 1}/{cfg.epochs}: "
                     + ", ".join(f"{k} {v}" for k, v in record.items() if k != "epoch"))
            self.save_checkpoint(epoch + 1)
        return self.history
