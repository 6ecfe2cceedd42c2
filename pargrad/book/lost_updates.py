"""Lost updates: several threads adding to one variable, counted.

Taught in the chapters "Asynchronous training" and "Stale gradients in
depth", which show why the shared parameters of :class:`pargrad.AsyncTrainer`
are native ``tf.Variable`` objects updated under a lock: a Keras
variable's ``assign_add`` is a read, an add and a write, and two threads
can tear them apart.
"""

import threading

from pargrad.checks import check_whole_number


def lost_updates(variable, threads=2, increments=2000):
    """Add 1 to ``variable`` from several threads at once; return how many adds were lost.

    Each thread calls ``variable.assign_add(1.0)`` ``increments`` times.  A
    native ``tf.Variable`` adds in one kernel and loses none; a Keras
    variable's ``assign_add`` is ``assign(self + value)``, a read, an add and
    a write, and two threads that read the same value both write it back
    plus one.  Every thread is joined before the count is returned.

    Shown in the chapter "Stale gradients in depth".
    """
    threads = check_whole_number("threads", threads)
    increments = check_whole_number("increments", increments)
    variable.assign(0.0)

    def add_ones():
        for _ in range(increments):
            variable.assign_add(1.0)

    workers = [threading.Thread(target=add_ones, name=f"pargrad-adder-{i}") for i in range(threads)]
    try:
        for worker in workers:
            worker.start()
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.join()
    return threads * increments - int(round(float(variable.numpy())))
