"""A float64 least-squares problem for LocalSGDTrainer, and the target its cluster workers run.

The workers of a pargrad.LocalCluster import this module through PYTHONPATH
(tests/test_local_sgd.py sets it), so the one-process run and every worker
build the same model, optimizers and data from the same lines.
"""

import numpy as np

import keras

START = (np.array([[0.5], [-1.0]]), np.array([0.25]))


def least_squares_data(n=24, poison_row=None):
    """``n`` seeded float64 points of y = 2 x0 + x1 + 0.5 + noise; x huge (finite) at ``poison_row``."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 2))
    y = x @ np.array([[2.0], [1.0]]) + 0.5 + 0.1 * rng.standard_normal((n, 1))
    if poison_row is not None:
        x[poison_row] = 1e200        # finite, but its squared error overflows to inf
    return x, y


def linear_model():
    """y = x @ w + b in float64, starting from START."""
    model = keras.Sequential([keras.Input((2,), dtype="float64"),
                              keras.layers.Dense(1, dtype="float64")])
    model.set_weights([w.copy() for w in START])
    return model


def outer_optimizer(kind):
    """``"average"``: SGD(1.0), plain local SGD; ``"nesterov"``: DiLoCo's outer step."""
    if kind == "average":
        return keras.optimizers.SGD(1.0)
    return keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)


def local_sgd_trainer(strategy, local_steps, outer="nesterov", inner_momentum=0.5, **options):
    """A LocalSGDTrainer on the linear model with an inner SGD(0.0625, momentum) and ``outer``."""
    from pargrad.local_sgd import LocalSGDTrainer

    with strategy.scope():
        model = linear_model()
        outer_step = outer_optimizer(outer)
    inner = keras.optimizers.SGD(0.0625, momentum=inner_momentum)
    return LocalSGDTrainer(model, strategy, local_steps, inner_optimizer=inner,
                           outer_optimizer=outer_step, **{"progress": False, **options})


def train_in_worker(local_steps, rounds, batch_size, outer="nesterov", poison_row=None):
    """Run in each worker of a LocalCluster: train, return the weights and the losses."""
    import pargrad

    strategy = pargrad.sync_strategy()
    trainer = local_sgd_trainer(strategy, local_steps, outer)
    x, y = least_squares_data(poison_row=poison_row)
    history = trainer.fit(x, y, rounds=rounds, batch_size=batch_size)
    return {"weights": trainer.model.get_weights(), "loss": history.loss,
            "replicas": trainer.replicas, "bytes_sent": history.bytes_sent}
