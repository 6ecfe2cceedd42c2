"""Synchronous training across processes, and surviving a failure with checkpoints.

Taught in the chapter "Beyond one machine".  :func:`train_parabola_multiworker`
is the y = x² question's network trained by :class:`pargrad.SyncTrainer` in every worker
of a cluster (``MultiWorkerMirroredStrategy``), optionally with a
``tf.train.CheckpointManager``.  Under this strategy every step needs every
worker, so when one dies the step cannot finish: the job stops, is started
again, and every worker resumes from the last checkpoint.  What is lost is
the work since that checkpoint.
"""

import json
import os
import shutil
import time

import numpy as np

from pargrad._quiet import import_tensorflow_quietly
from pargrad.book.parabola import parabola_data, parabola_model
from pargrad.strategies import sync_strategy
from pargrad.sync import SyncTrainer

tf = import_tensorflow_quietly()


def _task():
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task", {})
    return task.get("type", "worker"), int(task.get("index", 0))


def train_parabola_multiworker(steps=600, points=48, checkpoint_dir=None, checkpoint_every=100,
                               report_every=25, learning_rate=1e-2, seed=0, verbose=True,
                               seconds_between_reports=0.0, dtype="float32", deterministic=False):
    """Train the y = x² network synchronously on ``points`` points, full batch, ``steps`` steps.

    Runs in every worker of a :class:`pargrad.LocalCluster` (or in one
    process, on its logical devices); 48 points split evenly over 2, 3, 4
    or 6 workers.  Without ``checkpoint_dir`` it only trains.  With it, it
    saves a checkpoint every ``checkpoint_every`` steps and at start restores the latest
    checkpoint in ``checkpoint_dir`` if there is one (the model's weights
    and the optimizer, whose ``iterations`` counts the steps done) and
    trains the remaining steps of ``steps``.  It prints ``resumed at step
    N``, then ``step N`` every ``report_every`` steps and ``checkpoint N``
    after each save (``verbose=False``: nothing).  ``seconds_between_reports``
    makes every worker sleep that long after each report: the tiny model
    trains 300 steps in well under a second, and a run that lasts a few
    seconds lets a chapter or a test stop a worker at a chosen step.
    ``dtype="float64"`` trains in float64 (for comparisons that rounding
    must not blur); ``deterministic=True`` makes this process choose
    deterministic kernels (``tf.config.experimental.enable_op_determinism``),
    so that two runs are equal bit for bit on a GPU too, as they already
    are on a CPU.

    Every worker calls ``save``: the chief (worker 0) writes into
    ``checkpoint_dir``, the others into a temporary directory that is deleted
    (saving may need every worker to take part, and only one copy must
    land).  Returns the final ``weights``, the ``loss`` of the steps this
    run did, and ``resumed_at``.

    Taught in the chapter "Beyond one machine".

    Shown in the chapter "Beyond one machine".
    """
    _check_intervals(checkpoint_dir, checkpoint_every, report_every)
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    report = _Reporter(verbose, seconds_between_reports)
    strategy = sync_strategy()  # MultiWorkerMirroredStrategy when TF_CONFIG names workers
    with strategy.scope():
        model = parabola_model(seed=seed, dtype=dtype)
    trainer = SyncTrainer(model, strategy, learning_rate=learning_rate, progress=False)
    checkpoints = _WorkerCheckpoints(checkpoint_dir, model, trainer.optimizer)  # restores
    done = resumed_at = int(trainer.optimizer.iterations.numpy())
    report(f"resumed at step {done}")
    x, y = parabola_data(points, dtype=dtype)
    losses = []
    while done < steps:
        n = min(report_every, steps - done)
        losses.append(trainer.fit(x, y, steps=n, steps_per_call=n).loss)
        done += n
        report(f"step {done}")
        if done % checkpoint_every == 0 or done == steps:
            checkpoints.save(done, report)
        report.pause()
    checkpoints.close()
    return {
        "weights": [np.asarray(w) for w in model.get_weights()],
        "loss": np.concatenate(losses) if losses else np.zeros(0),
        "resumed_at": resumed_at,
        "replicas": trainer.replicas,
    }


def _check_intervals(checkpoint_dir, checkpoint_every, report_every):
    if checkpoint_dir is not None and checkpoint_every % report_every:
        raise ValueError(
            f"checkpoint_every ({checkpoint_every}) must be a multiple of report_every "
            f"({report_every}); the run saves between calls of fit."
        )


class _Reporter:
    """Prints a worker's progress lines (or nothing), and sleeps between reports if asked."""

    def __init__(self, verbose, seconds_between_reports):
        self.verbose = verbose
        self.seconds = seconds_between_reports

    def __call__(self, line):
        if self.verbose:
            print(line, flush=True)

    def pause(self):
        time.sleep(self.seconds)


class _WorkerCheckpoints:
    """A worker's checkpoints: restores the latest at start, saves on request.

    Every worker saves (saving may need every worker to take part): the
    chief (worker 0) into ``checkpoint_dir``, the others into a temporary
    directory that :meth:`close` deletes, so that only one copy lands.
    Without ``checkpoint_dir`` it does nothing.
    """

    def __init__(self, checkpoint_dir, model, optimizer):
        self.manager = None
        if checkpoint_dir is None:
            return
        role, index = _task()
        self.chief = index == 0
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        self.directory = (checkpoint_dir if self.chief
                          else os.path.join(checkpoint_dir, f".tmp-{role}-{index}"))
        self.manager = tf.train.CheckpointManager(checkpoint, self.directory, max_to_keep=2)
        latest = tf.train.latest_checkpoint(checkpoint_dir)
        if latest:
            checkpoint.restore(latest).assert_existing_objects_matched()

    def save(self, step, report):
        if self.manager is not None:
            self.manager.save(checkpoint_number=step)
            report(f"checkpoint {step}")

    def close(self):
        if self.manager is not None and not self.chief:
            shutil.rmtree(self.directory, ignore_errors=True)
