"""Step time of pargrad.ShardedTrainer (ZeRO stages 1-3) against SyncTrainer at the same batch.

    .venv/bin/python benchmarks/sharded.py [--replicas 2] [--steps 100] [--rounds 7]

One model (the 64-256-256-1 perceptron of ``benchmarks/sync.py``, 82,945
float32 parameters), Adam, one ``MirroredStrategy`` over ``--replicas``
logical devices with 256 examples a replica.  Every contender runs its
steps as one graph loop (``steps_per_call`` = ``--steps``), is traced
first, then timed in interleaved rounds (SyncTrainer, stage 1, 2, 3, again)
so that a busy moment of a shared machine hits all of them; each ratio is
the median over rounds of the contender's step time over SyncTrainer's in
the same round.  A round is one ``fit`` call of ``--steps`` steps, its fixed
cost (a few milliseconds, the same for every contender) included: on a
loaded machine the difference of two calls that ``benchmarks/sync.py``
uses went negative.

Then the peaks (``--no-peaks`` leaves them out): the book's
``pargrad.book.peaks.stage_peaks`` trains a model of 50 million float32
parameters in 8 layers on four logical devices for two steps at stage 0
(SyncTrainer) and stage 3, each in a fresh process, and reads how far the
peak rose above the idle process (on a CPU the resident set, the sum over
the four devices; on a GPU the logical GPUs' peaks, added);
``peak_stage3_vs_formula`` is stage 3's measured peak over
``pargrad.book.peaks.predicted_peak_bytes`` (MB are 2**20 bytes).

The last line: ``RESULT stage1_vs_sync=... stage2_vs_sync=... stage3_vs_sync=...
peak_stage0_mb=... peak_stage3_mb=... peak_stage3_vs_formula=... load=...``
(targets: stages 1 and 2 <= 1.15, stage 3 <= 1.5; ``load`` is the
one-minute load average when the timing ended).
"""

import os
import time

import pargrad  # first: it imports TensorFlow quietly

import keras
import numpy as np

from _common import (mirrored_perceptron_data, perceptron, replica_parser, result_line, timed,
                     verdict)
from pargrad.book.peaks import predicted_peak_bytes, stage_peaks

def runner(strategy, x, y, batch, stage, steps):
    """``run()``: seconds a step of one fit call of ``steps`` steps in one graph loop."""
    with strategy.scope():
        model = perceptron()
        optimizer = keras.optimizers.Adam(1e-3)
    if stage == 0:
        trainer = pargrad.SyncTrainer(model, strategy, optimizer=optimizer, progress=False)
    else:
        trainer = pargrad.ShardedTrainer(model, strategy, stage=stage, optimizer=optimizer,
                                         progress=False)

    def fit(n):
        trainer.fit(x, y, steps=n, batch_size=batch, steps_per_call=steps)

    fit(steps)            # traced here, not in a timed round
    fit(2 * steps)

    def run():
        return timed(fit, steps) / steps
    return run


def main():
    parser = replica_parser(__doc__, rounds=7)
    parser.add_argument("--no-peaks", action="store_true", help="time only, measure no peak")
    args = parser.parse_args()

    devices, strategy, x, y, batch = mirrored_perceptron_data(args.replicas)
    print(f"MirroredStrategy over {strategy.extended.worker_devices}; global batch {batch}; "
          f"Adam; {args.steps} steps a call; {args.rounds} interleaved rounds")
    names = {0: "SyncTrainer", 1: "stage 1", 2: "stage 2", 3: "stage 3"}
    runs = {stage: runner(strategy, x, y, batch, stage, args.steps) for stage in names}
    every = {stage: [] for stage in names}
    cpu = {stage: [] for stage in names}
    for _ in range(args.rounds):
        for stage, run in runs.items():
            started = time.process_time()
            every[stage].append(run())
            cpu[stage].append((time.process_time() - started) / args.steps)
    print("  contender     median ms/step  median CPU ms/step (all threads)   all rounds")
    for stage, name in names.items():
        rounds = " ".join(f"{1e3 * s:.2f}" for s in every[stage])
        print(f"  {name:12s} {1e3 * np.median(every[stage]):10.3f}      "
              f"{1e3 * np.median(cpu[stage]):10.3f}                        {rounds}")
    ratios = {}
    for stage, target in ((1, 1.15), (2, 1.15), (3, 1.5)):
        per_round = np.array(every[stage]) / np.array(every[0])
        ratios[f"stage{stage}_vs_sync"] = float(np.median(per_round))
        print(f"  stage {stage} / SyncTrainer, median of the rounds' ratios = "
              f"{ratios[f'stage{stage}_vs_sync']:.3f}x ({verdict(ratios[f'stage{stage}_vs_sync'], target, False)})")
    cpu_ratios = " ".join(f"stage {stage} {np.median(cpu[stage]) / np.median(cpu[0]):.3f}x"
                          for stage in (1, 2, 3))
    print(f"  CPU time a step (all threads, the work however loaded the machine is) over "
          f"SyncTrainer's: {cpu_ratios}")
    ratios["load"] = os.getloadavg()[0]
    if not args.no_peaks:
        ratios.update(peaks())
    print(result_line(**ratios))


def peaks():
    """The RESULT line's peak keys: stages 0 and 3 measured, stage 3 against its prediction."""
    rows = {row["stage"]: row for row in stage_peaks((0, 3))}
    for stage, row in rows.items():
        predicted = predicted_peak_bytes(row)["total"] / 2**20
        print(f"  peak at stage {stage} ({row['device']}, above the idle process): "
              f"{row['peak_mb']:.0f} MB measured, {predicted:.0f} MB predicted")
    return {"peak_stage0_mb": rows[0]["peak_mb"], "peak_stage3_mb": rows[3]["peak_mb"],
            "peak_stage3_vs_formula": rows[3]["peak_mb"] * 2**20
            / predicted_peak_bytes(rows[3])["total"]}


if __name__ == "__main__":
    main()
