"""pargrad says which TensorFlow and Keras it needs, and means it."""

import pathlib
import re

import keras
import pytest
import tensorflow as tf

from pargrad import _quiet

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_package_metadata_declares_the_same_minimum_versions():
    text = (ROOT / "pyproject.toml").read_text()
    for name, (major, minor) in _quiet.MINIMUM_VERSIONS.items():
        assert re.search(rf'"{name}>={major}\.{minor}"', text), f"{name}>={major}.{minor}"


def test_the_installed_versions_pass_the_check():
    _quiet.check_versions()


@pytest.mark.parametrize("module, old", [(keras, "3.3.3"), (tf, "2.15.1")])
def test_an_old_release_gets_a_message_that_says_what_to_install(monkeypatch, module, old):
    monkeypatch.setattr(module, "__version__", old)
    with pytest.raises(_quiet.VersionTooOldError) as caught:
        _quiet.check_versions()
    message = str(caught.value)
    assert old in message and "pip install -U" in message and "Restart" in message


@pytest.mark.parametrize("version, release", [
    ("2.21.0", (2, 21)), ("3.7.0rc1", (3, 7)), ("3.10.0", (3, 10)), ("3", (3, 0)),
])
def test_release_numbers_compare_as_numbers(version, release):
    assert _quiet._release(version) == release
