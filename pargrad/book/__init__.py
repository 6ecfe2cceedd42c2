"""The book's instruments: its tasks, harnesses, demos, figures and stored data.

The library at the top of :mod:`pargrad` (devices, strategies, sync,
asynchronous, scenario, data, loop, checks, training, accumulate, tf1,
cluster, numerics, cost, local_sgd) is what a reader takes home; this
sub-package is what the chapters use to *demonstrate* it:

* :mod:`pargrad.book.parabola`, :mod:`pargrad.book.digits` and
  :mod:`pargrad.book.sequences`: the tasks (the y = x² question's network,
  the offline digits classifier, padded sequences of unequal lengths);
* :mod:`pargrad.book.experiments`: methods x seeds, each at its own best
  swept rate, and the paired rule that turns them into a verdict;
  :mod:`pargrad.book.parabola_async`: the asynchronous runs of the y = x²
  network replayed in NumPy for many seeds at once;
  :mod:`pargrad.book.delay`: the delayed-gradient recursion and its
  stability bound; :mod:`pargrad.book.lost_updates`: threads losing
  updates to a Keras variable;
* :mod:`pargrad.book.instruments`: the synchronous trainer with per-replica
  timing, stragglers, emulated devices and backup workers around the core
  step of :class:`pargrad.sync.SyncTrainer`;
* :mod:`pargrad.book.race`: sync and async trained for the same time;
* :mod:`pargrad.book.multiworker`, :mod:`pargrad.book.parameter_server`:
  the multi-process demos; :mod:`pargrad.book.compatibility`: the matrix of
  what works where; :mod:`pargrad.book.allreduce_timing`: the measured
  all-reduce; :mod:`pargrad.book.replica_memory`: the memory that
  accumulating on every replica costs, measured;
  :mod:`pargrad.book.accumulation_memory`: the peak memory of a whole batch
  against accumulated micro-batches; :mod:`pargrad.book.graph_ops`: the ops
  a TF1 fetch runs;
* :mod:`pargrad.book.plots`: the figures; :mod:`pargrad.book.display`:
  showing the package's source in a chapter and gluing values into the
  rendered book (:func:`glue`); ``data/``: stored sweeps.

The dependency points one way: the book imports the library, the library
never imports the book (``tests/test_layout.py`` checks it).
"""

from pargrad.book.display import glue, show_lines, show_source

__all__ = ["glue", "show_lines", "show_source"]
