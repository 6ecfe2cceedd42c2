"""Local clusters: several Python processes on 127.0.0.1, started and always stopped.

Taught in the chapter "Synchronous training" (and extended in "Beyond one
machine").  Each process gets its own ``TF_CONFIG`` naming every process of
the cluster on 127.0.0.1 with a free port, runs one importable function, and
hands its return value back to the parent.  Every line a process prints is
kept with its role as a prefix (``[worker 1] ...``).

Warning: TensorFlow's gRPC servers listen on *all* network interfaces, even
though ``TF_CONFIG`` names 127.0.0.1, and they have no authentication.  Run
clusters only on machines and networks you trust; :class:`LocalCluster`
stops every process it started when its ``with`` block ends, whether the
run succeeded, raised, timed out or was interrupted with Ctrl-C.
"""

import atexit
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref

import numpy as np

from pargrad.checks import check_positive, check_whole_number

HOST = "127.0.0.1"
RESULT_MARKER = "@@pargrad-result@@ "
# Seconds a process gets to end after SIGTERM before it is killed.  Short:
# the processes hand their results back before they end, so there is nothing
# to save, and a worker of MultiWorkerMirroredStrategy ignores SIGTERM
# (TensorFlow takes it as a preemption notice), so it always waits this long.
TERMINATE_GRACE = 1.0

_live_clusters = weakref.WeakSet()


class ClusterError(RuntimeError):
    """A process of a local cluster failed, or the cluster timed out."""


class ClusterTimeoutError(ClusterError, TimeoutError):
    """The cluster's processes did not all finish in time."""


