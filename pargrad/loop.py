"""The loop around a step: Keras's callback protocol, the per-step records, the progress bar.

Taught in the chapter "Synchronous training".  A trainer's ``fit`` is three
things around its step function, and this module holds them so that the
trainer holds the step:

* :func:`fit_with_callbacks`: the order in which Keras's ``fit`` calls its
  callbacks (``keras/src/backend/tensorflow/trainer.py``), in one short
  function built on ``keras.callbacks.CallbackList(add_history=True)``, so
  the per-epoch history is Keras's own ``History``;
* :class:`StepRecords`: what every step left behind (its loss, when it
  started, how long it took, and whatever else the step function returns),
  collected as rows and stacked into arrays at the end;
* :func:`progress_bar`: a tqdm bar (notebook-aware) or nothing.

It knows nothing of strategies or data: the trainer passes a function
that trains one epoch.
"""

import numpy as np

from pargrad._quiet import import_tensorflow_quietly

import_tensorflow_quietly()
import keras  # noqa: E402  (after the quiet TensorFlow import)


def fit_with_callbacks(model, callbacks, *, epochs, steps, initial_epoch, train_epoch):
    """Run ``train_epoch(hooks)`` ``epochs`` times inside Keras's callback protocol.

    ``train_epoch`` trains one epoch, calling ``hooks.on_train_batch_begin``
    and ``on_train_batch_end`` around its steps, and returns the epoch's
    logs (``loss``, metrics, ``val_*``).  Around it, as Keras's ``fit``:
    ``on_train_begin``; per epoch ``on_epoch_begin(epoch)`` and
    ``on_epoch_end(epoch, logs)``, epochs numbered from ``initial_epoch``;
    a callback that sets ``model.stop_training`` ends the fit after its
    epoch; ``on_train_end`` with the last epoch's logs.  ``steps`` (per
    epoch, or None) is what the callbacks' ``params`` say.  Returns Keras's
    ``History`` (``history``, ``epoch``, ``params``).
    """
    hooks = keras.callbacks.CallbackList(callbacks, add_history=True, model=model,
                                         epochs=epochs, steps=steps, verbose=0)
    model.stop_training = False
    hooks.on_train_begin()
    logs = None
    for epoch in range(initial_epoch, initial_epoch + epochs):
        hooks.on_epoch_begin(epoch)
        logs = train_epoch(hooks)
        hooks.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    hooks.on_train_end(logs)
    return next(c for c in hooks.callbacks if isinstance(c, keras.callbacks.History))


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
