"""pargrad.cost against cases computed by hand (the arithmetic is in the comments)."""

import math

import numpy as np
import pytest

from pargrad import cost

# A slow, round link so that the arithmetic is easy: 1 ms a message, 1 MB/s.
SLOW = cost.Link(latency=1e-3, bandwidth=1e6)


def test_one_message_is_latency_plus_bytes_over_bandwidth():
    # 1e-3 s + 1000 B / 1e6 B/s = 1e-3 + 1e-3 = 2e-3 s
    assert SLOW.message_time(1000) == pytest.approx(2e-3)
    assert cost.message_time(0, SLOW) == pytest.approx(1e-3)


def test_ring_all_reduce_sends_2_r_minus_1_chunks_of_n_over_r():
    # R = 4, n = 4e6 B: 2 * 3 = 6 steps, each 1e-3 s + (4e6 / 4) B / 1e6 B/s = 1.001 s -> 6.006 s
    assert cost.ring_all_reduce_time(4e6, 4, SLOW) == pytest.approx(6.006)
    # R = 2, n = 2e6 B: 2 steps of 1e-3 + 1e6 / 1e6 = 1.001 s -> 2.002 s
    assert cost.ring_all_reduce_time(2e6, 2, SLOW) == pytest.approx(2.002)
    # One replica sends nothing.
    assert cost.ring_all_reduce_time(4e6, 1, SLOW) == 0


def test_ring_traffic_approaches_twice_the_payload():
    # 2 (R - 1) / R: 1 for R = 2, 1.5 for R = 4, 1.875 for R = 16
    assert [cost.ring_pattern(r).traffic for r in (2, 4, 16)] == pytest.approx([1, 1.5, 1.875])


def test_tree_all_reduce_takes_two_log2_r_rounds_of_the_whole_payload():
    # R = 4: 2 * log2(4) = 4 rounds of 1e-3 + 4e6 / 1e6 = 4.001 s -> 16.004 s
    assert cost.tree_all_reduce_time(4e6, 4, SLOW) == pytest.approx(16.004)
    # R = 5 needs ceil(log2 5) = 3 levels: 6 rounds of 1e-3 + 1 s -> 6.006 s
    assert cost.tree_all_reduce_time(1e6, 5, SLOW) == pytest.approx(6.006)
    assert cost.tree_all_reduce_time(1e6, 1, SLOW) == 0


def test_tree_beats_ring_on_latency_and_ring_beats_tree_on_bandwidth():
    many = 64
    latency_only = cost.Link(latency=1e-5, bandwidth=1e12)
    # tiny payload: ring 126 latencies, tree 12
    assert cost.tree_all_reduce_time(4, many, latency_only) < cost.ring_all_reduce_time(4, many, latency_only)
    # big payload: ring ~2n/beta, tree 12 n/beta
    assert cost.ring_all_reduce_time(1e8, many, SLOW) < cost.tree_all_reduce_time(1e8, many, SLOW)


def test_hierarchical_is_a_ring_inside_plus_a_ring_across():
    inside = cost.Link(latency=0, bandwidth=100)
    across = cost.Link(latency=0, bandwidth=10)
    # g = 8, B = 4, n = 800 B: inside 2 * 7/8 * 800 / 100 = 14 s; across 2 * 3/4 * 800 / 10 = 120 s
    assert cost.hierarchical_all_reduce_time(800, 8, 4, inside, across) == pytest.approx(134)
    # one box: only the inside ring
    assert cost.hierarchical_all_reduce_time(800, 8, 1, inside, across) == pytest.approx(14)


def test_parameter_servers_bottleneck_is_the_busiest_link():
    link = cost.Link(latency=1, bandwidth=10)
    # W = 4, S = 2: a server carries 4 * 100 / 2 = 200 B a phase: 2 * (1 + 200/10) = 42 s
    assert cost.parameter_server_time(100, 4, 2, link) == pytest.approx(42)
    # W = 2, S = 4: the worker's own 100 B is the busiest: 2 * (1 + 100/10) = 22 s
    assert cost.parameter_server_time(100, 2, 4, link) == pytest.approx(22)