def free_ports(n, host=HOST):
    """``n`` distinct TCP ports that are free on ``host`` right now."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(cluster, role, index):
    """The ``TF_CONFIG`` JSON for task ``(role, index)`` of ``cluster``."""
    return json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})


class LocalCluster:
    """Run ``target(**kwargs)`` in ``workers`` fresh processes on 127.0.0.1.

    ``target`` is a function importable by the child (defined in a module,
    not in a notebook) or a ``"module:function"`` string.  Each process has
    ``TF_CONFIG`` set for a cluster of ``workers`` workers on free ports of
    127.0.0.1 (``tf_config=False`` leaves it unset: plain fresh processes,
    for example to split the devices differently).  Use it as a context
    manager::

        with pargrad.LocalCluster(train_parabola, workers=2) as cluster:  # pargrad.book.parabola
            results = cluster.wait()        # one return value per worker
        print(cluster.log())                # every line, prefixed by its role

    A worker that has handed back its result stays up, serving, until every
    worker has handed back its own: then :meth:`wait` releases them all
    together.  TensorFlow's collectives are pulled by the receiver, so a
    worker that left as soon as it had its own result could cut off a peer
    still reading the last buffer from it.

    Leaving the block stops every process (SIGTERM to its process group,
    then SIGKILL after a grace period), on success, exception, time-out or
    Ctrl-C.  :meth:`wait` raises :class:`ClusterError` as soon as one
    process fails (its exit code and last lines in the message) and
    :class:`ClusterTimeoutError` after ``timeout`` seconds.

    With ``parameter_servers=P`` (``>= 1``) the layout is that of
    ``ParameterServerStrategy``: a coordinator (task type ``chief``) runs
    ``target`` and :meth:`wait` returns its result alone, while ``workers``
    workers and ``P`` parameter servers run :func:`serve`, a TensorFlow
    server, until the cluster stops.  ``ports`` fixes the ports (one a task,
    in the order of :attr:`roles`) instead of free ones; a port in use is
    refused before any process starts.  :meth:`wait_for` waits for a line of
    output and :meth:`kill` kills one process, to stage a failure.

    TensorFlow's gRPC servers listen on all interfaces and have no
    authentication: use this only on trusted machines and networks.

    Taught in the chapter "Synchronous training"; parameter servers, kills
    and running by hand in "Beyond one machine".
    """

    def __init__(self, target, workers=2, kwargs=None, timeout=300, env=None,
                 tf_config=True, echo=False, parameter_servers=0, ports=None):
        workers = check_whole_number("workers", workers, advice="Every layout needs at least "
                                     "one worker to compute.")
        parameter_servers = check_whole_number(
            "parameter_servers", parameter_servers, minimum=0,
            advice="Pass 0 for workers only (MultiWorkerMirroredStrategy).")
        if parameter_servers and not tf_config:
            raise ValueError("A layout with parameter servers needs TF_CONFIG; pass tf_config=True.")
        if timeout is not None:
            check_positive("timeout", timeout, unit="seconds", advice="Pass None to wait for ever.")
        self.target = _target_name(target)
        self.kwargs = dict(kwargs or {})
        self._kwargs_json = json.dumps(self.kwargs, default=_encode)  # fail early
        self.timeout = timeout
        self.env = dict(env or {})
        self.use_tf_config = tf_config
        self.echo = echo
        self.parameter_servers = parameter_servers
        if parameter_servers:
            # ParameterServerStrategy: the coordinator ("chief") runs target;
            # workers and parameter servers only serve (see :func:`serve`).
            self.roles = ([("chief", 0)] + [("worker", i) for i in range(workers)]
                          + [("ps", i) for i in range(parameter_servers)])
            self.runners = [("chief", 0)]
        else:
            self.roles = [("worker", i) for i in range(workers)]
            self.runners = list(self.roles)
        self.ports = _check_ports(ports, len(self.roles)) if ports is not None else None
        self.killed = {}          # (role, index) -> time.monotonic() of cluster.kill
        self.cluster_spec = None
        self.processes = {}
        self.lines = []           # every line, prefixed, in the order they arrived
        self.line_times = []      # time.monotonic() when each line arrived
        self.results = {}
        self._readers = []
        self._lock = threading.Lock()

    # -- life cycle ------------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info):
        self.stop()
        return False

    def start(self):
        """Start every process; returns ``self``."""
        if self.processes:
            raise ClusterError("This cluster has already been started; make a new one.")
        spec = self.cluster_spec = self._claim_ports()
        _live_clusters.add(self)
        try:
            for role, index in self.roles:
                env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1",
                       "TF_FORCE_GPU_ALLOW_GROWTH": "true", **self.env,
                       PARENT_VARIABLE: str(os.getpid())}
                env.pop("TF_CONFIG", None)
                if self.use_tf_config:
                    env["TF_CONFIG"] = tf_config(spec, role, index)
                if (role, index) in self.runners:
                    command = [sys.executable, "-c", _WORKER_COMMAND, self.target, self._kwargs_json]
                else:
                    command = [sys.executable, "-c", _WORKER_COMMAND, SERVE_TARGET, "{}"]
                # stdin carries the parent's release (see wait and _worker_main).
                process = subprocess.Popen(
                    command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
                )
                self.processes[(role, index)] = process
                reader = threading.Thread(
                    target=self._read, args=(role, index, process), daemon=True,
                    name=f"pargrad-{role}-{index}-reader",
                )
                reader.start()
                self._readers.append(reader)
        except BaseException:
            self.stop()
            raise
        return self

    def _claim_ports(self):
        """The cluster spec ``{role: ["127.0.0.1:port", ...]}``: the given ports if free, else new ones."""
        if self.ports is not None:
            busy = [port for port in self.ports if not _port_is_free(port)]
            if busy:
                raise ClusterError(
                    f"Port(s) {busy} on {HOST} are in use by another program; pass "
                    "other ports, or ports=None to let the cluster pick free ones."
                )
        ports = self.ports if self.ports is not None else free_ports(len(self.roles))
        spec = {}
        for (role, _), port in zip(self.roles, ports):
            spec.setdefault(role, []).append(f"{HOST}:{port}")
        return spec

    def wait(self, timeout=None):
        """Wait for every process; return their results, in task order.

        Once every running worker has handed back its result, all of them are
        released together and end (none leaves while a peer may still pull
        data from it).  Raises :class:`ClusterError` when a process exits
        with an error (the others are then stopped when the ``with`` block
        ends, or by :meth:`stop`), and :class:`ClusterTimeoutError` after
        ``timeout`` seconds (default: the cluster's ``timeout``).
        """
        if not self.processes:
            raise ClusterError("Start the cluster first: use `with LocalCluster(...) as cluster:`.")
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._raise_if_failed()
            runners = [key for key in self.runners if key not in self.killed]
            pending = [key for key in runners if key not in self.results]
            if not pending:
                break
            for role, index in pending:
                if self.processes[(role, index)].poll() == 0:
                    self._join_reader(role, index)
                    if (role, index) not in self.results:
                        raise ClusterError(f"{role} {index} ended without handing back a result.")
            if deadline is not None and time.monotonic() > deadline:
                raise ClusterTimeoutError(
                    f"The cluster did not finish within {timeout} s; still running: "
                    + ", ".join(f"{r} {i}" for r, i in pending)
                )
            time.sleep(0.02)
        self._release(runners)
        return [self.results[key] for key in runners]

    def _raise_if_failed(self):
        """Raise :class:`ClusterError` for a process that exited with an error."""
        codes = {key: p.poll() for key, p in self.processes.items()}
        failed = [(key, code) for key, code in codes.items()
                  if code not in (None, 0) and key not in self.killed]
        # A process ended by a signal is the likeliest cause of the others' errors.
        failed.sort(key=lambda item: item[1] >= 0)
        if failed:
            (role, index), code = failed[0]
            self._join_reader(role, index)
            raise ClusterError(
                f"{role} {index} exited with {_describe_exit(code)}; its last lines:\n"
                + self.log(role, index, last=15)
            )

    def _release(self, runners, grace=30.0):
        """Let every finished worker end, all together, and reap them."""
        for key in runners:
            _close_quietly(self.processes[key].stdin)
        deadline = time.monotonic() + grace
        for key in runners:
            try:
                self.processes[key].wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass  # stop() ends it; its result is already in hand
            self._join_reader(*key)

    def wait_for(self, text, role=None, index=None, count=1, timeout=60):
        """Wait until ``count`` lines containing ``text`` have arrived.

        Only lines of ``role`` (and ``index``) count when given.  Returns the
        ``time.monotonic()`` at which the last of them arrived.  Raises
        :class:`ClusterError` if a process fails first and
        :class:`ClusterTimeoutError` after ``timeout`` seconds.  Taught in
        the chapter "Beyond one machine" (to kill a process mid-run).
        """
        if not self.processes:
            raise ClusterError("Start the cluster first: use `with LocalCluster(...) as cluster:`.")
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                hits = [t for (r, i, line), t in zip(self.lines, self.line_times)
                        if text in line and (role is None or r == role)
                        and (index is None or i == index)]
            if len(hits) >= count:
                return hits[count - 1]
            for key, process in self.processes.items():
                code = process.poll()
                if code not in (None, 0) and key not in self.killed:
                    self._join_reader(*key)
                    raise ClusterError(
                        f"{key[0]} {key[1]} exited with {_describe_exit(code)} while waiting "
                        f"for {text!r}; its last lines:\n" + self.log(*key, last=15)
                    )
            if time.monotonic() > deadline:
                raise ClusterTimeoutError(f"No line with {text!r} arrived within {timeout} s.")
            time.sleep(0.02)

    def kill(self, role, index, sig=signal.SIGKILL, expected=True):
        """Kill one process (default ``SIGKILL``, like a machine that dies).

        With ``expected=True`` the cluster then treats its exit as planned:
        :meth:`wait` neither raises for it nor waits for its result (the
        coordinator of ParameterServerStrategy carries on without it).  With
        ``expected=False`` it is a crash like any other: :meth:`wait` raises
        :class:`ClusterError` (a synchronous run cannot go on).  Returns the
        ``time.monotonic()`` of the kill.  Taught in the chapter "Beyond one
        machine".
        """
        if not self.processes:
            raise ClusterError("Start the cluster first: use `with LocalCluster(...) as cluster:`.")
        if (role, index) not in self.processes:
            raise ValueError(f"This cluster has no {role} {index}; its tasks are {self.roles}.")
        when = time.monotonic()
        if expected:
            self.killed[(role, index)] = when
        _signal_group(self.processes[(role, index)], sig)
        self.processes[(role, index)].wait()
        return when

    def stop(self):
        """Stop every process of the cluster (safe to call more than once)."""
        running = [p for p in self.processes.values() if p.poll() is None]
        for process in running:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + TERMINATE_GRACE
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for process in self.processes.values():
            # Also reach any child a worker started, then reap the worker.
            _signal_group(process, signal.SIGKILL)
            process.wait()
        for reader in self._readers:
            reader.join(timeout=5)
        for process in self.processes.values():
            _close_quietly(process.stdin)
            if process.stdout is not None:
                process.stdout.close()
        _live_clusters.discard(self)

    @property
    def pids(self):
        """Process ids, in task order."""
        return [self.processes[key].pid for key in self.roles if key in self.processes]

    # -- output ----------------------------------------------------------------

    def log(self, role=None, index=None, last=None):
        """The lines printed so far, each prefixed by its role, as one string."""
        with self._lock:
            lines = [entry for entry in self.lines
                     if (role is None or entry[0] == role) and (index is None or entry[1] == index)]
        lines = lines if last is None else lines[-last:]
        return "\n".join(f"[{r} {i}] {line}" for r, i, line in lines)

    def _read(self, role, index, process):
        for line in process.stdout:
            line = line.rstrip("\n")
            if line.startswith(RESULT_MARKER):
                self.results[(role, index)] = json.loads(
                    line[len(RESULT_MARKER):], object_hook=_decode
                )
                continue
            with self._lock:
                self.lines.append((role, index, line))
                self.line_times.append(time.monotonic())
            if self.echo:
                print(f"[{role} {index}] {line}", flush=True)

    def _join_reader(self, role, index):
        position = self.roles.index((role, index))
        if position < len(self._readers):
            self._readers[position].join(timeout=5)


def run_cluster(target, workers=2, kwargs=None, timeout=300, **options):
    """Start a :class:`LocalCluster`, wait for its results, always stop it."""
    with LocalCluster(target, workers=workers, kwargs=kwargs, timeout=timeout, **options) as cluster:
        return cluster.wait()


def stop_all_clusters():
    """Stop every cluster this process started and has not stopped yet."""
    for cluster in list(_live_clusters):
        cluster.stop()


atexit.register(stop_all_clusters)


# ----------------------------------------------------------------------------
# Inside a worker process
# ----------------------------------------------------------------------------

_WORKER_COMMAND = "from pargrad.cluster import _worker_main; _worker_main()"
PARENT_VARIABLE = "PARGRAD_CLUSTER_PARENT"   # the pid of the process that started the task
SERVE_TARGET = "pargrad.cluster:serve"


def serve():
    """Run this process's TensorFlow server until the process is stopped.

    The task of a worker or parameter server under ParameterServerStrategy:
    it only serves; the coordinator (task type ``chief``) sends it work.  It
    reads ``TF_CONFIG`` like every task.  A worker's inter-op thread pool
    gets ``workers + 1`` threads: with fewer, workers on a 2-core machine
    can hang (each closure the coordinator sends blocks a thread while it
    waits for variables).  The server listens on *all* interfaces, without
    authentication.  Taught in the chapter "Beyond one machine".

    Shown in the chapter "Beyond one machine".
    """
    # In a child process (a task of the cluster): the parent never loads TensorFlow for it.
    from pargrad._quiet import import_tensorflow_quietly

    tf = import_tensorflow_quietly()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    config = tf.compat.v1.ConfigProto()
    if resolver.task_type == "worker":
        config.inter_op_parallelism_threads = spec.num_tasks("worker") + 1
    server = tf.distribute.Server(
        spec, job_name=resolver.task_type, task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc", config=config, start=True,
    )
    print(f"serving as {resolver.task_type} {resolver.task_id}", flush=True)
    server.join()


# Seconds a task run by hand keeps serving after printing its result (see main).
LINGER_SECONDS = 10.0


def main(argv=None, linger=LINGER_SECONDS):
    """``python -m pargrad.cluster module:function '{"kwarg": 1}'``, or ``... serve``.

    Runs one task of a cluster in this process, with the ``TF_CONFIG`` you
    set: the same code :class:`LocalCluster` runs, for real machines.  After
    printing its result the task keeps serving for ``linger`` seconds: no
    parent releases tasks run by hand all together, and a peer may still be
    pulling the last buffer of a collective from this one.  Taught in the
    chapter "Beyond one machine".
    """
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(main.__doc__)
        return 0
    if "TF_CONFIG" not in os.environ:
        print("Set TF_CONFIG for this task first (see pargrad.cluster.tf_config).", file=sys.stderr)
        return 2
    if argv[0] == "serve":
        serve()
        return 0
    kwargs = json.loads(argv[1]) if len(argv) > 1 else {}
    result = _load_target(_target_name(argv[0]))(**kwargs)
    print(json.dumps(result, default=_encode), flush=True)
    time.sleep(linger)
    return 0


def _worker_main():
    """Entry point of a worker: ``python -c ... target kwargs_json``."""
    target, kwargs_json = sys.argv[1], sys.argv[2]
    _exit_when_orphaned()
    try:
        function = _load_target(target)
        result = function(**json.loads(kwargs_json, object_hook=_decode))
        payload = json.dumps(result, default=_encode)
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.write(RESULT_MARKER + payload + "\n")
    sys.stdout.flush()
    # Keep serving until the parent releases every worker together (it closes
    # our stdin; EOF also comes if the parent dies): a peer may still be
    # pulling the last buffer of a collective from this process's server.
    sys.stdin.read()
    # Skip interpreter shutdown: TensorFlow's servers can delay or crash it.
    os._exit(0)


def _exit_when_orphaned():
    """End this worker if its parent dies without stopping it (e.g. SIGKILL).

    The parent's pid comes from the environment, not from ``os.getppid()``
    now: importing TensorFlow takes seconds before this runs, and a parent
    that died meanwhile would otherwise go unnoticed (the orphan's parent is
    already another process).
    """
    parent = int(os.environ.get(PARENT_VARIABLE) or os.getppid())

    def watch():
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True, name="pargrad-orphan-watch").start()


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

def _target_name(target):
    if isinstance(target, str):
        if ":" not in target:
            raise ValueError(f"A target string looks like 'package.module:function', got {target!r}.")
        return target
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None)
    if not callable(target) or module is None or name is None:
        raise TypeError(f"target must be a function or 'module:function', got {target!r}.")
    if module == "__main__" or "<locals>" in name:
        raise ValueError(
            f"The worker processes cannot import {name!r} from {module!r}; define "
            "the function in a module file (for example in pargrad) and pass it, "
            "or pass 'module:function'."
        )
    return f"{module}:{name}"


def _load_target(target):
    module_name, _, name = target.partition(":")
    obj = importlib.import_module(module_name)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _encode(value):
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"A worker's result must be JSON data or numpy arrays, got {type(value).__name__}.")


def _decode(obj):
    if "__ndarray__" in obj:
        return np.asarray(obj["__ndarray__"], dtype=obj["dtype"])
    return obj


def _port_is_free(port, host=HOST):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _check_ports(ports, n):
    ports = list(ports)
    if len(ports) != n or len(set(ports)) != n or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536 for p in ports):
        raise ValueError(
            f"ports must be {n} distinct port numbers, one a task in the order of "
            f"`roles` (chief, workers, parameter servers), got {ports!r}; or pass "
            "ports=None to let the cluster pick free ones."
        )
    return ports


def _close_quietly(stream):
    if stream is None:
        return
    try:
        stream.close()
    except (BrokenPipeError, OSError):  # the process has already ended
        pass


def _signal_group(process, sig):
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _describe_exit(code):
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


if __name__ == "__main__":
    sys.exit(main())
