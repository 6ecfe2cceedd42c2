"""pargrad.book.race: sync and async on the same virtual clock, evaluated against time."""

import dataclasses

import numpy as np
import pytest

from pargrad.book import experiments, race
from pargrad.book.instruments import sync_step_times


@pytest.fixture(scope="module")
def data():
    return race.digits_data(seed=0)


def test_replica_times_follow_the_scenario():
    slow = race.replica_times(5, race.SCENARIOS["one device 3x slower"], seed=0)
    np.testing.assert_allclose(slow, np.tile([1, 1, 1, 3], (5, 1)))
    heavy = race.replica_times(2000, race.SCENARIOS["heavy-tailed delays"], seed=0)
    assert heavy.min() >= 1.0 and heavy.max() > 10  # a heavy tail: some steps take 10x
    np.testing.assert_array_equal(heavy, race.replica_times(2000, race.SCENARIOS["heavy-tailed delays"],
                                                            seed=0))


def test_a_synchronous_step_costs_the_slowest_replica_on_the_virtual_clock(devices, data):
    result = race.race("sync", "one device 3x slower", seed=0, budget=20, every=5, data=data,
                       devices=devices)
    # Every step waits for the 3x slower device: 3 time units a step, 6 steps in
    # 20; a checkpoint is taken at the first step ending at or after 5, 10, 15.
    assert result["updates"].tolist() == [0, 2, 4, 5, 6]
    np.testing.assert_allclose(result["time"], [0, 6, 12, 15, 18])
    assert result["examples"][-1] == 6 * 4 * race.BATCH_SIZE
    backup = race.race("sync, 1 backup", "one device 3x slower", seed=0, budget=20, every=5,
                       data=data, devices=devices)
    # With one backup worker the slow device's gradient is dropped: 1 unit a step.
    assert backup["updates"][-1] == 20 and backup["time"][-1] == 20
    assert backup["examples"][-1] == 20 * 3 * race.BATCH_SIZE


def test_heavy_tailed_sync_time_is_the_sum_of_the_step_maxima(devices, data):
    scenario = race.SCENARIOS["heavy-tailed delays"]
    result = race.race("sync", scenario, seed=1, budget=15, every=1, data=data, devices=devices)
    ends = np.cumsum(sync_step_times(race.replica_times(200, scenario, seed=1), 0))
    steps = result["updates"][1:]
    np.testing.assert_allclose(result["time"][1:], ends[steps - 1])
    assert ends[steps[-1] - 1] <= 15 < ends[steps[-1]]


@pytest.mark.claim
def test_async_races_repeat_exactly_and_stop_at_the_budget(devices, data):
    first = race.race("async", "heavy-tailed delays", seed=2, budget=12, every=3, data=data,
                      devices=devices)
    again = race.race("async", "heavy-tailed delays", seed=2, budget=12, every=3, data=data,
                      devices=devices)
    # The schedule repeats exactly; accuracy and loss exactly on a CPU, and up
    # to float32 rounding on a GPU, whose kernels may add in another order.
    for key in ("time", "updates"):
        np.testing.assert_array_equal(first[key], again[key])
    for key in ("accuracy", "loss"):
        np.testing.assert_allclose(first[key], again[key], rtol=1e-5, atol=1e-6)
    assert first["time"][-1] <= 12
    equal = race.race("async", "equal devices", seed=0, budget=10, every=5, data=data,
                      devices=devices)
    assert equal["updates"][-1] == 40  # four devices, one update each per time unit


def test_time_to_target_table_takes_the_first_checkpoint_at_the_target():
    results = [
        {"scenario": "s", "method": "m", "time": np.array([0.0, 1, 2, 3]),
         "accuracy": np.array([0.1, 0.5, 0.96, 0.97])},
        {"scenario": "s", "method": "m", "time": np.array([0.0, 1, 2, 3]),
         "accuracy": np.array([0.1, 0.95, 0.9, 0.97])},
        {"scenario": "s", "method": "m", "time": np.array([0.0, 1, 2, 3]),
         "accuracy": np.array([0.1, 0.2, 0.3, 0.4])},
    ]
    (row,) = race.time_to_target_table(results, target=0.95)
    assert row["times"].tolist() == [2.0, 1.0, float("inf")]
    assert row["median"] == 2.0 and row["reached"] == 2 and row["seeds"] == 3
    assert "never" in race.format_table([row])


