"""A reader turns the widgets' dials in headless Chromium; the page shows pargrad's numbers.

The sliders are moved with the keyboard (as a reader without a mouse would),
the calculator's fields are typed into; then the test reads back what the
page shows and compares it with pargrad in Python.  Screenshots of each
widget go to _build/browser.
"""

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from browser_pages import open_page, script_errors
from pargrad import cost
from pargrad.book.delay import delayed_gradient_path, stable_rate_bound
from test_widget_arithmetic import chapter_links


def js_format(value, digits):
    """What the playground prints: fixed digits, with a real minus sign."""
    return f"{value:.{digits}f}".replace("-", "−")


def move(slider, key, times):
    """Press an arrow key on a slider: each press moves it one step, as for a reader."""
    for _ in range(times):
        slider.send_keys(key)


def balls(widget):
    return widget.find_elements(By.CSS_SELECTOR, "svg.pg-balls circle.pg-ball")


def test_playground_redraws_what_pargrad_computes(browser, shots):
    widget = open_page(browser, "chapters/04_asynchronous", "pargrad-staleness-playground")
    browser.execute_script("arguments[0].scrollIntoView()", widget)
    rate = widget.find_element(By.NAME, "rate")
    staleness = widget.find_element(By.NAME, "staleness")
    status = widget.find_element(By.CLASS_NAME, "pg-status")
    # As the page opens: the chapter's figure, eta * lambda = 0.6 and two workers.
    assert rate.get_attribute("value") == "0.6" and staleness.get_attribute("value") == "1"
    path = delayed_gradient_path(0.6, 1, 3.0, 40)
    assert [float(ball.get_attribute("data-w")) for ball in balls(widget)] == pytest.approx(
        path[:3], rel=1e-12)
    assert [b.get_attribute("class").split()[-1] for b in balls(widget)] == [
        "pg-black", "pg-gray", "pg-white"]
    widget.screenshot(str(shots / "playground.png"))

    # Four workers (staleness 3), and a rate past their bound.
    move(staleness, Keys.ARROW_RIGHT, 2)
    move(rate, Keys.ARROW_RIGHT, 5)
    assert widget.find_element(By.CSS_SELECTOR, 'output[name="rate-value"]').text == "0.70"
    assert widget.find_element(By.CSS_SELECTOR, 'output[name="staleness-value"]').text == "3 (W = 4)"
    bound = stable_rate_bound(3)
    assert 0.70 > bound
    assert f"= {bound:.4f}." in status.text and "Unstable" in status.text
    assert "pg-warning" in status.get_attribute("class")
    assert widget.find_elements(By.CSS_SELECTOR, "svg.pg-bound-chart circle.pg-unstable")
    path = delayed_gradient_path(0.70, 3, 3.0, 40)
    shown = [float(ball.get_attribute("data-w")) for ball in balls(widget)]
    assert shown == pytest.approx(path[:5], rel=1e-12)  # black, three gray, white
    assert f"stale w = {js_format(path[4], 3)}" in status.text
    assert float(widget.get_attribute("data-last-stale")) == pytest.approx(path[40], rel=1e-12)
    assert abs(path[40]) > abs(path[0])  # it does diverge, as the page says
    widget.screenshot(str(shots / "playground-unstable.png"))

    # Back below the bound: the page says the stale run converges again.
    move(rate, Keys.ARROW_LEFT, 15)
    assert widget.find_element(By.CSS_SELECTOR, 'output[name="rate-value"]').text == "0.40"
    assert 0.40 < bound and "converges" in status.text
    assert not widget.find_elements(By.CSS_SELECTOR, "svg.pg-bound-chart circle.pg-unstable")

    # The starting point dragged with the mouse to the slider's left end: w(0) = -3.
    start = widget.find_element(By.NAME, "start")
    ActionChains(browser).click_and_hold(start).move_by_offset(-start.size["width"], 0) \
        .release().perform()
    assert widget.find_element(By.CSS_SELECTOR, 'output[name="start-value"]').text == "−3.0"
    path = delayed_gradient_path(0.40, 3, -3.0, 40)
    assert [float(ball.get_attribute("data-w")) for ball in balls(widget)] == pytest.approx(
        path[:5], rel=1e-12)
    assert script_errors(browser) == []


def set_field(widget, name, value):
    field = widget.find_element(By.NAME, name)
    field.clear()
    field.send_keys(str(value))


def shown(widget, key):
    return widget.find_element(By.CSS_SELECTOR, f'td[data-key="{key}"]').text


def test_calculator_shows_what_pargrad_cost_computes(browser, shots):
    links = chapter_links()
    widget = open_page(browser, "chapters/10_communication_costs", "pargrad-scaling-calculator")
    browser.execute_script("arguments[0].scrollIntoView()", widget)
    # As the page opens: ResNet-50 (fp32 gradients) on 8 boxes of 8 GPUs, NVLink inside,
    # one 100 GbE port a box, 64 images a GPU, no overlap.
    compute = 64 * (0.4872 * 1e-3)
    communication = cost.hierarchical_all_reduce_time(
        25.6e6 * 4, 8, 8, links["NVLink A100"], cost.Link(links["100 GbE"].latency,
                                                          links["100 GbE"].bandwidth * 1))
    step = cost.step_time(compute, communication)
    assert float(widget.get_attribute("data-step")) == pytest.approx(step, rel=1e-12)
    assert shown(widget, "efficiency") == f"{100 * cost.scaling_efficiency(compute, step):.1f} %"
    assert shown(widget, "smallest") == str(
        cost.smallest_batch_for_efficiency(0.4872e-3, communication, 0.9))
    widget.screenshot(str(shots / "calculator.png"))

    # A reader's own cluster: 16 replicas in one ring over 25 GbE, fp16 gradients,
    # 32 examples a replica, overlap on, and 95 % to keep.
    Select(widget.find_element(By.NAME, "algorithm")).select_by_value("ring")
    Select(widget.find_element(By.NAME, "link")).select_by_value("25 GbE")
    Select(widget.find_element(By.NAME, "bytes")).select_by_value("2")
    set_field(widget, "replicas", 16)
    set_field(widget, "batch", 32)
    set_field(widget, "target", 95)
    widget.find_element(By.NAME, "overlap").click()
    compute = 32 * (0.4872 * 1e-3)
    communication = cost.ring_all_reduce_time(25.6e6 * 2, 16, links["25 GbE"])
    step = cost.step_time(compute, communication, overlap=1.0)
    efficiency = cost.scaling_efficiency(compute, step)
    assert shown(widget, "communication") == f"{communication * 1e3:.3f} ms"
    assert shown(widget, "step") == f"{step * 1e3:.3f} ms"
    assert shown(widget, "efficiency") == f"{100 * efficiency:.1f} %"
    smallest = cost.smallest_batch_for_efficiency(0.4872e-3, communication, 0.95, overlap=1.0)
    assert shown(widget, "smallest") == str(smallest) and smallest > 32
    widget.screenshot(str(shots / "calculator-ring-25gbe.png"))

    # Bad input says what to pass instead, as pargrad.cost does.
    Select(widget.find_element(By.NAME, "algorithm")).select_by_value("hierarchical")
    set_field(widget, "replicas", 60)
    error = widget.find_element(By.CLASS_NAME, "pc-error").text
    assert "pass a multiple of 8" in error
    assert script_errors(browser) == []
