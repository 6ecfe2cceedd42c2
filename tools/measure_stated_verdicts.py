"""The registry of the book's stated verdicts, with their p-values and Holm's correction.

Writes pargrad/book/data/stated_verdicts.json: every verdict that "Sync vs async in the same
time", "The race in depth", "Communicating rarely" and its deep dive, "Asynchronous training"
and "Stale gradients in depth" state on tuned methods, recomputed from their stored runs (the
race files; for the others, the runs tuned on pools of 40 seeds that
tools/measure_tuned_rare_communication.py and tools/measure_tuned_stale_gradients.py store),
its pooled p-value, and the
p-value Holm's step-down correction over all of them gives (experiments.holm).  The pages
read it through experiments.corrected; tests/claims/test_stated_verdicts_conclusions.py
checks it against the runs.  Takes about five minutes on one core:

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python tools/measure_stated_verdicts.py
"""

import json
import pathlib

from pargrad.book import experiments, parabola_async, race, tuning
from pargrad.book import rare_communication as rc

ROOT = pathlib.Path(__file__).resolve().parents[1]
RACE_PAIRS = {   # scenario -> the (first, second) pairs the race pages state, at both targets
    "equal devices": [("sequential, no staleness", "async"), ("sync", "async"),
                      ("sync", "sync, 1 backup"), ("async, staleness-aware", "async"),
                      ("async, bound 2", "async")],
    **{scenario: [("async", "sync"), ("sync, 1 backup", "sync"), ("sync, 1 backup", "async"),
                  ("async, staleness-aware", "async"), ("async, bound 2", "async")]
       for scenario in ("one device 3x slower", "heavy-tailed delays")},
}
RARE = [(set_name, first, second)   # as "Communicating rarely" and its deep dive state them
        for set_name, pairs in rc.STATED_PAIRS.items() for first, second in pairs]
STALE = {   # page -> (tuned group, the pairs it states)
    "asynchronous training": ("workers", [
        *((f"{n} async workers", "1 worker") for n in parabola_async.WORKERS),
        *((f"{n} shards in turn", "1 worker") for n in parabola_async.WORKERS),
        *((f"{n} async workers", f"{n} shards in turn") for n in parabola_async.WORKERS)]),
    "stale gradients in depth": ("remedies", [
        ("best constant rate", "rate / (staleness + 1)"), ("DC-ASGD", "best constant rate"),
        ("DC-ASGD", "rate / (staleness + 1)")]),
}


def registry():
    """Every stated verdict: its registry key -> its Replicated verdict."""
    stored = race.stored_sweep("sync_vs_async_virtual")
    held = race.stored_sweep("sync_vs_async_virtual_held_out")
    page, held_out = race.stored_results(stored), race.stored_results(held)
    found = {}
    for scenario, pairs in RACE_PAIRS.items():
        for first, second in pairs:
            for target in stored["settings"]["targets"]:
                found[experiments.statement_key("race", scenario, first, second, target)] = \
                    race.paired_verdict(page, scenario, first, second, target,
                                        held_out=held_out)
    runs = {name: rc.tuned_replication(name) for name in {k[0] for k in RARE}}
    for name, first, second in RARE:
        found[experiments.statement_key("communicating rarely", name, first, second)] = \
            runs[name].compare(first, second)
    for page, (group, pairs) in STALE.items():
        tuned = parabola_async.tuned_replication(group)
        for first, second in pairs:
            found[experiments.statement_key(page, first, second)] = tuned.compare(first, second)
    return found


THIRD_RACE = ROOT / "tests" / "claims" / "data" / "sync_vs_async_virtual_third.json"


def third_sets(keys):
    """The stated verdicts also decided on a third seed set, alone: key -> its Verdict.

    "Communicating rarely" and the stale-gradient pages have a third set for every stated
    pair (their tuning pools' "third" set); the race for the pairs its third file raced.
    """
    third_race = json.loads(THIRD_RACE.read_text())
    race_runs = race.stored_results(third_race)
    stale = parabola_async.stored_tuned()["sets"]["third"]
    found = {}
    for key in keys:
        page, *statement = key.split(" | ")
        if page == "race":
            scenario, first, second, target = statement
            held = third_race["settings"]["best_rates"].get(scenario, {})
            if first in held and second in held:
                found[key] = race.paired_verdict(race_runs, scenario, first, second,
                                                 float(target.rstrip("%")) / 100, min_seeds=1)
        elif page == "communicating rarely":
            set_name, first, second = statement
            found[key] = rc.tuned_experiment(set_name, "third").compare(first, second,
                                                                        min_seeds=1)
        else:
            group = STALE[page][0]
            found[key] = tuning.experiment(stale[group], parabola_async.TUNED_SETS["third"][0]) \
                .compare(*statement, min_seeds=1)
    return found


def leader(verdict):
    """The method a verdict's seeds lean to, "" for neither."""
    return {1: verdict.first, -1: verdict.second}.get(verdict.lean, "")


def rows(found):
    """The file's rows: key, verdict, p, Holm-adjusted p, spread, power, tuning shift and noise,
    and, where a third seed set was run, its p-value and lean."""
    keys = list(found)
    adjusted = experiments.holm([found[k].pooled.p_value for k in keys])
    third = third_sets(keys)
    return [{"key": k, "verdict": found[k].verdict, "p": found[k].pooled.p_value,
             "holm": float(q), "spread": found[k].pooled.spread, "power": found[k].pooled.power,
             "shift": found[k].pooled.shift, "tuning_sd": found[k].pooled.tuning_sd,
             **({"third": {"p": third[k].p_value, "leader": leader(third[k])}}
                if k in third else {})}
            for k, q in zip(keys, adjusted)]


def main():
    table = rows(registry())
    path = ROOT / "pargrad" / "book" / "data" / experiments.FAMILY_FILE
    path.write_text(json.dumps({"alpha": experiments.ALPHA, "verdicts": table}, indent=1) + "\n")
    for row in sorted(table, key=lambda r: r["p"]):
        third = f", third set p {row['third']['p']:.2g} leaning to {row['third']['leader']}" \
            if "third" in row else ""
        print(f"RESULT {row['key']}: {row['verdict']}, p {row['p']:.2g}, Holm {row['holm']:.2g}, "
              f"spread {row['spread']:.2f}, power {row['power']:.2f}{third}")


if __name__ == "__main__":
    main()