def test_the_zero_staleness_control_is_one_device_as_fast_as_all(devices, data):
    control = race.race("sequential, no staleness", "equal devices", seed=0, budget=10, every=5,
                        data=data, devices=devices)
    # One worker at four times the speed: as many updates as four async workers.
    assert control["updates"][-1] == 40
    trainer = next(t for k, t in race._TRAINERS.items()
                   if k[0] == "async" and len(k[1]) == 1 and ("learning_rate", 0.2) in k[3])
    assert (trainer.history.staleness == 0).all()


def result(scenario, method, seed, reached_at):
    """A race result whose accuracy reaches 0.95 at checkpoint time ``reached_at`` (inf: never)."""
    times = np.arange(0.0, 10.5, 0.5)
    accuracy = np.where(times >= reached_at, 0.96, 0.5)
    return {"scenario": scenario, "method": method, "seed": seed, "time": times,
            "accuracy": accuracy}


def test_paired_verdict_follows_the_books_rule():
    # c: a's time half a unit later on even seeds, earlier on odd ones: a small, symmetric
    # spread the rule has the power to see a fifth in, so "no difference shown"
    results = ([result("s", "a", seed, 5.0 + seed % 3) for seed in range(50)]
               + [result("s", "b", seed, 6.5 + seed % 3) for seed in range(50)]
               + [result("s", "c", seed, 5.0 + seed % 3 + (0.5 if seed % 2 else -0.5))
                  for seed in range(50)]
               + [result("s", "d", seed, 1.0 + (seed + 1) % 3) for seed in range(50)]
               + [result("s", "e", seed, 1.0 + seed % 3) for seed in range(50)])
    assert race.paired_verdict(results, "s", "a", "b").verdict == "a ahead"
    assert race.paired_verdict(results, "s", "b", "a").verdict == "a ahead"
    assert race.paired_verdict(results, "s", "a", "c").verdict == "no difference shown"
    # the same times in another order: too spread for the rule to see a fifth, so undecided
    assert race.paired_verdict(results, "s", "e", "d").verdict.startswith(
        ("too few seeds to tell", "close call"))
    # closer than the resolution: a tie
    assert race.paired_verdict(results, "s", "a", "b", resolution=1.5).verdict == \
        "no difference shown"
    with pytest.raises(ValueError, match="at least 50"):
        race.paired_verdict(results[:20] + results[50:70], "s", "a", "b")


def test_the_results_table_compares_each_method_with_the_reference_by_scenario():
    seeds = range(50)
    results = ([result("s", "ref", seed, 2.0 + seed % 3) for seed in seeds]
               + [result("s", "fast", seed, 1.0 + seed % 3) for seed in seeds]
               + [result("s", "same", seed, 2.0 + seed % 3 + (0.5 if seed % 2 else -0.5))
                  for seed in seeds]
               + [result("t", "ref", seed, 1.0 + seed % 3) for seed in seeds]
               + [result("t", "fast", seed, 3.0 + seed % 3) for seed in seeds])
    table = race.race_results_table(results, "ref", {"s": ["fast", "same"], "t": ["fast"]},
                                    target=0.9)
    rows = {(row[0], row[1]): row for row in table.rows}
    assert table.columns[0] == "scenario" and "90%" in table.columns[2]
    assert rows["s", "ref"][-1] == "reference"
    assert rows["s", "fast"][-1] == "fast ahead" and rows["s", "fast"][4] == "50 of 50"
    assert rows["s", "same"][-1] == "no difference shown"
    assert rows["t", "fast"][-1] == "ref ahead" and rows["t", "fast"][4] == "0 of 50"
    assert "| s | fast |" in table.to_markdown()


