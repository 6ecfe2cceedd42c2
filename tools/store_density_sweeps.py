"""Store the density check's sweeps: ``python tools/store_density_sweeps.py`` (``make outputs``).

tests/claims/test_asynchronous_density.py decides the verdicts of "Asynchronous training" and
"Stale gradients in depth" again on grids twice as dense; the float64 replays it needs (about a
minute of one core) are run here once and their per-seed losses written to
tests/claims/data/asynchronous_density.json, which the test reads (and of which it replays a
sample afresh).  Run it again when the replays, the seeds or the grids change: the test says so.
"""

import importlib.util
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEST = ROOT / "tests" / "claims" / "test_asynchronous_density.py"


def main():
    spec = importlib.util.spec_from_file_location("density", TEST)
    density = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(density)
    started = time.time()
    runs = density.record()
    density.STORED.parent.mkdir(exist_ok=True)
    density.STORED.write_text(json.dumps(
        {"script": "tools/store_density_sweeps.py", "seconds": round(time.time() - started),
         "runs": runs}, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"{sum(len(r) for r in runs.values())} runs of {len(runs)} methods in "
          f"{density.STORED.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
