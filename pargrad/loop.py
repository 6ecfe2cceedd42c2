"""The fit loop every strategy trainer shares: epochs, calls, callbacks, validation, records.

Taught in the chapter "Synchronous training".  A trainer's ``fit`` checks
its arguments, makes a :class:`pargrad.data.EpochReader` (which batches come
next, and the position) and hands both to :func:`fit_loop`, which does the
rest as Keras's ``fit`` does (``keras/src/backend/tensorflow/trainer.py``):

* :func:`fit_loop`: the epochs inside Keras's callback protocol, built on
  ``keras.callbacks.CallbackList(add_history=True)``, so the per-epoch
  history is Keras's own ``History``; validation at each epoch's end;
* :func:`train_epoch`: one epoch, a ``for`` loop over the reader's calls,
  each run by the trainer between two batch callbacks; the reader is told
  what ran (it is the only writer of the position);
* :class:`StepRecords`: what every step left behind (its loss, when it
  started, how long it took, and whatever else the step returns),
  collected as rows and stacked into arrays at the end;
* :func:`progress_bar`: a tqdm bar (notebook-aware) or nothing, for every
  trainer's fit (:class:`pargrad.AsyncTrainer`'s too);
* :func:`keras_history`: Keras's ``History`` of a fit run by a loop of its
  own (:class:`pargrad.AsyncTrainer`'s workers);
* :class:`KerasHistory`: the per-epoch fields of Keras's ``History`` that
  the four trainers' histories extend (:class:`pargrad.SyncHistory`,
  :class:`pargrad.ShardedHistory`, :class:`pargrad.LocalSGDHistory`,
  :class:`pargrad.AsyncHistory`).

What the loop asks of a trainer (composition, not a base class):
``model`` (its ``stop_training`` flag), ``metrics`` (Keras metrics its
steps update; may be empty), ``run_call(call, done)`` (run one
:class:`pargrad.data.Call` of ``call.steps`` steps, ``done`` steps into the
fit; return ``(outputs, starts, step_times)``, ``outputs`` a dict of arrays
with one row a step and ``"loss"`` among them; raise :class:`StoppedCall`
when a step stopped) and ``evaluate_source(source, prefix)`` (the logs of
validation data).  It knows nothing of strategies.
"""

import contextlib
import dataclasses

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)


@dataclasses.dataclass(kw_only=True)
class KerasHistory:
    """The per-epoch record of a fit, as Keras's ``History``: the fields every trainer's history has.

    ``history``: one list an epoch's log (``history["loss"]``, one entry per
    metric, ``val_loss`` and ``val_<metric>`` with validation data);
    ``epoch``: the epochs' indices; ``params``: what the callbacks were told
    (``epochs``, ``steps``).  Keyword-only, so that each trainer's history
    (:class:`pargrad.SyncHistory`, :class:`pargrad.ShardedHistory`,
    :class:`pargrad.LocalSGDHistory`, :class:`pargrad.AsyncHistory`) puts
    its own per-step fields first.  Taught in the chapter "Synchronous
    training".
    """

    history: dict = dataclasses.field(default_factory=dict)
    epoch: list = dataclasses.field(default_factory=list)
    params: dict = dataclasses.field(default_factory=dict)


class StoppedCall(Exception):
    """A call stopped after ``completed`` of its steps; ``error(step)`` is the error to raise.

    ``step`` is the position's step once the completed steps are counted,
    i.e. the step that stopped.  Raised by a trainer's ``run_call``; the loop
    moves the position past the completed steps and raises ``error(step)``.
    """

    def __init__(self, completed, error):
        super().__init__(completed)
        self.completed, self.error = int(completed), error


def fit_loop(trainer, reader, *, epochs, callbacks=None, validation=None, progress=None):
    """Train ``epochs`` epochs of ``reader``'s calls; return ``(StepRecords, keras History)``.

    As Keras's ``fit``: ``on_train_begin``; per epoch ``on_epoch_begin(epoch)``,
    the epoch (:func:`train_epoch`), validation on ``validation`` (a
    checked source, logs ``val_*``), the reader counts the epoch, then
    ``on_epoch_end(epoch, logs)``; epochs are numbered from the epochs the
    position has completed; a callback that sets ``model.stop_training``
    ends the fit after its step; ``on_train_end`` with the last logs.
    ``progress``: None, or the description of a progress bar to show.

    Shown in the chapter "Synchronous training in depth".
    """
    model = trainer.model
    hooks = keras.callbacks.CallbackList(callbacks, add_history=True, model=model,
                                         epochs=epochs, steps=reader.steps_per_epoch, verbose=0)
    records = StepRecords()
    total = reader.steps_per_epoch and reader.steps_per_epoch * epochs
    bar = progress_bar(total, progress is not None, progress)
    model.stop_training = False
    hooks.on_train_begin()
    logs, first = None, reader.epoch
    try:
        for epoch in range(first, first + epochs):
            hooks.on_epoch_begin(epoch)
            logs = train_epoch(trainer, reader, hooks, records, bar)
            if validation is not None:
                logs.update(trainer.evaluate_source(validation, prefix="val_"))
            reader.end_epoch(stopped=model.stop_training)
            hooks.on_epoch_end(epoch, logs)
            if model.stop_training:
                break
    finally:
        if bar is not None:
            bar.close()
    hooks.on_train_end(logs)
    return records, next(c for c in hooks.callbacks if isinstance(c, keras.callbacks.History))