def test_a_verdict_on_held_out_races_pools_both_seed_sets_which_must_lean_alike():
    def races(fast_at, seeds):
        return ([result("s", "ref", seed, 2.0 + seed % 3) for seed in seeds]
                + [result("s", "fast", seed, fast_at + seed % 3) for seed in seeds])

    page, again, reversed_ = races(1.0, range(30)), races(1.5, range(1000, 1030)), \
        races(3.0, range(1000, 1030))
    both = race.paired_verdict(page, "s", "fast", "ref", held_out=again)
    assert both.verdict == "fast ahead"
    assert (both.page.wins, both.held_out.wins, both.pooled.wins) == (30, 30, 60)
    # 30 seeds a set are too few alone, enough pooled
    with pytest.raises(ValueError, match="at least 50"):
        race.paired_verdict(page, "s", "fast", "ref")
    assert race.paired_verdict(page, "s", "fast", "ref", held_out=reversed_).verdict == \
        "no difference shown"
    table = race.race_results_table(page, "ref", {"s": ["fast"]}, target=0.9, held_out=reversed_)
    row = table.rows[1]
    # one ratio and one count of wins, over both sets pooled
    assert row[1] == "fast" and row[4] == "30 of 60" and row[-1] == "no difference shown"
    assert row[3] == "1"   # the median of (1+k)/(2+k) and (3+k)/(2+k) over 60 seeds, k = 0, 1, 2


def test_wall_clock_claims_can_fail():
    def races(async_at, backup_at, sync_at):
        return [result("one device 3x slower", method, seed, at)
                for method, at in (("async", async_at), ("sync, 1 backup", backup_at),
                                   ("sync", sync_at)) for seed in range(6)]

    good = race.wall_clock_claims(races(2.0, 2.5, float("inf")), 0.95, resolution=0.2)
    assert len(good) == 2
    assert [v.verdict for v in good.values()] == ["async ahead", "sync, 1 backup ahead"]
    assert all((v.wins, v.seeds) == (6, 6) and v.p_value == 2 / 64 for v in good.values())
    bad = race.wall_clock_claims(races(2.0, 4.0, 3.0), 0.95, resolution=0.2)
    assert [v.verdict for v in bad.values()] == ["async ahead", "sync ahead"]


def test_race_arguments_say_what_to_pass(devices, data):
    with pytest.raises(ValueError, match="mode must be one of 'scheduled', 'free-running'"):
        race.race("sync", "equal devices", mode="wall", data=data, devices=devices)
    with pytest.raises(ValueError, match="budget must be a positive number, got 0"):
        race.race("sync", "equal devices", budget=0, data=data, devices=devices)
    with pytest.raises(TypeError, match="scenario must be a pargrad.Scenario"):
        race.race("sync", (1.0, 1.0), data=data, devices=devices)
    with pytest.raises(ValueError, match="name must be one of 'sync_vs_async'"):
        race.stored_sweep("sync")


