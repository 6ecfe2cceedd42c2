"""Split one GPU, or the CPU, into several logical devices.

Taught in the chapter "Devices".  Every later chapter calls
:func:`logical_devices` first, so that one machine can stand in for several.
"""

import numbers
import shutil
import subprocess

from pargrad._quiet import import_tensorflow_quietly

tf = import_tensorflow_quietly()

# Share of a GPU's memory that the logical GPUs get together; the rest is
# left for CUDA's own bookkeeping.
GPU_MEMORY_SHARE = 0.9
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
    same names.  On a GPU each logical GPU gets ``memory_limit_mb`` megabytes
    (default: 90% of the GPU's memory divided by ``n``).

    Explained in the chapter "Devices".
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise ValueError(
            f"logical_devices(n) needs a whole number of devices, got {n!r}; "
            "pass an int such as 2 or 4."
        )
    if n < 1:
        raise ValueError(f"logical_devices(n) needs n >= 1, got {n}; pass 1 for no split.")
    n = int(n)

    gpus = tf.config.list_physical_devices("GPU")
    kind = "GPU" if gpus else "CPU"
    physical = gpus[0] if gpus else tf.config.list_physical_devices("CPU")[0]

    if kind == "GPU":
        limit = memory_limit_mb or int(_gpu_memory_mb() * GPU_MEMORY_SHARE / n)
        wanted = [tf.config.LogicalDeviceConfiguration(memory_limit=limit)] * n
    else:
        wanted = [tf.config.LogicalDeviceConfiguration()] * n

    current = tf.config.get_logical_device_configuration(physical)
    try:
        tf.config.set_logical_device_configuration(physical, wanted)
    except RuntimeError as error:
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
