"""pargrad.allreduce: the ring all-reduce's steps (NumPy) and the bytes each replica sends."""

import numpy as np
import pytest

from pargrad import cost
from pargrad.allreduce import ring_all_reduce, ring_bytes


@pytest.mark.parametrize("replicas", [2, 3, 4, 5])
def test_ring_all_reduce_gives_every_replica_the_sum(replicas):
    rng = np.random.default_rng(replicas)
    vectors = rng.standard_normal((replicas, 3 * replicas))
    result, states, sent = ring_all_reduce(vectors)
    assert np.allclose(result, vectors.sum(axis=0))
    assert len(states) == 2 * (replicas - 1) + 1 and len(sent) == 2 * (replicas - 1)
    # every replica sends one chunk a step: 2 (n - 1) / n of its vector in all
    assert all(sorted(s for s, _, _ in step) == list(range(replicas)) for step in sent)


@pytest.mark.parametrize("replicas", [2, 3, 4, 8])
def test_ring_bytes_are_the_chunks_the_steps_send(replicas):
    vectors = np.ones((replicas, 2 * replicas))
    _, _, sent = ring_all_reduce(vectors)
    chunk_bytes = vectors[0].nbytes / replicas
    for replica in range(replicas):
        chunks = sum(1 for step in sent for sender, _, _ in step if sender == replica)
        assert chunks * chunk_bytes == ring_bytes(vectors[0].nbytes, replicas)
    assert ring_bytes(24, replicas) == 2 * (replicas - 1) / replicas * 24
    assert ring_bytes(24, replicas) == cost.ring_pattern(replicas).traffic * 24


def test_one_replica_sends_nothing_and_bad_input_is_refused():
    assert ring_bytes(1e6, 1) == 0
    with pytest.raises(ValueError, match="replicas must be a whole number >= 1"):
        ring_bytes(1e6, 0)
    with pytest.raises(ValueError, match="one row per replica"):
        ring_all_reduce(np.ones(4))
    with pytest.raises(ValueError, match="multiple of the replicas"):
        ring_all_reduce(np.ones((3, 4)))