def train_epoch(trainer, reader, hooks, records, bar=None):
    """One epoch (or a fit's steps): the trainer runs each call between the batch callbacks.

    Callbacks see a call as one batch, indexed by its last step (as Keras's
    ``steps_per_execution``), with the epoch's running ``loss`` and metrics.
    Returns the epoch's logs.

    Shown in the chapter "Synchronous training in depth".
    """
    for metric in trainer.metrics:
        metric.reset_state()
    losses, index = [], reader.first_index()
    with contextlib.closing(reader.calls()) as calls:
        for call in calls:
            hooks.on_train_batch_begin(index)
            try:
                outputs, starts, step_times = trainer.run_call(call, records.steps)
            except StoppedCall as stop:
                reader.advance(call, stop.completed)
                raise stop.error(int(reader.position.step.numpy())) from None
            reader.advance(call, call.steps)
            records.add({**outputs, "batch_size": [call.batch_size] * call.steps},
                        starts, step_times)
            losses.extend(np.asarray(outputs["loss"]).tolist())
            show_progress(bar, call.steps, losses[-1])
            index += call.steps
            hooks.on_train_batch_end(index - 1, epoch_logs(trainer, losses))
            if trainer.model.stop_training:
                break
    return epoch_logs(trainer, losses)


def keras_history(model, logs, steps):
    """Keras's ``History`` of a fit that was one epoch of ``steps`` steps ending with ``logs``.

    For a trainer with a loop of its own (:class:`pargrad.AsyncTrainer`'s
    workers): the history is made by the callback protocol :func:`fit_loop`
    runs, so its ``history``, ``epoch`` and ``params`` read as Keras's do.
    """
    hooks = keras.callbacks.CallbackList(None, add_history=True, model=model, epochs=1,
                                         steps=steps, verbose=0)
    hooks.on_train_begin()
    hooks.on_epoch_begin(0)
    hooks.on_epoch_end(0, logs)
    hooks.on_train_end(logs)
    return next(c for c in hooks.callbacks if isinstance(c, keras.callbacks.History))


def epoch_logs(trainer, losses):
    """A batch's or an epoch's logs: the mean loss so far and the metrics, as Keras's."""
    logs = {"loss": float(np.mean(losses)) if losses else float("nan")}
    logs.update({metric.name: float(metric.result()) for metric in trainer.metrics})
    return logs


class StepRecords:
    """The rows every call of a step function leaves: one row a step.

    :meth:`add` takes a call's ``outputs`` (a dict of arrays with one row a
    step, ``"loss"`` among them), the steps' start times and lengths;
    :meth:`stacked` returns each as one array (empty ones shaped by
    ``empty``, a dict of trailing shapes).
    """

    def __init__(self, empty=None):
        self.rows = {}
        self._empty = {"loss": (), "start": (), "step_time": (), **(empty or {})}

    def add(self, outputs, starts, step_times):
        """Append one call's rows."""
        for name, rows in {**outputs, "start": starts, "step_time": step_times}.items():
            self.rows.setdefault(name, []).append(np.asarray(rows))

    @property
    def steps(self):
        """Steps recorded so far."""
        return sum(len(rows) for rows in self.rows.get("loss", []))

    def stacked(self, name):
        """All rows of ``name`` as one array (shape ``(0, *trailing)`` if none)."""
        if self.rows.get(name):
            return np.concatenate(self.rows[name])
        return np.empty((0,) + tuple(self._empty.get(name, ())))


def progress_bar(total, show, description):
    """A tqdm progress bar over ``total`` steps if ``show``, else None."""
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, mininterval=0.5, leave=True)


def show_progress(bar, steps, loss):
    """Advance ``bar`` (if any) by ``steps`` and show the last ``loss``."""
    if bar is not None:
        bar.update(steps)
        bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