def test_step_time_hides_at_most_the_compute():
    assert cost.step_time(1.0, 0.5) == pytest.approx(1.5)            # nothing hidden
    assert cost.step_time(1.0, 0.5, overlap=1) == pytest.approx(1.0)  # all hidden
    assert cost.step_time(0.2, 1.0, overlap=1) == pytest.approx(1.0)  # hides only 0.2 s
    # half of 1.0 s may overlap; the 0.5 s fit inside 1.0 s of compute: 1.0 + 1.0 - 0.5
    assert cost.step_time(1.0, 1.0, overlap=0.5) == pytest.approx(1.5)
    np.testing.assert_allclose(cost.step_time(np.array([1.0, 2.0]), 1.0), [2.0, 3.0])


def test_bucketed_step_by_hand():
    two_seconds_a_hundred_bytes = lambda n: n / 100 * 2  # noqa: E731
    # one bucket: forward 1 + backward 4, then 2 s of all-reduce = 7 s
    assert cost.bucketed_step_time(1, 4, 100, 1, two_seconds_a_hundred_bytes) == pytest.approx(7)
    # four buckets of 25 B (0.5 s each), ready at 2, 3, 4, 5 s: the last ends at 5.5 s
    assert cost.bucketed_step_time(1, 4, 100, 4, two_seconds_a_hundred_bytes) == pytest.approx(5.5)
    # a slow link: two buckets of 50 B take 5 s each, ready at 3 and 5 s:
    # the first ends at 8, the second starts at 8 and ends at 13 s (one bucket: 5 + 10 = 15 s)
    slow = lambda n: n / 10  # noqa: E731
    assert cost.bucketed_step_time(1, 4, 100, 2, slow) == pytest.approx(13)
    assert cost.bucketed_step_time(1, 4, 100, 1, slow) == pytest.approx(15)


def test_one_bucket_is_the_step_without_overlap():
    link = cost.Link(latency=1e-5, bandwidth=1e10)
    ring = lambda n: cost.ring_all_reduce_time(n, 8, link)  # noqa: E731
    assert cost.bucketed_step_time(0.1, 0.2, 1e8, 1, ring) == pytest.approx(
        cost.step_time(0.3, ring(1e8)))


def test_too_many_buckets_pay_the_latency_again_and_again():
    # R = 8, 100 MB, 10 us, 1 GB/s: one bucket 0.15 s + (14e-5 + 1.75 * 0.1) = 0.325 s;
    # 8 buckets of 22 ms, the first ready at 62.5 ms: 0.0625 + 8 * 0.022 = 0.239 s;
    # 1000 buckets each pay 14 latencies: 1000 * 0.315 ms = 0.315 s after the first is ready
    link = cost.Link(latency=1e-5, bandwidth=1e9)
    ring = lambda n: cost.ring_all_reduce_time(n, 8, link)  # noqa: E731
    times = {b: cost.bucketed_step_time(0.05, 0.1, 1e8, b, ring) for b in (1, 8, 1000)}
    assert times[1] == pytest.approx(0.32514)
    assert times[8] == pytest.approx(0.0625 + 8 * (14e-5 + 0.175 / 8))
    assert times[8] < times[1] and times[8] < times[1000]


def test_scaling_efficiency():
    assert cost.scaling_efficiency(0.9, 1.0) == pytest.approx(0.9)
    assert cost.scaling_efficiency(1.0, 1.0) == 1


def test_fit_recovers_alpha_and_beta_of_exact_ring_times():
    # alpha = 2 ms, beta = 1 MB/s, R = 4: t = 6 * 2e-3 + 1.5 * n / 1e6
    sizes = np.array([0, 1e3, 1e5, 1e6])
    times = 6 * 2e-3 + 1.5 * sizes / 1e6
    fit = cost.fit_link(sizes, times, pattern=cost.ring_pattern(4))
    assert fit.link.latency == pytest.approx(2e-3)
    assert fit.link.bandwidth == pytest.approx(1e6)
    np.testing.assert_allclose(fit.relative_residuals, 0, atol=1e-9)
    # and predicts R = 8 with the same link: 14 * 2e-3 + 14/8 * 1e6 / 1e6 = 0.028 + 1.75
    assert fit.predict(1e6, cost.ring_pattern(8)) == pytest.approx(1.778)


