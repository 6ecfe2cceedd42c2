"""pargrad.scenario: how fast the devices are, one step's time, and the virtual clock."""

import numpy as np
import pytest

from pargrad.scenario import (
    SCHEDULE_KEYS, Scenario, check_scenario, random_delay, virtual_clock, virtual_schedule,
)

# -- Scenario: one value for device speed ---------------------------------------------


@pytest.mark.parametrize("arguments, error", [
    (dict(speeds=()), TypeError), (dict(speeds="fast"), TypeError),
    (dict(speeds=(1.0, -1.0)), ValueError), (dict(speeds=(1.0,), jitter=-0.5), ValueError),
    (dict(speeds=(1.0,), delay_distribution="normal"), ValueError),
])
def test_a_bad_scenario_is_refused_when_it_is_made(arguments, error):
    with pytest.raises(error, match="speeds|jitter|delay_distribution"):
        Scenario(**arguments)


def test_a_scenario_is_one_value():
    assert Scenario([1, 0.5]) == Scenario((1.0, 0.5)) and Scenario((1.0,) * 2) == Scenario.equal(2)
    assert Scenario((1.0,), jitter=0).jitter == 0


def test_check_scenario_wants_a_scenario_with_one_speed_a_device():
    scenario = Scenario((1.0, 0.5))
    assert check_scenario(scenario, 2) is scenario and check_scenario(scenario) is scenario
    with pytest.raises(TypeError, match="pargrad.Scenario.*Scenario\\(speeds="):
        check_scenario((1.0, 0.5), 2)
    with pytest.raises(ValueError, match="one positive number per device \\(3\\)"):
        check_scenario(scenario, 3)


def test_check_scenario_is_the_one_check_of_devices_speeds_jitter_included():
    """None means equal devices; a clock without delays refuses jitter, saying why."""
    assert check_scenario(None, 3) == Scenario.equal(3)
    with pytest.raises(TypeError, match="scenario must be a pargrad.Scenario, got None"):
        check_scenario(None)                      # no count of devices: no default
    jittery = Scenario((1.0, 0.5), jitter=0.2)
    assert check_scenario(jittery, 2) is jittery
    with pytest.raises(ValueError, match=r"^scenario.jitter must be 0 here, got 0.2 \(a round "
                                         r"has none\); pass Scenario\(speeds\) without jitter"):
        check_scenario(jittery, 2, jitter=False, advice="a round has none")


def test_a_step_takes_one_plus_the_delay_over_the_speed():
    scenario = Scenario((1.0, 0.25), jitter=0.5)
    rng, same = np.random.default_rng(4), np.random.default_rng(4)
    assert scenario.step_time(rng, 1) == (1.0 + random_delay(same, 0.5)) / 0.25
    assert Scenario((1.0, 0.25)).step_time(rng, 1) == 4.0


def test_step_times_draw_step_by_step_device_by_device():
    scenario = Scenario((1.0, 0.5, 2.0), jitter=0.5, delay_distribution="pareto")
    times = scenario.step_times(50, np.random.default_rng(1))
    rng = np.random.default_rng(1)
    by_hand = [[scenario.step_time(rng, device) for device in range(3)] for _ in range(50)]
    np.testing.assert_array_equal(times, by_hand)
    assert times.shape == (50, 3) and scenario.step_times(0, rng).shape == (0, 3)
    np.testing.assert_array_equal(Scenario((1.0, 1 / 3)).step_times(2, rng), [[1, 3], [1, 3]])
    with pytest.raises(TypeError, match="steps must be a whole number"):
        scenario.step_times(2.0, rng)


