"""What the synchronous trainers' tests share: a trainer on the parabola or a given model, an MLP, a gap."""

import keras
import numpy as np

from pargrad.book.parabola import parabola_model
from pargrad.strategies import sync_strategy
from pargrad.sync import SyncTrainer


def max_gap(weights_a, weights_b):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights_a, weights_b))


def trainer_for(replicas, model_fn=None, trainer_class=SyncTrainer, **options):
    """A ``trainer_class`` on ``replicas`` logical devices, the model built in its scope."""
    strategy = sync_strategy(replicas)
    with strategy.scope():
        model = (model_fn or (lambda: parabola_model(seed=0)))()
    return trainer_class(model, strategy, progress=False, **options)


def mlp(features=64, width=256):
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((features,)),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(1),
    ])
