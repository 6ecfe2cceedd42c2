"""What communication costs: the alpha-beta model of messages, all-reduce and parameter servers.

Taught in the chapter "What communication costs".  A message of ``n`` bytes
over a link costs ``latency + n / bandwidth`` seconds (the alpha-beta model:
alpha is the latency, beta the bandwidth).  Every algorithm here is described
by the same two numbers, a :class:`Pattern`: how many messages follow one
another on its critical path, and how many times ``n`` bytes go through its
busiest link.  Its time is then ``messages * latency + traffic * n / bandwidth``.

===========================  ==========================  ===========================
algorithm                    messages one after another  traffic (multiples of n)
===========================  ==========================  ===========================
one message                  1                           1
ring all-reduce, R replicas  2 (R - 1)                   2 (R - 1) / R
reduce-scatter, R replicas   R - 1                       (R - 1) / R
all-gather, R replicas       R - 1                       (R - 1) / R
tree (binomial), R replicas  2 ceil(log2 R)              2 ceil(log2 R)
parameter servers (W, S)     2 (push, pull)              2 max(1, W / S)
===========================  ==========================  ===========================

A calculator, not a simulator: the links are ideal (full duplex, no
contention besides what the pattern says), and the compute and communication
of a step overlap only as :func:`step_time` and :func:`bucketed_step_time`
say.  Units are seconds and bytes throughout.
"""

import dataclasses
import math
import numbers

import numpy as np

from pargrad.checks import ArgumentTypeError, check_positive, check_share, check_whole_number


# ----------------------------------------------------------------------------
# Checking arguments
# ----------------------------------------------------------------------------

def _not_negative(name, value, unit):
    """``value`` as a float or array >= 0: ArgumentTypeError if not numbers, else ValueError."""
    message = f"{name} must be a number of {unit} >= 0, got {value!r}."
    if isinstance(value, (bool, str)):
        raise ArgumentTypeError(message)
    try:
        array = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ArgumentTypeError(message) from None
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(message)
    return float(array) if array.ndim == 0 else array


# ----------------------------------------------------------------------------
# Links and patterns
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Link:
    """A link between two devices: ``latency`` (alpha, seconds a message) and
    ``bandwidth`` (beta, bytes a second, in one direction).

    ``Link(latency=5e-6, bandwidth=25e9, name="InfiniBand HDR")``.  Taught in
    the chapter "What communication costs".
    """

    latency: float
    bandwidth: float
    name: str = ""

    def __post_init__(self):
        message = f"latency must be seconds >= 0 (for example 5e-6), got {self.latency!r}."
        if isinstance(self.latency, bool) or not isinstance(self.latency, numbers.Real):
            raise ArgumentTypeError(message)
        if not 0 <= self.latency < math.inf:
            raise ValueError(message)
        check_positive("bandwidth", self.bandwidth, unit="bytes per second (for example 25e9)")

    def message_time(self, nbytes):
        """Seconds to send one message of ``nbytes`` bytes: latency + nbytes / bandwidth."""
        return message_time(nbytes, self)


@dataclasses.dataclass(frozen=True)
class Pattern:
    """What an algorithm sends on its critical path.

    ``messages``: how many messages follow one another (each pays the
    latency once); ``traffic``: how many times the ``n`` bytes of the
    payload go through the busiest link.  Taught in the chapter "What
    communication costs".

    Shown in the chapter "What communication costs".
    """

    messages: float
    traffic: float

    def time(self, nbytes, link):
        """Seconds for ``nbytes`` bytes over ``link``: messages * latency + traffic * nbytes / bandwidth."""
        nbytes = _not_negative("nbytes", nbytes, "bytes")
        return self.messages * link.latency + self.traffic * nbytes / link.bandwidth


def message_pattern():
    """One message: 1 latency, ``n`` bytes.  Taught in the chapter "What communication costs"."""
    return Pattern(messages=1, traffic=1.0)


def ring_pattern(replicas):
    """Ring all-reduce over ``replicas``: 2(R-1) steps, each sending n/R bytes.

    R - 1 reduce-scatter steps and R - 1 all-gather steps; in each, every
    replica sends one chunk of n/R bytes to its neighbour at the same time.
    One replica: nothing to send.  Taught in the chapter "What communication
    costs".
    """
    replicas = check_whole_number("replicas", replicas, 1)
    steps = 2 * (replicas - 1)
    return Pattern(messages=steps, traffic=steps / replicas)


