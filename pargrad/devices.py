"""Split one GPU, or the CPU, into several logical devices.

Taught in the chapter "Devices".  Every later chapter calls
:func:`logical_devices` first, so that one machine can stand in for several.
"""

import shutil
import subprocess

from pargrad._quiet import import_tensorflow_quietly
from pargrad.checks import check_positive, check_whole_number

tf = import_tensorflow_quietly()

# Share of a GPU's memory that the logical GPUs may get together; the rest
# is left for CUDA's own bookkeeping and for other processes.
GPU_MEMORY_SHARE = 0.9
# Default memory of one logical GPU (MB): plenty for the book's models, and
# small enough that the extra worker processes of the later chapters fit on
# the same GPU (a Colab T4 has 15 GB).  Pass memory_limit_mb for more.
DEFAULT_LOGICAL_GPU_MB = 1024
# Assumed memory of a GPU when nvidia-smi cannot tell (MB).
FALLBACK_GPU_MEMORY_MB = 4096


class DevicesAlreadyInitializedError(RuntimeError):
    """TensorFlow has set up its devices, so they can no longer be split."""


def logical_devices(n, memory_limit_mb=None):
    """Split the first GPU (or, without a GPU, the CPU) into ``n`` logical devices.

    Returns the names of the logical devices, for example
    ``['/device:CPU:0', '/device:CPU:1']``.  Call it before anything else
    touches TensorFlow: once TensorFlow has initialised its devices the split
    can no longer change.  Calling it again with the same ``n`` returns the
    same names.

    On a GPU, each of ``n > 1`` logical GPUs gets ``memory_limit_mb``
    megabytes (default: 1024, or less if the GPU is small); with ``n = 1``
    the GPU is not split and TensorFlow takes memory as it needs it (memory
    growth) instead of reserving almost all of it up front.

    Explained in the chapter "Devices".

    Shown in the chapter "Devices".
    """
    n = check_whole_number("logical_devices(n)", n, advice="Pass an int such as 2 or 4 "
                           "(1 for no split).")
    if memory_limit_mb is not None:
        check_positive("memory_limit_mb", memory_limit_mb, unit="megabytes",
                       advice="Pass None for the default.")

    gpus = tf.config.list_physical_devices("GPU")
    kind = "GPU" if gpus else "CPU"
    physical = gpus[0] if gpus else tf.config.list_physical_devices("CPU")[0]
    wanted = device_plan(kind, n, memory_limit_mb,
                         _gpu_memory_mb() if kind == "GPU" and memory_limit_mb is None else None)

    current = tf.config.get_logical_device_configuration(physical)
    try:
        if wanted is None:         # one GPU, unsplit: grow into memory as needed
            if current:
                raise RuntimeError("the GPU is already split")
            tf.config.experimental.set_memory_growth(physical, True)
        else:
            tf.config.set_logical_device_configuration(physical, wanted)
    except (RuntimeError, ValueError) as error:
        have = len(current) if current else 1
        if have != n:
            raise DevicesAlreadyInitializedError(
                f"TensorFlow has already initialised its devices as {have} logical "
                f"{kind}(s), so they cannot be split into {n} any more (TensorFlow "
                f"says: {error}). Restart the kernel (or the Python process) and "
                f"call pargrad.logical_devices({n}) before any other TensorFlow "
                "code runs."
            ) from None
    return [device.name for device in tf.config.list_logical_devices(kind)]


def device_kind():
    """"GPU" if TensorFlow sees a GPU, else "CPU": the kind :func:`logical_devices` splits."""
    return "GPU" if tf.config.list_physical_devices("GPU") else "CPU"


def logical_device_names():
    """The names of the logical devices of :func:`device_kind`, in TensorFlow's order."""
    return [device.name for device in tf.config.list_logical_devices(device_kind())]


def device_plan(kind, n, memory_limit_mb=None, gpu_memory_mb=None):
    """The logical-device configurations :func:`logical_devices` asks TensorFlow for.

    For ``kind="CPU"``: ``n`` configurations (a logical CPU has no memory
    limit).  For ``kind="GPU"``: None when ``n == 1`` (no split; memory
    growth), else ``n`` configurations of ``memory_limit_mb`` each, by
    default :data:`DEFAULT_LOGICAL_GPU_MB` but never more than the
    ``GPU_MEMORY_SHARE`` of ``gpu_memory_mb`` divided by ``n``.
    """
    if kind == "CPU":
        return [tf.config.LogicalDeviceConfiguration()] * n
    if kind != "GPU":
        raise ValueError(f"kind must be 'CPU' or 'GPU', got {kind!r}.")
    if n == 1 and memory_limit_mb is None:
        return None
    if memory_limit_mb is None:
        total = gpu_memory_mb or FALLBACK_GPU_MEMORY_MB
        memory_limit_mb = min(DEFAULT_LOGICAL_GPU_MB, int(total * GPU_MEMORY_SHARE / n))
    return [tf.config.LogicalDeviceConfiguration(memory_limit=int(memory_limit_mb))] * n


def _gpu_memory_mb():
    """Total memory of the first GPU in MB, read with nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return FALLBACK_GPU_MEMORY_MB
    try:
        output = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        return int(output.split()[0])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return FALLBACK_GPU_MEMORY_MB
