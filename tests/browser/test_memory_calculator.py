"""The memory calculator of "When the model does not fit" computes what pargrad.memory computes.

A grid of inputs goes through ``pargrad.memory.state_bytes`` in Python and
through the page's JavaScript (``pargrad.memory.stateBytes``) in headless
Chromium: every byte count must be the same whole number (both count in
integers below 2^53).  Then a reader types into the form, and the page shows
Python's numbers; bad input says what to pass, as Python does.
"""

import itertools
import json

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from browser_pages import open_page, script_errors
from pargrad import memory

PAGE = "chapters/12_sharded_training"
WIDGET = "pargrad-memory-calculator"


@pytest.fixture(scope="module")
def widget(browser):
    return open_page(browser, PAGE, WIDGET)


def run_js(browser, expression, *arguments):
    return json.loads(browser.execute_script(
        f"var args = arguments[0]; return JSON.stringify({expression});", list(arguments)))


def python_bytes(parameters, replicas, stage, precision, optimizer):
    return memory.state_bytes(parameters, replicas=replicas, stage=stage, precision=precision,
                              optimizer=optimizer)


def test_every_byte_count_is_pythons(browser, widget):
    cases = list(itertools.product([1, 16, 19, 1_000_003, 7_500_000_000, 175_000_000_000],
                                   [1, 2, 3, 7, 8, 64, 1000],
                                   [0, 1, 2, 3], list(memory.PRECISIONS), list(memory.OPTIMIZERS)))
    javascript = run_js(browser, "args.map(c => pargrad.memory.stateBytes(c[0], c[1], c[2], c[3], c[4]))",
                        *cases)
    python = [python_bytes(*case) for case in cases]
    different = [(case, js, py) for case, js, py in zip(cases, javascript, python) if js != py]
    assert different == [], different[:3]
    # The grid reaches the ZeRO paper's Figure 1: 120, 31.4, 16.6, 1.9 GB a device.
    figure_1 = [python_bytes(7_500_000_000, 64, stage, "mixed", "adam")["total"] / 1e9
                for stage in range(4)]
    assert [round(gb, 1) for gb in figure_1] == [120.0, 31.4, 16.6, 1.9]


def test_sharded_components_are_pythons(browser, widget):
    javascript = run_js(browser, "[0, 1, 2, 3].map(s => pargrad.memory.shardedComponents(s))")
    assert [tuple(names) for names in javascript] == [memory.sharded_components(s) for s in range(4)]


def set_field(widget, name, value):
    field = widget.find_element(By.NAME, name)
    field.clear()
    field.send_keys(str(value))


def shown_bytes(widget):
    return {key: int(widget.get_attribute(f"data-{key}"))
            for key in memory.COMPONENTS + ("total",)}


def test_the_form_shows_pythons_numbers(browser, widget, shots):
    browser.execute_script("arguments[0].scrollIntoView()", widget)
    # As the page opens: the ZeRO paper's Figure 1 at stage 1.
    assert shown_bytes(widget) == python_bytes(7_500_000_000, 64, 1, "mixed", "adam")
    assert widget.find_element(By.CSS_SELECTOR, 'td[data-key="total"]').text == "31.41 GB"
    widget.screenshot(str(shots / "memory-calculator.png"))

    # A reader's model: 19 parameters in float64 with momentum, stage 3 on 4 replicas.
    set_field(widget, "parameters", 19)
    set_field(widget, "replicas", 4)
    Select(widget.find_element(By.NAME, "precision")).select_by_value("float64")
    Select(widget.find_element(By.NAME, "optimizer")).select_by_value("momentum")
    Select(widget.find_element(By.NAME, "stage")).select_by_value("3")
    assert shown_bytes(widget) == python_bytes(19, 4, 3, "float64", "momentum")
    assert widget.find_element(By.CSS_SELECTOR, 'td[data-key="total"]').text == "120 B"
    # One bar a stage, the chosen one marked.
    assert len(widget.find_elements(By.CSS_SELECTOR, "svg.pm-bars rect")) == 4
    assert len(widget.find_elements(By.CSS_SELECTOR, "svg.pm-bars rect.pm-here")) == 1

    # Bad input says what to pass, in Python's words.
    set_field(widget, "replicas", 0)
    error = widget.find_element(By.CLASS_NAME, "pc-error").text
    with pytest.raises(ValueError) as python_error:
        python_bytes(19, 0, 3, "float64", "momentum")
    assert error.split(",")[0] == str(python_error.value).split(",")[0]
    assert script_errors(browser) == []