def test_fit_weighs_relative_errors():
    # 1 ms at 1 kB, 101 ms at 10 MB, 1001 ms at 100 MB: alpha ~ 1 ms, beta 100 MB/s,
    # and a 10 % error at the small size is not swamped by the large ones.
    sizes = np.array([1e3, 1e7, 1e8])
    times = np.array([1.01e-3, 0.101, 1.001])
    fit = cost.fit_link(sizes, times)
    assert fit.link.latency == pytest.approx(1e-3, rel=0.05)
    assert fit.link.bandwidth == pytest.approx(1e8, rel=0.01)
    assert np.max(np.abs(fit.relative_residuals)) < 0.01


@pytest.mark.parametrize("call, words", [
    (lambda: cost.ring_pattern(0), "replicas must be a whole number >= 1"),
    (lambda: cost.parameter_server_pattern(2, 0), "servers must be a whole number >= 1"),
    (lambda: cost.Link(latency=-1, bandwidth=1), "latency must be seconds >= 0"),
    (lambda: cost.Link(latency=0, bandwidth=0), "bandwidth must be a positive number of bytes"),
    (lambda: cost.message_time(-5, SLOW), "nbytes must be a number of bytes >= 0"),
    (lambda: cost.step_time(1, 1, overlap=1.5), "overlap must be a share from 0"),
    (lambda: cost.step_time(-1, 1), "compute must be a number of seconds >= 0"),
    (lambda: cost.bucketed_step_time(1, 1, 10, 0, len), "buckets must be a whole number >= 1"),
    (lambda: cost.scaling_efficiency(0, 1), "one_replica_step_time must be a positive"),
    (lambda: cost.fit_link([1, 1], [1, 2]), "at least two different sizes"),
    (lambda: cost.fit_link([1, 2, 3], [3, 2, 1]), "do not grow with the size"),
    (lambda: cost.fit_link([1, 2], [1, 2, 3]), "one entry each"),
    (lambda: cost.fit_link([1, 2], [1, 2], pattern=cost.ring_pattern(1)), "sends nothing"),
])
def test_bad_arguments_say_what_to_pass(call, words):
    with pytest.raises(ValueError, match=words) as caught:
        call()
    assert not isinstance(caught.value, TypeError)


@pytest.mark.parametrize("call, words", [
    (lambda: cost.ring_pattern(2.5), "replicas must be a whole number"),
    (lambda: cost.tree_pattern(True), "replicas must be a whole number"),
    (lambda: cost.Link(latency="5us", bandwidth=1), "latency must be seconds >= 0"),
    (lambda: cost.Link(latency=0, bandwidth="fast"), "bandwidth must be a positive number"),
    (lambda: cost.message_time("5 MB", SLOW), "nbytes must be a number of bytes >= 0"),
    (lambda: cost.step_time(True, 1), "compute must be a number of seconds >= 0"),
    (lambda: cost.bucketed_step_time(1, 1, 10, 2, 3.0), "all_reduce_time must be a function"),
])
def test_a_wrong_type_is_a_type_error_only(call, words):
    with pytest.raises(TypeError, match=words) as caught:
        call()
    assert not isinstance(caught.value, ValueError)


def test_docstrings_name_the_chapter():
    for name in ["Link", "Pattern", "ring_pattern", "tree_pattern", "parameter_server_pattern",
                 "message_time", "ring_all_reduce_time", "tree_all_reduce_time",
                 "hierarchical_all_reduce_time", "parameter_server_time", "step_time",
                 "bucketed_step_time", "scaling_efficiency", "fit_link", "LinkFit"]:
        assert 'chapter "What communication costs"' in " ".join(getattr(cost, name).__doc__.split())
    assert math.isfinite(cost.ring_all_reduce_time(1, 2, SLOW))


