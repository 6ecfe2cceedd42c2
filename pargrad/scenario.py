"""How fast emulated devices are: relative speeds and random delays, as one value.

Taught in the chapters "Asynchronous training" and "Sync vs async in the
same time".  A :class:`Scenario` says how long each device takes for one
step, in units of a step of a device of speed 1: ``(1 + delay) / speed``,
the delay drawn by :func:`random_delay`.  :class:`pargrad.AsyncTrainer`'s
virtual clock orders reads and applies by these durations, its free-running
mode stretches real steps by them, and the book's synchronous races draw
their replicas' step times from the same distribution.
"""

import dataclasses

from pargrad.checks import check_choice, check_positive

DELAY_DISTRIBUTIONS = ("exponential", "pareto")


@dataclasses.dataclass(frozen=True)
class Scenario:
    """How fast the devices are: relative ``speeds`` and random delays (mean ``jitter`` steps).

    ``speeds`` has one positive number a device (``(1, 1, 1, 1/3)``: the
    last device takes three times as long); ``jitter`` is the mean of a
    random extra delay, in steps (0: none), drawn from
    ``delay_distribution`` (``"exponential"`` or the heavy-tailed
    ``"pareto"``, see :func:`random_delay`).
    """

    speeds: tuple
    jitter: float = 0.0
    delay_distribution: str = "exponential"

    def __post_init__(self):
        if isinstance(self.speeds, (str, bytes)) or not hasattr(self.speeds, "__len__") \
                or len(self.speeds) == 0:
            raise TypeError(f"speeds must be a sequence of one positive number a device, got "
                            f"{self.speeds!r}; for example (1.0, 0.5): device 1 twice as slow.")
        speeds = tuple(check_positive("each of speeds", s) for s in self.speeds)
        object.__setattr__(self, "speeds", speeds)
        if self.jitter != 0:
            object.__setattr__(self, "jitter", check_positive("jitter (0 for no delays)",
                                                              self.jitter))
        check_choice("delay_distribution", self.delay_distribution, DELAY_DISTRIBUTIONS)

    @classmethod
    def equal(cls, devices):
        """``devices`` devices of equal speed, without delays."""
        return cls((1.0,) * devices)

    def step_time(self, rng, device):
        """One step's duration on ``device``: ``(1 + delay) / speed``, the delay drawn from ``rng``."""
        return (1.0 + random_delay(rng, self.jitter, self.delay_distribution)) / self.speeds[device]


def random_delay(rng, jitter, distribution="exponential"):
    """One random extra delay, in units of a step, with mean ``jitter`` (0 gives 0.0).

    ``"exponential"``: ``rng.exponential(jitter)``, light-tailed.
    ``"pareto"``: a Lomax (Pareto II) draw of shape 1.5 scaled to the same
    mean, heavy-tailed: its variance is infinite, and now and then a step
    takes many times the mean (a device busy with something else).  Both
    trainers' virtual clocks draw their delays here, so synchronous and
    asynchronous runs see the same kind of delays.

    Used in the chapter "Sync vs async in the same time".
    """
    if not jitter:
        return 0.0
    if distribution == "exponential":
        return float(rng.exponential(jitter))
    if distribution == "pareto":
        shape = 1.5  # numpy's pareto(a) is Lomax, mean 1 / (a - 1) = 2
        return float(rng.pareto(shape) * jitter * (shape - 1.0))
    raise ValueError(f"distribution must be one of {DELAY_DISTRIBUTIONS}, got {distribution!r}.")
