"""pargrad.logical_devices: every path of the chapter "Devices"."""

import pytest

import pargrad
from pargrad import devices as devices_module

tf = devices_module.tf
# The kind of device this machine splits: these tests run on CPUs and GPUs.
KIND = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"


def test_the_session_has_four_logical_devices_of_the_machines_kind(devices):
    assert devices == [f"/device:{KIND}:{i}" for i in range(4)]
    assert len(tf.config.list_logical_devices(KIND)) == 4


def test_asking_again_for_the_same_split_returns_the_same_names(devices):
    assert pargrad.logical_devices(4) == devices


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (2.0, TypeError),
                                        (2.5, TypeError), ("2", TypeError), (None, TypeError),
                                        (True, TypeError)])
def test_bad_counts_get_an_error_that_says_what_to_pass(bad, error):
    with pytest.raises(error, match="logical_devices") as caught:
        pargrad.logical_devices(bad)
    assert isinstance(caught.value, TypeError) == (error is TypeError)


def test_a_different_split_after_initialisation_says_restart_the_kernel(devices):
    with pytest.raises(pargrad.DevicesAlreadyInitializedError) as caught:
        pargrad.logical_devices(2)
    message = str(caught.value)
    assert "Restart the kernel" in message and "logical_devices(2)" in message
    assert f"4 logical {KIND}" in message


def test_the_already_initialised_error_in_a_fresh_process(run_python):
    # TensorFlow initialises its devices at the first op; afterwards no split.
    result = run_python("""
        import pargrad, tensorflow as tf
        tf.constant(1.0) + 1.0
        kind = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
        assert pargrad.logical_devices(1) == [f"/device:{kind}:0"]
        try:
            pargrad.logical_devices(3)
        except pargrad.DevicesAlreadyInitializedError as error:
            print("raised:", error)
    """)
    assert result.returncode == 0, result.stderr
    assert ("raised: TensorFlow has already initialised its devices as 1 logical "
            f"{KIND}") in result.stdout


def test_a_fresh_process_gets_any_split_it_asks_for_first(run_python):
    result = run_python("""
        import pargrad
        print(pargrad.logical_devices(5))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str([f"/device:{KIND}:{i}" for i in range(5)])


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

    @property
    def experimental(self):
        fake = self

        class Experimental:
            def set_memory_growth(self, device, enabled):
                if fake.initialised:
                    raise RuntimeError("Physical devices cannot be modified after being initialized")
                fake.growth = enabled
        return Experimental()

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
    assert [c.memory_limit for c in fake.requested] == [1024] * 3  # the default, not 90%
    assert pargrad.logical_devices(2, memory_limit_mb=3000) == ["/device:GPU:0", "/device:GPU:1"]
    assert [c.memory_limit for c in fake.requested] == [3000, 3000]


def test_one_gpu_unsplit_grows_into_memory_instead_of_reserving_it(monkeypatch):
    fake = FakeConfig()
    monkeypatch.setattr(devices_module.tf, "config", fake)
    assert pargrad.logical_devices(1) == ["/device:GPU:0"]
    assert fake.requested is None and fake.growth is True


@pytest.mark.parametrize("kind", ["CPU", "GPU"])
def test_the_device_plan_for_each_kind(kind):
    plan = devices_module.device_plan(kind, 4, gpu_memory_mb=16000)
    assert len(plan) == 4
    limits = {c.memory_limit for c in plan}
    assert limits == ({None} if kind == "CPU" else {1024})


def test_a_small_gpu_shares_its_memory_between_the_logical_gpus():
    plan = devices_module.device_plan("GPU", 4, gpu_memory_mb=2000)  # 90% of 2000 / 4
    assert [c.memory_limit for c in plan] == [450] * 4


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-5, ValueError), ("1 GB", TypeError),
                                        (True, TypeError)])
def test_a_bad_memory_limit_says_what_to_pass(bad, error):
    with pytest.raises(error, match="memory_limit_mb"):
        pargrad.logical_devices(2, memory_limit_mb=bad)


def test_an_initialised_gpu_refuses_a_new_split_with_advice(monkeypatch):
    fake = FakeConfig(initialised=True)
    monkeypatch.setattr(devices_module.tf, "config", fake)
    monkeypatch.setattr(devices_module, "_gpu_memory_mb", lambda: 16000)
    with pytest.raises(pargrad.DevicesAlreadyInitializedError, match="1 logical GPU"):
        pargrad.logical_devices(2)


def test_the_names_of_the_split_devices_whatever_their_kind(devices):
    assert devices_module.device_kind() == KIND
    assert devices_module.logical_device_names() == devices
