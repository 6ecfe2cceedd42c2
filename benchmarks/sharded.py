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

The last line: ``RESULT stage1_vs_sync=... stage2_vs_sync=... stage3_vs_sync=...``
(targets on two CPU cores: stages 1 and 2 <= 1.3, stage 3 <= 1.6).
"""

import argparse
import time

import pargrad  # first: it imports TensorFlow quietly

import keras
import numpy as np

from _common import (PER_REPLICA, data, describe_machine,
                     perceptron, result_line, timed, verdict)
from pargrad.strategies import sync_strategy

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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100, help="steps a call (one graph loop)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    devices = pargrad.logical_devices(args.replicas)
    strategy = sync_strategy(args.replicas)
    x, y = data()
    batch = PER_REPLICA * args.replicas
    print(describe_machine(devices))
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
    for stage, target in ((1, 1.3), (2, 1.3), (3, 1.6)):
        per_round = np.array(every[stage]) / np.array(every[0])
        ratios[f"stage{stage}_vs_sync"] = float(np.median(per_round))
        print(f"  stage {stage} / SyncTrainer, median of the rounds' ratios = "
              f"{ratios[f'stage{stage}_vs_sync']:.3f}x ({verdict(ratios[f'stage{stage}_vs_sync'], target, False)})")
    cpu_ratios = " ".join(f"stage {stage} {np.median(cpu[stage]) / np.median(cpu[0]):.3f}x"
                          for stage in (1, 2, 3))
    print(f"  CPU time a step (all threads, the work however loaded the machine is) over "
          f"SyncTrainer's: {cpu_ratios}")
    print(result_line(**ratios))


if __name__ == "__main__":
    main()
