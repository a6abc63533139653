"""Training on several devices and machines with ``tf.distribute``.

- :func:`strategy_for_environment` picks MultiWorkerMirroredStrategy when
  ``TF_CONFIG`` is set, MirroredStrategy when several GPUs are visible, the
  default strategy otherwise. A command creates it before TensorFlow runs
  any op (collective ops must be configured at program startup) and builds
  the model, the QAT rewrite, calibration and the optimizer in its scope.
- Workers: the chief (:func:`is_chief`) alone reads and writes the
  checkpoint folder and writes the output; at the start of training every
  worker takes the chief's weights, optimizer state and epoch
  (:func:`broadcast_from_chief`), so that what the chief restored or
  computed is what every worker trains from, whatever each machine's
  arithmetic. A collective that waits longer than the worker timeout for a
  worker that never came up ends the run with an error naming the cause; a
  worker killed mid-run is noticed by TensorFlow's coordination-service
  heartbeat, which fails every worker's pending collectives.
- Before step 1 the workers check that they run the same run (model and
  its source's identity, sizes, epochs, steps, data, options:
  :func:`agree_on_run`), and every worker refuses in one line naming the
  fields that differ.
- BatchNorm statistics are those of the global batch on every replica
  (:func:`synchronised_batchnorm`).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import subprocess
import sys
from contextlib import contextmanager

import numpy as np

from edgevit.errors import EdgevitError, cause, first_line

# How long a worker waits for the others at the start (to connect, then in the broadcast of the chief's
# weights) before the run ends with an error. It must exceed the longest gap between workers there (building
# and calibrating a QAT model on a busy host). The steps' collectives have no timeout: TensorFlow gives every
# collective op with a timeout a thread that sleeps through it, so 600 s of training on a 2-core host held
# 16,000 threads (about 400 a step of mobilevit_v3_xxs, an all-reduce per gradient and per BatchNorm layer)
# and the process aborted ("std::system_error: Resource temporarily unavailable"). A worker killed mid-run
# is noticed by the coordination service's heartbeat instead.
WORKER_TIMEOUT = 600.0


# The task types that train: MultiWorkerMirroredStrategy's. An evaluator (or a parameter server) would train
# alone, outside the cluster's collectives, and write the output as if it were the run.
TRAINING_TASKS = ("chief", "worker")


def cluster_of_environment() -> dict | None:
    """The cluster ``TF_CONFIG`` describes (None when it is not set); an
    error naming what is wrong with it."""
    text = os.environ.get("TF_CONFIG")
    if not text:
        return None
    try:
        config = json.loads(text)
        if not (isinstance(config, dict) and "cluster" in config and "task" in config):
            raise ValueError("a JSON object with cluster and task is expected")
        task = config["task"]
        if task["type"] not in TRAINING_TASKS:
            raise EdgevitError(f"TF_CONFIG makes this process {'an' if str(task['type'])[:1] in 'aeiou' else 'a'} "
                               f"{task['type']!r} task, which edgevit does not run: training across workers "
                               f"takes {' and '.join(TRAINING_TASKS)} tasks only (each evaluates its share of "
                               "the validation images); start this process as a worker, or not at all.")
        addresses = config["cluster"][task["type"]]
        index = int(task["index"])
        if not 0 <= index < len(addresses):
            raise IndexError(f"task index {index} of {task['type']}, which has {len(addresses)} address(es): "
                             f"0 to {len(addresses) - 1}")
    except (ValueError, KeyError, TypeError, IndexError) as err:  # bad JSON, a task outside the cluster ...
        raise EdgevitError(f"TF_CONFIG does not describe a cluster this process is part of "
                           f"({first_line(err)}): fix it, or unset it to train on this machine alone.") from None
    others = sorted(str(kind) for kind in config["cluster"] if kind not in TRAINING_TASKS)
    if others:
        raise EdgevitError(f"TF_CONFIG's cluster has {', '.join(others)} task(s), which edgevit does not run: "
                           f"training across workers takes {' and '.join(TRAINING_TASKS)} tasks only (each "
                           "evaluates its share of the validation images); remove them from the cluster.")
    for kind in TRAINING_TASKS:
        for address in config["cluster"].get(kind, []):
            _port_of(address)
    return config


def _port_of(address) -> int:
    """The port of a cluster address ``host:port``; an error naming it when it has none."""
    host, _, port = str(address).rpartition(":")
    if not (host and port.isdigit() and 0 < int(port) < 65536):
        raise EdgevitError(f"TF_CONFIG's cluster address {str(address)!r} is not host:port (a port from 1 to "
                           "65535): fix it.")
    return int(port)


def check_own_port(cluster: dict) -> None:
    """Refuse, before TensorFlow starts its server, a port of this task's
    that another process already listens on (TensorFlow's server binds it
    on every interface, and fails with a traceback, or shares it)."""
    task = cluster["task"]
    address = cluster["cluster"][task["type"]][int(task["index"])]
    port = _port_of(address)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port a closed run left in TIME_WAIT is free
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as err:
            raise EdgevitError(f"TF_CONFIG gives this process ({task['type']} {task['index']}) the address "
                               f"{address}, but port {port} {_bind_problem(err)}: stop what uses it, or give this "
                               "task another port in every worker's TF_CONFIG.") from None


def _bind_problem(err: OSError) -> str:
    if err.errno == errno.EADDRINUSE:
        return "is in use by another process (another worker, or an earlier run still going)"
    if err.errno == errno.EACCES:
        return "is reserved (ports below 1024 need root)"
    return f"cannot be opened ({cause(err)})"


def strategy_for_environment(worker_timeout: float = WORKER_TIMEOUT):
    import tensorflow as tf

    for gpu in tf.config.list_physical_devices("GPU"):
        try:  # take GPU memory as it is needed, not all of it at the first op
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # devices already initialised (a library caller ran ops first): left as they are
            pass
    cluster = cluster_of_environment()
    if cluster is not None:
        check_own_port(cluster)
        task = cluster["task"]
        addresses = [a for kind in ("chief", "worker") for a in cluster["cluster"].get(kind, [])]
        try:
            with deadline(worker_timeout, f"Training across workers (TF_CONFIG) did not start: not every worker "
                                          f"of the cluster ({', '.join(addresses)}) came up within "
                                          f"{worker_timeout:g} s (this is {task['type']} {task['index']}). Start "
                                          "each of them, or wait longer with --worker-timeout."):
                return tf.distribute.MultiWorkerMirroredStrategy()
        except (ValueError, RuntimeError) as err:  # "Collective ops must be configured at program startup"
            raise EdgevitError(f"Training across workers (TF_CONFIG) failed to start ({first_line(err)}): unset "
                               "TF_CONFIG to train on this machine alone.") from None
    if len(tf.config.list_logical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


# A process that says why the one it watches ends, unless told in time that it may stop watching; the watched
# process ends itself a second later (faulthandler), or is killed should it not.
_WATCHDOG = """
import os, select, signal, sys, time
watched, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if not select.select([sys.stdin], [], [], seconds)[0]:
    sys.stderr.write("error: " + message + "\\n")
    sys.stderr.flush()
    if not select.select([sys.stdin], [], [], 5.0)[0]:
        os.kill(watched, signal.SIGKILL)