def half_ring_pattern(replicas):
    """Half a ring all-reduce: a reduce-scatter, or an all-gather, over ``replicas``.

    R - 1 steps, each sending a chunk of n/R bytes to the neighbour.  A
    reduce-scatter leaves each replica the sum of one chunk (its shard); an
    all-gather gives every replica every replica's chunk.  One after the
    other they are the ring all-reduce (:func:`ring_pattern`), which is how
    sharded training (ZeRO) sends what plain data parallelism sends.
    Taught in the chapter "When the model does not fit".
    """
    replicas = check_whole_number("replicas", replicas, 1)
    steps = replicas - 1
    return Pattern(messages=steps, traffic=steps / replicas)


def tree_pattern(replicas):
    """Tree all-reduce over ``replicas``: reduce up a binomial tree, then broadcast down.

    Each direction takes ceil(log2 R) rounds, and in each round a replica
    receives at most one message of the whole n bytes (Thakur et al. 2005).
    This is the textbook binomial tree, not NCCL's: NCCL pipelines chunks
    through two binary trees at once, whose bandwidth term is about the
    ring's; it prefers them at scale for their log-latency.
    Taught in the chapter "What communication costs".
    """
    replicas = check_whole_number("replicas", replicas, 1)
    rounds = 2 * math.ceil(math.log2(replicas))
    return Pattern(messages=rounds, traffic=float(rounds))


def parameter_server_pattern(workers, servers):
    """``workers`` push n bytes of gradients to ``servers`` shards, then pull n bytes of parameters.

    Each worker sends n/S bytes to each of the S servers, so each server's
    link carries W n / S bytes in and as many out; each worker's link
    carries n bytes each way.  The busiest link carries max(n, W n / S)
    bytes in each of the two phases.  Taught in the chapter "What
    communication costs".
    """
    workers = check_whole_number("workers", workers, 1)
    servers = check_whole_number("servers", servers, 1)
    return Pattern(messages=2, traffic=2 * max(1.0, workers / servers))


# ----------------------------------------------------------------------------
# Times
# ----------------------------------------------------------------------------

def message_time(nbytes, link):
    """Seconds for one message of ``nbytes`` over ``link``: alpha + n / beta.

    Taught in the chapter "What communication costs".
    """
    return message_pattern().time(nbytes, link)


def ring_all_reduce_time(nbytes, replicas, link):
    """Seconds for a ring all-reduce of ``nbytes`` over ``replicas`` replicas.

    2(R-1) (alpha + n / (R beta)).  Taught in the chapter "What communication costs".
    """
    return ring_pattern(replicas).time(nbytes, link)


def reduce_scatter_time(nbytes, replicas, link):
    """Seconds for a ring reduce-scatter of ``nbytes`` (the whole vector) over ``replicas``.

    (R-1) (alpha + n / (R beta)): each replica ends with the sum of its
    1/R of the vector.  ``reduce_scatter_time + all_gather_time`` is
    :func:`ring_all_reduce_time` exactly.  Taught in the chapter "When the
    model does not fit".
    """
    return half_ring_pattern(replicas).time(nbytes, link)


def all_gather_time(nbytes, replicas, link):
    """Seconds for a ring all-gather of ``nbytes`` (the whole gathered vector) over ``replicas``.

    (R-1) (alpha + n / (R beta)): each replica starts with 1/R of the
    vector and ends with all of it.  Taught in the chapter "When the model
    does not fit".
    """
    return half_ring_pattern(replicas).time(nbytes, link)


def tree_all_reduce_time(nbytes, replicas, link):
    """Seconds for a (binomial) tree all-reduce: 2 ceil(log2 R) (alpha + n / beta).

    Taught in the chapter "What communication costs".
    """
    return tree_pattern(replicas).time(nbytes, link)


def hierarchical_all_reduce_time(nbytes, replicas_per_box, boxes, inside, across):
    """Seconds for an all-reduce inside each box, then across boxes, then inside again.

    1. Reduce-scatter inside each box over ``inside`` (a ring of
       ``replicas_per_box``): each replica of a box ends with the box's sum of
       1/g of the gradient.
    2. The g replicas of a box each all-reduce their 1/g across the
       ``boxes`` boxes (rings in parallel), sharing the box's network link
       ``across`` (its bandwidth is the whole box's): together the box sends
       what one ring over the whole n would.
    3. All-gather inside each box.

    Steps 1 and 3 together cost one in-box ring all-reduce; step 2 one ring
    all-reduce of n over ``boxes``.  Taught in the chapter "What
    communication costs".
    """
    inside_time = ring_all_reduce_time(nbytes, replicas_per_box, inside)
    across_time = ring_all_reduce_time(nbytes, boxes, across)
    return inside_time + across_time