def test_smallest_batch_without_overlap_makes_compute_e_over_1_minus_e_times_communication():
    # 90 % needs compute >= 0.9 / 0.1 = 9 times the communication: 9 * 0.01 s = 0.09 s,
    # at 0.8 ms an example that is 112.5, so 113 examples; 112 give 0.0896 / 0.0996 = 89.96 %.
    assert cost.smallest_batch_for_efficiency(0.8e-3, 0.01, 0.9) == 113
    assert cost.scaling_efficiency(0.0896, cost.step_time(0.0896, 0.01)) < 0.9
    # 50 %: compute >= communication = 0.01 s: 12.5, so 13 examples
    assert cost.smallest_batch_for_efficiency(0.8e-3, 0.01, 0.5) == 13


def test_smallest_batch_with_overlap():
    # All hidden: the step is max(compute, communication); 90 % needs compute >= 0.9 * 0.01 s:
    # 11.25, so 12 examples
    assert cost.smallest_batch_for_efficiency(0.8e-3, 0.01, 0.9, overlap=1) == 12
    # Half hidden, 90 % > 0.5: compute >= 0.9 * 0.5 * 0.01 / 0.1 = 0.045 s: 56.25, so 57
    assert cost.smallest_batch_for_efficiency(0.8e-3, 0.01, 0.9, overlap=0.5) == 57
    # Half hidden, 45 % <= 0.5: the step is the communication, compute >= 0.45 * 0.01 s:
    # 5.625, so 6
    assert cost.smallest_batch_for_efficiency(0.8e-3, 0.01, 0.45, overlap=0.5) == 6


def test_smallest_batch_is_the_first_that_reaches_the_efficiency():
    link = cost.Link(latency=5e-6, bandwidth=25e9)
    communication = cost.ring_all_reduce_time(25.6e6 * 4, 64, link)
    for overlap in (0.0, 0.3, 1.0):
        for target in (0.5, 0.8, 0.95, 0.99):
            batch = cost.smallest_batch_for_efficiency(4.87e-4, communication, target, overlap)

            def efficiency(examples):
                seconds = examples * 4.87e-4
                return cost.scaling_efficiency(seconds, cost.step_time(seconds, communication, overlap))

            assert efficiency(batch) >= target
            assert batch == 1 or efficiency(batch - 1) < target
    assert cost.smallest_batch_for_efficiency(1.0, 0.0, 0.99) == 1  # nothing to send
    assert 'chapter "What communication costs"' in " ".join(
        cost.smallest_batch_for_efficiency.__doc__.split())


@pytest.mark.parametrize("call, words", [
    (lambda: cost.smallest_batch_for_efficiency(0, 1, 0.9), "seconds_per_example must be a positive"),
    (lambda: cost.smallest_batch_for_efficiency(1, -1, 0.9), "communication must be a number"),
    (lambda: cost.smallest_batch_for_efficiency(1, [1, 2], 0.9), "one number of seconds"),
    (lambda: cost.smallest_batch_for_efficiency(1, 1, 1.0), "strictly between 0 and 1"),
    (lambda: cost.smallest_batch_for_efficiency(1, 1, 90), "0.9 for 90%"),
    (lambda: cost.smallest_batch_for_efficiency(1, 1, 0.9, overlap=2), "overlap must be a share"),
])
def test_smallest_batch_says_what_to_pass(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_reduce_scatter_plus_all_gather_is_the_ring_all_reduce_exactly():
    link = cost.Link(latency=3.7e-6, bandwidth=12.5e9)
    for replicas in (1, 2, 3, 4, 7, 8, 64):
        for nbytes in (0, 1, 4 * 12345, 7.5e9 * 2):
            halves = (cost.reduce_scatter_time(nbytes, replicas, link)
                      + cost.all_gather_time(nbytes, replicas, link))
            assert halves == cost.ring_all_reduce_time(nbytes, replicas, link)
    # (R - 1) latencies and (R - 1) / R of the bytes each.
    assert cost.reduce_scatter_time(4e6, 4, SLOW) == pytest.approx(3 * 1e-3 + 3.0)
    assert cost.all_gather_time(4e6, 1, SLOW) == 0
    with pytest.raises(TypeError):
        cost.reduce_scatter_time(1e6, 2.0, SLOW)
