"""Measure the rate sweeps of the chapter "Communicating rarely" and store them with the package.

Every method of the chapter (the dial and the uneven race on two links) is
swept over its grid of inner learning rates on the tuning seeds with the
float64 replay of pargrad.book.replay (the chapter's experiment sets are in
pargrad.book.rare_communication); the per-seed scores, the
medians and the best rate of each are written to
pargrad/book/data/rare_communication_sweeps.json.  The chapter then runs
only the test seeds, at these rates; tests/test_rare_communication.py
checks that a sweep measured now repeats the stored one.

    cd tools && ../.venv/bin/python measure_rare_communication.py
"""

import json
import pathlib
import time

from pargrad.book import rare_communication


def main():
    began = time.perf_counter()
    stored = rare_communication.measure_sweeps()
    stored["seconds"] = round(time.perf_counter() - began, 1)
    path = (pathlib.Path(__file__).resolve().parent.parent / "pargrad" / "book" / "data"
            / f"{rare_communication.STORED}.json")
    path.write_text(json.dumps(stored, indent=1) + "\n")
    for set_name, methods in stored["sets"].items():
        for name, kept in methods.items():
            print(f"RESULT {set_name} | {name}: best rate {kept['best']:g}")
    print(f"wrote {path} in {stored['seconds']} s")


if __name__ == "__main__":
    main()