def parameter_server_time(nbytes, workers, servers, link):
    """Seconds for one push and one pull of ``nbytes`` by each of ``workers`` with ``servers`` shards.

    2 (alpha + max(1, W / S) n / beta): the busiest link is a server's when
    there are more workers than servers.  Taught in the chapter "What
    communication costs".
    """
    return parameter_server_pattern(workers, servers).time(nbytes, link)


def step_time(compute, communication, overlap=0.0):
    """Seconds of one training step: compute plus the communication not hidden behind it.

    ``overlap`` is the share (0 to 1) of the communication that can run
    while the step still computes (during the backward pass); what it hides
    is at most the compute itself.  ``overlap=0``: compute + communication;
    ``overlap=1``: max(compute, communication).  Taught in the chapter
    "What communication costs".

    Shown in the chapter "What communication costs".
    """
    compute = _not_negative("compute", compute, "seconds")
    communication = _not_negative("communication", communication, "seconds")
    overlap = check_share("overlap", overlap, advice="0 hides nothing, 1 all of it.")
    hidden = np.minimum(overlap * communication, compute)
    total = compute + communication - hidden
    return float(total) if np.ndim(total) == 0 else total


def bucketed_step_time(forward, backward, nbytes, buckets, all_reduce_time):
    """Seconds of a step whose gradients are all-reduced in ``buckets`` while the backward pass runs.

    The backward pass (``backward`` seconds, after ``forward`` seconds of
    forward pass) produces the ``nbytes`` of gradients at an even rate; as
    soon as a bucket of nbytes / buckets is complete its all-reduce starts,
    after the previous bucket's all-reduce has finished (one link).
    ``all_reduce_time(nbytes)`` gives the seconds of one all-reduce, for
    example ``lambda n: ring_all_reduce_time(n, 64, link)``.  Returns when
    the last bucket's all-reduce ends.

    One bucket is no overlap at all; many buckets hide almost everything but
    pay the latency once a bucket.  Taught in the chapter "What
    communication costs".

    Shown in the chapter "What communication costs".
    """
    forward = _not_negative("forward", forward, "seconds")
    backward = _not_negative("backward", backward, "seconds")
    nbytes = _not_negative("nbytes", nbytes, "bytes")
    buckets = check_whole_number("buckets", buckets, 1)
    if not callable(all_reduce_time):
        raise TypeError("all_reduce_time must be a function of a number of bytes, for example "
                         "lambda n: pargrad.cost.ring_all_reduce_time(n, 8, link).")
    bucket_time = all_reduce_time(nbytes / buckets)
    link_free_at = 0.0
    for bucket in range(1, buckets + 1):
        ready = forward + backward * bucket / buckets
        start = max(ready, link_free_at)
        link_free_at = start + bucket_time
    return link_free_at


def scaling_efficiency(one_replica_step_time, many_replicas_step_time):
    """Share of the ideal speed-up reached: t(1 replica) / t(R replicas), each replica with its own batch.

    With the batch per replica fixed, R replicas would do R times the work
    a second if a step took as long as on one replica; the efficiency is
    what they reach of that.  Pass the step times of the two settings (for
    a comparison from 8 to 256 GPUs, the 8-GPU step time first).  Taught in
    the chapter "What communication costs".
    """
    one = check_positive("one_replica_step_time", one_replica_step_time, unit="seconds")
    many = check_positive("many_replicas_step_time", many_replicas_step_time, unit="seconds")
    return one / many


# ----------------------------------------------------------------------------
# Fitting alpha and beta to measurements
# ----------------------------------------------------------------------------

@dataclasses.dataclass
class LinkFit:
    """A link fitted to measured times, with what is left over.

    ``link``: the fitted alpha (latency) and beta (bandwidth); ``pattern``:
    the algorithm the times were measured with; ``nbytes`` and ``seconds``:
    the measurements; ``relative_residuals``: (measured - fitted) / measured
    for each.  Taught in the chapter "What communication costs".
    """

    link: Link
    pattern: Pattern
    nbytes: np.ndarray
    seconds: np.ndarray
    relative_residuals: np.ndarray

    def predict(self, nbytes, pattern=None):
        """Seconds the fitted link takes for ``nbytes`` with ``pattern`` (default: the fitted one)."""
        return (pattern or self.pattern).time(nbytes, self.link)


