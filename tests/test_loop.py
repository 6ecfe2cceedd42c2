"""pargrad.loop without a strategy: the fit loop drives a trainer's calls, the reader keeps the position."""

import dataclasses

import keras
import numpy as np
import pytest

import pargrad
from pargrad.data import EpochReader, Feed, TrainingPosition, fit_source
from pargrad.loop import KerasHistory, StepRecords, StoppedCall, fit_loop


class CountingTrainer:
    """The loop's protocol and nothing else: each step's loss is its first row's x."""

    def __init__(self, stop_at=None):
        self.model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        self.metrics = []
        self.calls, self.stop_at = [], stop_at

    def run_call(self, call, done):
        self.calls.append((done, call.first_row, call.steps))
        rows = [(call.first_row + i * call.batch_size) % int(call.x.shape[0])
                for i in range(call.steps)]
        if self.stop_at is not None and done + call.steps > self.stop_at:
            raise StoppedCall(self.stop_at - done, lambda step: ArithmeticError(f"step {step}"))
        loss = call.x.numpy()[rows, 0]
        return {"loss": loss}, np.zeros(call.steps), np.ones(call.steps)

    def evaluate_source(self, source, prefix=""):
        return {f"{prefix}loss": -1.0}


def reader_of(position, steps=None, steps_per_call=1, batch_size=2, shuffle=False):
    x = np.arange(20, dtype="float32").reshape(10, 2)
    feed = Feed()
    source = fit_source(x, x[:, :1], batch_size, by_epoch=steps is None, shuffle=shuffle,
                        model=keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]),
                        feed=feed)
    return EpochReader(source, position, feed, steps=steps, steps_per_call=steps_per_call,
                       shuffle=shuffle, seed=0 if shuffle else None)


def test_the_loop_runs_the_calls_in_keras_callback_order_and_the_reader_moves_the_position():
    trainer, position = CountingTrainer(), TrainingPosition()
    events = []
    logger = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: events.append(("epoch", epoch)),
        on_train_batch_end=lambda batch, logs: events.append(("batch", batch)),
        on_epoch_end=lambda epoch, logs: events.append(("end", epoch, sorted(logs))))
    records, history = fit_loop(trainer, reader_of(position, steps_per_call=2), epochs=2,
                                callbacks=[logger], validation=object())
    assert trainer.calls == [(0, 0, 2), (2, 4, 2), (4, 8, 1), (5, 0, 2), (7, 4, 2), (9, 8, 1)]
    assert events == [("epoch", 0), ("batch", 1), ("batch", 3), ("batch", 4),
                      ("end", 0, ["loss", "val_loss"]),
                      ("epoch", 1), ("batch", 1), ("batch", 3), ("batch", 4),
                      ("end", 1, ["loss", "val_loss"])]
    assert position.numbers() == {"step": 10, "epoch": 2, "epoch_step": 0, "position": 0,
                                  "seed": -1}
    assert records.steps == 10 and history.history["val_loss"] == [-1.0, -1.0]
    assert history.history["loss"] == [pytest.approx(np.mean([0, 4, 8, 12, 16]))] * 2


def test_a_stopped_call_counts_the_steps_before_it_then_raises_its_error():
    trainer, position = CountingTrainer(stop_at=4), TrainingPosition()
    with pytest.raises(ArithmeticError, match="step 4"):
        fit_loop(trainer, reader_of(position, steps=6, steps_per_call=3), epochs=1)
    assert position.numbers()["step"] == 4
    assert position.numbers()["position"] == (4 * 2) % 10      # the next batch's first row


def test_stop_training_ends_the_fit_after_the_call_and_the_epoch_is_not_counted():
    trainer, position = CountingTrainer(), TrainingPosition()
    stopper = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: setattr(trainer.model, "stop_training", batch >= 1))
    fit_loop(trainer, reader_of(position), epochs=3, callbacks=[stopper])
    assert position.numbers()["step"] == 2 and position.numbers()["epoch"] == 0
    assert position.numbers()["epoch_step"] == 2               # a later fit resumes here


def test_other_data_restart_the_position_and_the_same_data_continue():
    position = TrainingPosition()
    fit_loop(CountingTrainer(), reader_of(position, steps=3), epochs=1)
    trainer = CountingTrainer()
    x = np.arange(20, dtype="float32").reshape(10, 2)
    feed = Feed()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    source = fit_source(x, x[:, :1], 2, by_epoch=False, shuffle=False, model=model, feed=feed)
    fit_loop(trainer, EpochReader(source, position, feed, steps=1), epochs=1)
    assert trainer.calls == [(0, 0, 1)]                          # other arrays: row 0 again
    fit_loop(trainer, EpochReader(source, position, feed, steps=1), epochs=1)
    assert trainer.calls[-1] == (0, 2, 1)                        # the same arrays continue


def test_step_records_stack_rows_and_shape_empty_ones():
    records = StepRecords(empty={"times": (2, 3)})
    assert records.stacked("times").shape == (0, 2, 3)
    records.add({"loss": [1.0, 2.0]}, [0.0, 1.0], [1.0, 1.0])
    records.add({"loss": [3.0]}, [2.0], [1.0])
    assert records.steps == 3 and list(records.stacked("loss")) == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("history", [pargrad.SyncHistory, pargrad.ShardedHistory,
                                     pargrad.LocalSGDHistory, pargrad.AsyncHistory])
def test_every_trainer_history_extends_the_one_keras_history(history):
    assert issubclass(history, KerasHistory)
    keras_fields = {f.name for f in dataclasses.fields(KerasHistory)}
    assert keras_fields == {"history", "epoch", "params"}
    own = [f for f in dataclasses.fields(history) if f.name not in keras_fields]
    assert all(not f.kw_only for f in own)  # a history's own fields stay positional


def test_a_history_takes_its_own_fields_by_position_and_keras_fields_by_name():
    steps = np.arange(3.0)
    made = pargrad.SyncHistory(steps, steps, steps, 2, 1, 4, history={"loss": [1.0]}, epoch=[0])
    assert (made.replicas, made.micro_batch_size, made.history, made.epoch, made.params) == (
        2, 4, {"loss": [1.0]}, [0], {})
    with pytest.raises(TypeError):
        pargrad.SyncHistory(steps, steps, steps, 2, 1, 4, {"loss": [1.0]})