"""


@contextmanager
def deadline(seconds: float, message: str):
    """End this process with ``error: message`` and exit status 1 if the
    block has not ended within ``seconds``. While TensorFlow waits for the
    other workers to connect it holds the Python interpreter, so no Python
    timer or signal handler can run: a watchdog process prints the line, and
    faulthandler's timer, a thread of its own that needs no interpreter,
    ends this process a second later (the watchdog kills it, status 137,
    should that fail)."""
    import faulthandler

    watchdog = subprocess.Popen([sys.executable, "-S", "-c", _WATCHDOG, str(os.getpid()), str(seconds), message],
                                stdin=subprocess.PIPE)
    with open(os.devnull, "w") as nowhere:  # the threads' stacks are no news to the user
        faulthandler.dump_traceback_later(seconds + 1.0, exit=True, file=nowhere)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
            watchdog.stdin.close()  # the block ended: the watchdog goes
            watchdog.wait()


def workers(strategy) -> int:
    """How many machines (processes) train together."""
    cluster = cluster_of_environment() if _is_multi_worker(strategy) else None
    if cluster is None:
        return 1
    return sum(len(cluster["cluster"].get(kind, [])) for kind in ("chief", "worker"))


def _is_multi_worker(strategy) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def is_chief(strategy) -> bool:
    """Whether this process writes what the run leaves: the output,
    checkpoints, the report (every process, unless it is a worker of a run
    across machines other than the chief)."""
    return bool(strategy.extended.should_checkpoint)


def broadcast_from_chief(strategy, variables, values=(), timeout: float | None = None) -> list:
    """Give every replica of every worker the chief's value of each of
    ``variables``; returns the chief's value of each tensor of ``values``
    (numbers this process computed, such as the epoch to resume from).
    Across workers it waits ``timeout`` seconds for the others (None: as
    long as they take)."""
    import tensorflow as tf

    variables = list(variables)
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)

    def replica_values():
        context = tf.distribute.get_replica_context()
        chief = tf.equal(context.replica_id_in_sync_group, 0)
        local = [tf.convert_to_tensor(v) for v in variables] + [tf.convert_to_tensor(v) for v in values]
        # a sum with zeros from every other replica: the chief's value, exactly; one all-reduce per dtype
        summed = [None] * len(local)
        for dtype in {v.dtype for v in local}:
            places = [i for i, v in enumerate(local) if v.dtype == dtype]
            chiefs = [tf.where(chief, local[i], tf.zeros_like(local[i])) for i in places]
            for i, value in zip(places, context.all_reduce("SUM", chiefs, options=options)):
                summed[i] = value
        return summed

    def run():
        first = strategy.experimental_local_results(strategy.run(replica_values))[0]
        for variable, value in zip(variables, first):
            variable.assign(value)
        return first[len(variables):]

    try:
        return [v.numpy() for v in tf.function(run, autograph=False)()]
    except tf.errors.OpError as err:
        raise worker_failure(err) from None


# Fields of a run description the workers compare (a description with more compares its last ones as one).
RUN_FIELDS = 32


def _field_hashes(run: dict) -> tuple[list[str], np.ndarray]:
    """(names, a 64-bit hash of each name and value, padded with zeros to
    RUN_FIELDS) of the fields of ``run``, sorted by name."""
    names = sorted(run)
    if len(names) > RUN_FIELDS:
        names = names[:RUN_FIELDS - 1] + [" and ".join(names[RUN_FIELDS - 1:])]
    hashes = np.zeros(RUN_FIELDS, np.int64)
    for slot, name in enumerate(names):
        value = json.dumps([[key, run[key]] for key in name.split(" and ")], sort_keys=True, default=str)
        hashes[slot] = np.frombuffer(hashlib.sha256(value.encode()).digest()[:8], "<i8")[0]
    return names, hashes


def run_disagreement(run: dict, gathered) -> str | None:
    """What differs between this worker's ``run`` and the other workers',
    whose field hashes are the rows of ``gathered`` (one per replica,
    :func:`_field_hashes`), in words; None when every worker runs the same."""
    names, mine = _field_hashes(run)
    differing = [slot for slot in range(RUN_FIELDS) if len(set(gathered[:, slot].tolist())) > 1]
    if not differing:
        return None

    def shown(slot):
        name = names[slot] if slot < len(names) else "(a field this worker does not have)"
        value = json.dumps(run[name], default=str) if name in run else "absent"
        agreeing = int((gathered[:, slot] == mine[slot]).sum())
        return (f"{name}: {value if len(value) <= 40 else value[:37] + '...'} here, as on {agreeing} of "
                f"{len(gathered)} replicas")

    return "; ".join(shown(slot) for slot in differing)


def agree_on_run(strategy, run: dict, timeout: float | None = None) -> None:
    """Across workers, end the run of every worker with one error line
    naming the fields in which their run descriptions differ (``run``:
    model and the source's identity, sizes, epochs, steps, data
    fingerprint, options; the same keys on every worker, None where a value
    does not apply). Workers started with other commands trained together
    and saved a model of neither. Each replica adds its hashes to its own
    row of a zero table, and one all-reduce (a gather) gives every worker
    every row; waits ``timeout`` seconds for the others."""
    if workers(strategy) == 1:
        return
    import tensorflow as tf

    _, hashes = _field_hashes(run)
    replicas = strategy.num_replicas_in_sync
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)

    def replica_rows():
        context = tf.distribute.get_replica_context()
        own = tf.scatter_nd([[context.replica_id_in_sync_group]], tf.constant(hashes)[None], [replicas, RUN_FIELDS])
        return context.all_reduce("SUM", own, options=options)

    try:
        gathered = strategy.experimental_local_results(tf.function(
            lambda: strategy.run(replica_rows), autograph=False)())[0].numpy()
    except tf.errors.OpError as err:
        raise worker_failure(err) from None
    problem = run_disagreement(run, gathered)
    if problem is not None:
        raise EdgevitError(f"Training across workers (TF_CONFIG): the workers were started with different runs "
                           f"({problem}): start every worker with the same command, model file and data.")


@contextmanager
def worker_failures(strategy):
    """In a run across workers, a collective op that failed because a worker
    did not answer (TensorFlow's heartbeat noticed it stop, or the worker
    timeout passed) ends the run as one error line."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.OpError as err:
        if workers(strategy) > 1:
            raise worker_failure(err) from None
        raise


def worker_failure(err) -> EdgevitError:
    """A collective op that failed because a worker is missing, in words."""
    return EdgevitError(f"Training across workers (TF_CONFIG) stopped: a worker did not answer "
                        f"({first_line(err)}); a worker that never came up or was stopped ends the run of every "
                        "worker. Start them all again with the same --checkpoint-dir to resume after the last "
                        "finished epoch.")


def synchronise_batchnorm(strategy, model) -> list:
    """On several replicas, make ``model``'s BatchNormalization layers
    normalise with and track the statistics of the global batch (an
    all-reduce per layer), so every replica keeps the same statistics.
    Returns the layers changed."""
    import keras

    if strategy.num_replicas_in_sync == 1:
        return []
    norms = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)
             and not layer.synchronized]
    for layer in norms:
        layer.synchronized = True
    return norms


@contextmanager
def synchronised_batchnorm(strategy, model):
    """:func:`synchronise_batchnorm` while the block runs (the saved model
    keeps its layers' setting)."""
    norms = synchronise_batchnorm(strategy, model)
    try:
        yield
    finally:
        for layer in norms:
            layer.synchronized = False
