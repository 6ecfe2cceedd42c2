"""The book's mathematics renders with no network: MathJax comes from its own static files.

The page is opened from _build/html as a file, with every host name
resolving to nothing (tests/browser/conftest.py): if MathJax came from a
CDN, the TeX would stay raw, as the issue found on this machine.
"""

import pytest
from selenium.webdriver.common.by import By

from browser_pages import ROOT, page_url, script_errors

WAIT_FOR_MATHJAX = """
        var done = arguments[arguments.length - 1];
        var waited = 0;
        (function wait() {
            if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
                MathJax.startup.promise.then(function () { done("typeset"); },
                                             function (e) { done("failed: " + e); });
            } else if ((waited += 100) > 20000) {
                done("MathJax never started");
            } else {
                setTimeout(wait, 100);
            }
        })();"""


def test_mathjax_typesets_a_page_offline(browser, shots):
    if not (ROOT / "_vendor" / "mathjax" / ".from-npm").exists():
        pytest.fail("MathJax is not vendored (npm was missing when the book was built): the "
                    "pages load it from a CDN. Install Node.js and npm, then make book.",
                    pytrace=False)
    browser.get(page_url("chapters/10_communication_costs"))
    state = browser.execute_async_script(WAIT_FOR_MATHJAX)
    assert state == "typeset"
    source = browser.execute_script(
        "return document.querySelector('script[src*=\"tex-mml-chtml\"]').src")
    assert source.startswith("file://") and "/_static/mathjax/" in source
    formulas = browser.find_elements(By.CSS_SELECTOR, "mjx-container")
    assert len(formulas) > 20
    text = browser.execute_script("return document.querySelector('main').innerText")
    assert "\\(" not in text and "\\frac" not in text
    # MathJax's own fonts came from the book's files too, and nothing from a network.
    fonts = browser.execute_script(
        "return Array.from(document.fonts).filter(f => f.family.indexOf('MJX') >= 0)"
        ".map(f => f.status)")
    assert "loaded" in fonts, fonts
    assert script_errors(browser) == []
    display = browser.find_element(By.CSS_SELECTOR, 'mjx-container[display="true"]')
    browser.execute_script("arguments[0].scrollIntoView()", display)
    display.screenshot(str(shots / "mathjax-offline.png"))


def test_a_served_page_loads_nothing_from_elsewhere(browser, served):
    """Served from 127.0.0.1, every file the page loads comes from there: none from a CDN."""
    browser.get(f"{served}/chapters/10_communication_costs.html")
    assert browser.execute_async_script(WAIT_FOR_MATHJAX) == "typeset"
    resources = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    assert any("/_static/mathjax/" in name for name in resources)
    for widget in ("common.js", "calculator.js"):
        assert any(f"/_static/widgets/{widget}" in name for name in resources), widget
    assert [name for name in resources if not name.startswith(served + "/")] == []
    assert script_errors(browser) == []
