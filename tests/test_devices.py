"""pargrad.logical_devices: every path of the chapter "Devices"."""

import pytest

import pargrad
from pargrad import devices as devices_module


def test_the_session_has_four_logical_cpus(devices):
    assert devices == [f"/device:CPU:{i}" for i in range(4)]
    assert len(devices_module.tf.config.list_logical_devices("CPU")) == 4


def test_asking_again_for_the_same_split_returns_the_same_names(devices):
    assert pargrad.logical_devices(4) == devices


@pytest.mark.parametrize("bad", [0, -1, 2.0, 2.5, "2", None, True])
def test_bad_counts_get_a_value_error_that_says_what_to_pass(bad):
    with pytest.raises(ValueError, match="logical_devices"):
        pargrad.logical_devices(bad)


def test_a_different_split_after_initialisation_says_restart_the_kernel(devices):
    with pytest.raises(pargrad.DevicesAlreadyInitializedError) as caught:
        pargrad.logical_devices(2)
    message = str(caught.value)
    assert "Restart the kernel" in message and "logical_devices(2)" in message
    assert "4 logical CPU" in message


def test_the_already_initialised_error_in_a_fresh_process(run_python):
    # TensorFlow initialises its devices at the first op; afterwards no split.
    result = run_python("""
        import pargrad, tensorflow as tf
        tf.constant(1.0) + 1.0
        assert pargrad.logical_devices(1) == ["/device:CPU:0"]
        try:
            pargrad.logical_devices(3)
        except pargrad.DevicesAlreadyInitializedError as error:
            print("raised:", error)
    """)
    assert result.returncode == 0, result.stderr
    assert "raised: TensorFlow has already initialised its devices as 1 logical CPU" in result.stdout


def test_a_fresh_process_gets_any_split_it_asks_for_first(run_python):
    result = run_python("""
        import pargrad
        print(pargrad.logical_devices(5))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str([f"/device:CPU:{i}" for i in range(5)])


class FakeConfig:
    """Stands in for tf.config on a machine with one 16 GB GPU."""

    def __init__(self, initialised=False):
        self.gpu = object()
        self.requested = None
        self.initialised = initialised
        self.LogicalDeviceConfiguration = devices_module.tf.config.LogicalDeviceConfiguration

    def list_physical_devices(self, kind):
        return [self.gpu] if kind == "GPU" else ["cpu"]

    def get_logical_device_configuration(self, device):
        return self.requested

    def set_logical_device_configuration(self, device, configurations):
        if self.initialised:
            raise RuntimeError("Virtual devices cannot be modified after being initialized")
        assert device is self.gpu
        self.requested = configurations

    def list_logical_devices(self, kind):
        count = len(self.requested) if self.requested else 1
        return [type("Device", (), {"name": f"/device:{kind}:{i}"}) for i in range(count)]


def test_a_gpu_is_split_into_logical_gpus_with_a_memory_limit_each(monkeypatch):
    fake = FakeConfig()
    monkeypatch.setattr(devices_module.tf, "config", fake)
    monkeypatch.setattr(devices_module, "_gpu_memory_mb", lambda: 16000)
    names = pargrad.logical_devices(3)
    assert names == ["/device:GPU:0", "/device:GPU:1", "/device:GPU:2"]
    assert [c.memory_limit for c in fake.requested] == [4800] * 3  # 90% of 16000 / 3
    assert pargrad.logical_devices(2, memory_limit_mb=1000) == ["/device:GPU:0", "/device:GPU:1"]
    assert [c.memory_limit for c in fake.requested] == [1000, 1000]


def test_an_initialised_gpu_refuses_a_new_split_with_advice(monkeypatch):
    fake = FakeConfig(initialised=True)
    monkeypatch.setattr(devices_module.tf, "config", fake)
    monkeypatch.setattr(devices_module, "_gpu_memory_mb", lambda: 16000)
    with pytest.raises(pargrad.DevicesAlreadyInitializedError, match="1 logical GPU"):
        pargrad.logical_devices(2)
