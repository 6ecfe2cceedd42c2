"""How fast emulated devices are, as one value, and the virtual clock that follows from it.

Taught in the chapters "Asynchronous training" and "Sync vs async in the
same time".  A :class:`Scenario` says how long each device takes for one
step, in units of a step of a device of speed 1: ``(1 + delay) / speed``
(:meth:`Scenario.step_time`, the one place of that formula), the delay
drawn by :func:`random_delay`.  :func:`virtual_clock` orders the reads and
applies of asynchronous workers by these durations: it drives
:class:`pargrad.AsyncTrainer`'s scheduled mode, and :func:`virtual_schedule`
(the same clock, as arrays) drives the book's float64 replays.  The
trainer's free-running mode stretches real steps by :meth:`Scenario.step_time`,
and the book's synchronous races draw their replicas' step times with
:meth:`Scenario.step_times`.
"""

import dataclasses
import heapq

import numpy as np

from pargrad.checks import (
    ArgumentTypeError, check_choice, check_instance, check_positive, check_whole_number,
)

DELAY_DISTRIBUTIONS = ("exponential", "pareto")
# The columns of a schedule: AsyncTrainer's history has the same names.
SCHEDULE_KEYS = ("worker", "read_version", "applied_version", "staleness", "read_time", "time")


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
            raise ArgumentTypeError(
                f"speeds must be a sequence of one positive number a device, got "
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
        return cls((1.0,) * check_whole_number("devices", devices))

    def step_time(self, rng, device):
        """One step's duration on ``device``: ``(1 + delay) / speed``, the delay drawn from ``rng``."""
        return (1.0 + random_delay(rng, self.jitter, self.delay_distribution)) / self.speeds[device]

    def step_times(self, steps, rng):
        """``(steps, devices)`` durations of :meth:`step_time`, drawn step by step, device by device.

        Row ``i`` holds each device's ``i``-th step: the replicas of a
        synchronous step.  Taught in the chapter "Sync vs async in the same time".
        """
        steps, devices = check_whole_number("steps", steps, minimum=0), len(self.speeds)
        return np.array([[self.step_time(rng, device) for device in range(devices)]
                         for _ in range(steps)], dtype=float).reshape(steps, devices)


def check_scenario(scenario, devices=None, *, jitter=True, advice=""):
    """The one check of a device-speed value: ``scenario`` as a :class:`Scenario`.

    With ``devices`` (a count), None means that many equal devices
    (:meth:`Scenario.equal`) and a scenario needs one speed for each.  With
    ``jitter=False`` (a clock that has no random delays) a scenario with
    ``jitter`` is refused; ``advice`` says why in the message.  A wrong type
    raises :class:`pargrad.checks.ArgumentTypeError`, a wrong value
    ``ValueError``.  Taught in the chapter "Asynchronous training".
    """
    if scenario is None and devices is not None:
        return Scenario.equal(devices)
    example = "Scenario(speeds=(1.0, 0.5), jitter=0.2)" if jitter else "Scenario(speeds=(1.0, 0.5))"
    check_instance("scenario", scenario, Scenario,
                   "a pargrad.Scenario" + (" or None (equal devices)" if devices is not None else ""),
                   advice=f"Pass for example {example}.")
    if devices is not None and len(scenario.speeds) != devices:
        raise ValueError(
            f"scenario.speeds must hold one positive number per device ({devices}), got "
            f"{scenario.speeds!r}; for example (1.0, 0.5) makes device 1 twice as slow.")
    if not jitter and scenario.jitter:
        raise ValueError(
            f"scenario.jitter must be 0 here, got {scenario.jitter!r}"
            + (f" ({advice})" if advice else "") + "; pass Scenario(speeds) without jitter.")
    return scenario


def virtual_clock(scenario, seed=0, may_start=None):
    """Who reads and who applies when, on the virtual clock of ``scenario``: a generator.

    Yields ``(event, worker, time)``, ``event`` being ``"read"`` or
    ``"apply"``, in the order they happen.  Every worker reads at time 0; a
    worker that reads at ``t`` applies at ``t`` plus one
    :meth:`Scenario.step_time`, drawn from one generator seeded by ``seed``
    in the order of the reads.  The earliest apply comes next, the lower
    worker first on a tie (a heap of ``(time, worker)``).  After an apply,
    that worker and then the others, lowest first, read at once if they are
    not computing and ``may_start(worker)`` says so (default: always; see
    :meth:`pargrad.AsyncTrainer.may_start`).  It never ends: the caller
    stops after the updates it wants.  :class:`pargrad.AsyncTrainer`'s
    scheduled mode runs on it, and :func:`virtual_schedule` collects it.
    Taught in the chapter "Asynchronous training".
    """
    scenario = check_scenario(scenario)
    rng = np.random.default_rng(seed)
    workers = range(len(scenario.speeds))
    finishing = []  # heap of (virtual time the worker's gradient is ready, worker)
    for worker in workers:
        yield "read", worker, 0.0
        heapq.heappush(finishing, (scenario.step_time(rng, worker), worker))
    while finishing:
        now, worker = heapq.heappop(finishing)
        yield "apply", worker, now
        computing = {w for _, w in finishing}
        # Read again right away, unless may_start says wait; a waiting worker
        # starts at the first apply after which it may (here, now).
        for ready in [worker] + [w for w in workers if w != worker]:
            if ready not in computing and (may_start is None or may_start(ready)):
                yield "read", ready, now
                heapq.heappush(finishing, (now + scenario.step_time(rng, ready), ready))


def virtual_schedule(scenario, steps, seed=0):
    """The first ``steps`` updates of :func:`virtual_clock`, as a dict of arrays.

    One entry an update, in the order applied: ``worker``, ``read_version``
    (the updates applied when it read), ``applied_version``, ``staleness``
    (their difference), ``read_time`` and ``time`` (when it applied): the
    columns of :class:`pargrad.AsyncTrainer`'s history in scheduled mode
    without a staleness bound, for the same scenario and seed.  It depends
    on the speeds and the delays, never on the parameters, so the book's
    float64 replays (:mod:`pargrad.book.parabola_async`) apply it to many
    initial weights at once.  Taught in the chapter "Asynchronous training".
    """
    steps = check_whole_number("steps", steps)
    reads, rows = {}, []
    for event, worker, now in virtual_clock(scenario, seed):
        if event == "read":
            reads[worker] = (len(rows), now)
            continue
        version, read_time = reads.pop(worker)
        rows.append((worker, version, len(rows), len(rows) - version, read_time, now))
        if len(rows) == steps:
            break
    return {key: np.array(column) for key, column in zip(SCHEDULE_KEYS, zip(*rows))}


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
    if check_choice("distribution", distribution, DELAY_DISTRIBUTIONS) == "exponential":
        return float(rng.exponential(jitter))
    shape = 1.5  # numpy's pareto(a) is Lomax, mean 1 / (a - 1) = 2
    return float(rng.pareto(shape) * jitter * (shape - 1.0))