def test_random_delays_have_the_requested_mean_and_pareto_has_the_heavy_tail():
    rng = np.random.default_rng(0)
    exponential = np.array([random_delay(rng, 0.5, "exponential") for _ in range(40000)])
    pareto = np.array([random_delay(rng, 0.5, "pareto") for _ in range(40000)])
    assert random_delay(rng, 0.0, "pareto") == 0.0
    assert abs(exponential.mean() - 0.5) < 0.02
    # Lomax(1.5) scaled to mean 0.5: median 0.5 * 0.5 * (2 ** (1 / 1.5) - 1).
    assert abs(np.median(pareto) - 0.25 * (2 ** (1 / 1.5) - 1)) < 0.01
    # Ten times the mean: about 1 in 100 for Pareto, 1 in 20000 for exponential.
    assert (pareto > 5.0).mean() > 0.005 > 20 * (exponential > 5.0).mean()
    with pytest.raises(ValueError, match="distribution must be one of 'exponential', 'pareto'"):
        random_delay(rng, 0.5, "normal")


# -- the virtual clock -----------------------------------------------------------------


def test_equal_workers_read_tau_updates_back():
    schedule = virtual_schedule(Scenario.equal(4), 40)
    t = np.arange(40)
    np.testing.assert_array_equal(schedule["worker"], t % 4)
    np.testing.assert_array_equal(schedule["read_version"], np.where(t < 4, 0, t - 3))
    np.testing.assert_array_equal(schedule["applied_version"], t)
    np.testing.assert_array_equal(schedule["staleness"], np.where(t < 4, t, 3))
    np.testing.assert_array_equal(schedule["time"], t // 4 + 1.0)
    np.testing.assert_array_equal(schedule["read_time"], t // 4)
    assert tuple(schedule) == SCHEDULE_KEYS


def test_the_clock_reads_then_applies_the_earliest_lower_worker_first_on_a_tie():
    events = virtual_clock(Scenario((0.5, 1.0)))
    first = [next(events) for _ in range(8)]
    # Both read at 0; worker 1 (speed 1) is ready at 1, worker 0 (speed 0.5) at 2:
    # at time 2 both are ready, and the lower worker goes first.
    assert first == [("read", 0, 0.0), ("read", 1, 0.0), ("apply", 1, 1.0), ("read", 1, 1.0),
                     ("apply", 0, 2.0), ("read", 0, 2.0), ("apply", 1, 2.0), ("read", 1, 2.0)]


def test_may_start_holds_a_worker_back_until_an_apply_lets_it_read():
    applied = [0, 0]

    def may_start(worker):  # worker 1 waits until worker 0 has applied twice
        return worker == 0 or applied[0] >= 2

    events = []
    for event in virtual_clock(Scenario((1.0, 1.0)), may_start=may_start):
        events.append(event)
        if event[0] == "apply":
            applied[event[1]] += 1
        if len(events) == 9:
            break
    assert events == [("read", 0, 0.0), ("read", 1, 0.0), ("apply", 0, 1.0), ("read", 0, 1.0),
                      ("apply", 1, 1.0), ("apply", 0, 2.0), ("read", 0, 2.0), ("read", 1, 2.0),
                      ("apply", 0, 3.0)]


def test_a_schedule_depends_on_the_seed_only_through_the_delays():
    jittered = Scenario((1.0, 0.5, 0.8), jitter=0.5, delay_distribution="pareto")
    first, again = virtual_schedule(jittered, 200, seed=3), virtual_schedule(jittered, 200, seed=3)
    for key in SCHEDULE_KEYS:
        np.testing.assert_array_equal(first[key], again[key])
    assert not np.array_equal(first["time"], virtual_schedule(jittered, 200, seed=4)["time"])
    steady = Scenario((1.0, 0.5, 0.8))
    np.testing.assert_array_equal(virtual_schedule(steady, 50, seed=3)["time"],
                                  virtual_schedule(steady, 50, seed=4)["time"])
    assert np.all(np.diff(first["time"]) >= 0)
    np.testing.assert_array_equal(first["staleness"],
                                  first["applied_version"] - first["read_version"])


@pytest.mark.parametrize("scenario, steps, error, message", [
    ((1.0, 1.0), 10, TypeError, "pargrad.Scenario"),
    (Scenario((1.0,)), 0, ValueError, "steps must be a whole number >= 1"),
    (Scenario((1.0,)), 2.0, TypeError, "pass 2"),
])
def test_a_bad_schedule_request_says_what_to_pass(scenario, steps, error, message):
    with pytest.raises(error, match=message):
        virtual_schedule(scenario, steps)