def fit_link(nbytes, seconds, pattern=None, name=""):
    """Fit alpha and beta to times measured for payloads of ``nbytes`` bytes.

    The model is ``seconds = pattern.messages * alpha + pattern.traffic *
    nbytes / beta`` (default pattern: one message).  Least squares on the
    *relative* error, so that the microsecond times of small payloads weigh
    as much as the milliseconds of large ones (with plain least squares the
    largest payload alone would decide alpha).  Returns a :class:`LinkFit`.
    Needs at least two different sizes; a fit whose slope is not positive
    (times that do not grow with the size) raises ValueError.  A negative
    intercept is reported as latency 0.  Taught in the chapter "What
    communication costs".
    """
    pattern = pattern or message_pattern()
    if pattern.messages <= 0 or pattern.traffic <= 0:
        raise ValueError("The pattern sends nothing (one replica?); fit a pattern with messages "
                         f"and traffic > 0, got {pattern}.")
    sizes = np.asarray(nbytes, dtype=float).ravel()
    times = np.asarray(seconds, dtype=float).ravel()
    if sizes.shape != times.shape:
        raise ValueError(f"nbytes and seconds need one entry each per measurement, got "
                         f"{sizes.size} sizes and {times.size} times.")
    if len(np.unique(sizes)) < 2:
        raise ValueError("Measure at least two different sizes; a line needs two points.")
    if np.any(sizes < 0) or np.any(~(times > 0)):
        raise ValueError("nbytes must be >= 0 and every time a positive number of seconds.")
    # seconds = intercept + slope * nbytes, each row divided by its measured time.
    rows = np.stack([np.ones_like(sizes), sizes], axis=1) / times[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(rows, np.ones_like(times), rcond=None)
    if not slope > 0:
        raise ValueError(f"The times do not grow with the size (slope {slope:.3g} s/byte); "
                         "measure larger payloads, or more repeats of each.")
    link = Link(latency=max(0.0, float(intercept) / pattern.messages),
                bandwidth=pattern.traffic / float(slope), name=name)
    fitted = pattern.time(sizes, link)
    return LinkFit(link=link, pattern=pattern, nbytes=sizes, seconds=times,
                   relative_residuals=(times - fitted) / times)


# ----------------------------------------------------------------------------
# The smallest batch that scales
# ----------------------------------------------------------------------------

def smallest_batch_for_efficiency(seconds_per_example, communication, efficiency, overlap=0.0):
    """The smallest per-replica batch whose step keeps ``efficiency`` of the ideal speed-up.

    A replica computes ``batch * seconds_per_example`` seconds a step and
    then spends ``communication`` seconds (for example a
    :func:`ring_all_reduce_time` of the gradient), of which ``overlap`` may
    hide behind the compute (:func:`step_time`).  The efficiency of that step
    is compute / step time (:func:`scaling_efficiency`, one replica needing
    no communication); it grows with the batch.  Returns the smallest whole
    batch >= 1 that reaches ``efficiency`` (a share strictly between 0 and
    1): the batch below which this model stops scaling on this network.

    Without overlap the compute must reach ``efficiency / (1 - efficiency)``
    times the communication; with all of it hidden (``overlap=1``),
    ``efficiency`` times the communication.  Taught in the chapter "What
    communication costs"; the scaling calculator of the rendered book
    computes the same in JavaScript.
    """
    seconds_per_example = check_positive("seconds_per_example", seconds_per_example, unit="seconds")
    communication = _not_negative("communication", communication, "seconds")
    if np.ndim(communication) != 0:
        raise ValueError("communication must be one number of seconds, not an array.")
    efficiency = check_share("efficiency", efficiency, strict=True, advice="Pass 0.9 for 90%.")
    step_time(0.0, 0.0, overlap)  # checks overlap, says what to pass instead
    if communication == 0:
        return 1
    if efficiency <= overlap:   # the step is still the communication: compute / communication
        compute = efficiency * communication
    else:                       # compute + the communication left visible
        compute = efficiency * (1 - overlap) * communication / (1 - efficiency)
    batch = max(1, math.ceil(compute / seconds_per_example))

    def reaches(examples):
        seconds = examples * seconds_per_example
        return scaling_efficiency(seconds, step_time(seconds, communication, overlap)) >= efficiency

    # The formula is exact; rounding may leave the batch one off either way.
    while batch > 1 and reaches(batch - 1):
        batch -= 1
    while not reaches(batch):
        batch += 1
    return batch
