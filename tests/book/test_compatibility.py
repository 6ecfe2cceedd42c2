"""The compatibility matrix's bookkeeping (appendix "Compatibility matrix"); the runs are in the appendix."""

from pargrad.book import compatibility


def test_twelve_combinations_in_table_order():
    combos = compatibility.combinations()
    assert len(combos) == len(set(combos)) == 12
    assert combos[0] == ("Keras fit", "MirroredStrategy", 1)


def test_error_messages_are_shortened_to_a_stable_first_sentence():
    error = RuntimeError(
        "Exception encountered when calling Cond.call().\n\n\x1b[1m`merge_call` called while "
        "defining a new graph. This can often happen.\x1b[0m\n\nArguments received by "
        "Cond.call():\n  • args=('<function f at 0x7faee66e5120>')")
    assert compatibility.short_message(error) == "`merge_call` called while defining a new graph."
    error = ValueError("Attempt to convert a value (PerReplica:{\n  0: 1,\n  1: 2\n}) with an "
                       "unsupported type (<class 'a.PerReplica'>) to a Tensor.")
    assert compatibility.short_message(error) == (
        "Attempt to convert a value (PerReplica{...}) with an unsupported type (a.PerReplica) "
        "to a Tensor.")


def test_the_table_has_a_row_a_strategy_and_a_column_an_api_and_accumulation():
    rows = [dict(api=api, strategy=strategy, accumulation=k, status="hangs",
                 detail="time limit 20 s | x")
            for api, strategy, k in compatibility.combinations()]
    table = compatibility.format_matrix(rows).splitlines()
    assert len(table) == 2 + len(compatibility.STRATEGIES)
    assert table[0].count("|") == 6
    assert table[2].startswith("| MirroredStrategy | **hangs**: time limit 20 s / x |")