def test_a_stored_sweep_method_reads_the_file_s_times():
    stored = {"settings": {"targets": [0.9, 0.93], "sweep_target": 0.93, "every": 1.0},
              "sweep": [{"scenario": "s", "method": "async", "learning_rate": rate, "seed": seed,
                         "time_to_target": [low, high]}
                        for rate, seed, low, high in [(0.1, 7, 3.0, 5.0), (0.2, 7, 2.0, None),
                                                      (0.1, 8, 4.0, 6.0), (0.2, 8, 1.0, 9.0),
                                                      (0.4, 7, 5.0, 8.0), (0.4, 8, 5.0, 8.0)]],
              "dense_sweep": [{"scenario": "s", "method": "async", "learning_rate": 0.141421,
                               "seed": seed, "time_to_target": [1.0, 2.0]} for seed in (7, 8)]}
    method = race.stored_sweep_method(stored, "s", "async")
    assert method.settings() == [0.1, 0.2, 0.4]                # the grid, not the midpoints
    assert method.step is None and method.resolution == 1.0     # ties within a checkpoint
    assert method.run(0.2, [7, 8]) == [np.inf, 9.0]            # never reached: inf
    assert race.stored_sweep_method(stored, "s", "async", 0.9).run(0.2, [7, 8]) == [2.0, 1.0]
    # a midpoint is found at float32 precision, as experiments.denser computes it
    assert method.run(float(np.float32(np.sqrt(0.02))), [7]) == [2.0]
    with pytest.raises(ValueError, match="no sweep run of 'async' in 's' at rate 0.3"):
        method.run(0.3, [7])
    with pytest.raises(ValueError, match="no sweep of 'sync' in 's'"):
        race.stored_sweep_method(stored, "s", "sync")
    with pytest.raises(ValueError, match="target must be one of the file's targets"):
        race.stored_sweep_method(stored, "s", "async", 0.95)


def test_medians_one_checkpoint_apart_tie_in_a_stored_sweep():
    # medians 5, 5.5 and 9 (one checkpoint interval 1.0): 0.1 and 0.2 tie, the lower mean wins
    stored = {"settings": {"targets": [0.93], "sweep_target": 0.93, "every": 1.0},
              "sweep": [{"scenario": "s", "method": "m", "learning_rate": rate, "seed": seed,
                         "time_to_target": [t]}
                        for rate, times in ((0.05, (9, 9)), (0.1, (5, 5)), (0.2, (5, 6)),
                                            (0.4, (9, 9)))
                        for seed, t in zip((1, 2), times)]}
    swept = experiments.sweep(race.stored_sweep_method(stored, "s", "m"), [1, 2])
    assert swept.plateau == (0.1, 0.2) and swept.best == 0.1
    exact = experiments.sweep(dataclasses.replace(race.stored_sweep_method(stored, "s", "m"),
                                                  resolution=0), [1, 2])
    assert exact.plateau == (0.1,)


def test_stored_results_hold_the_curves_as_arrays():
    results = race.stored_results(race.stored_sweep("sync_vs_async_virtual"))
    assert {type(results[0][k]) for k in ("time", "accuracy", "loss")} == {np.ndarray}
    assert results[0]["accuracy"].dtype == np.float64 and results[0]["seed"] == 0


def test_the_estimated_tuning_noise_is_how_far_the_draws_move_the_pair():
    # ten tuning seeds; "moving": 0.2 best on seeds 0-5 (time 4), 0.1 best on seeds 6-9 (time 4)
    # and 6 at the other rate, so a draw of mostly late seeds picks 0.1 and moves the method;
    # "still": the same best rate on every seed, so no draw moves it
    times = {"moving": {0.1: [6.0] * 6 + [4.0] * 4, 0.2: [4.0] * 6 + [6.0] * 4,
                        0.4: [9.0] * 10},
             "still": {0.1: [9.0] * 10, 0.2: [5.0] * 10, 0.4: [9.0] * 10}}
    stored = {"settings": {"targets": [0.93], "sweep_target": 0.93, "every": 1.0,
                           "tuning_seeds": list(range(10))},
              "sweep": [{"scenario": "s", "method": name, "learning_rate": rate, "seed": seed,
                         "time_to_target": [t]}
                        for name, rates in times.items() for rate, column in rates.items()
                        for seed, t in enumerate(column)]}
    assert race.estimated_tuning_sd(stored, "s", "still", "still") == 0.0
    moved = race.estimated_tuning_sd(stored, "s", "moving", "still")
    assert moved > 0
    # each draw moves "moving" by 0 (it keeps 0.2) or by the median log-ratio of 0.1 to 0.2
    shift = np.median(np.log(np.array(times["moving"][0.1]) / times["moving"][0.2]))
    assert moved <= abs(shift)
    assert race.estimated_tuning_sd(stored, "s", "still", "moving") == pytest.approx(moved)
