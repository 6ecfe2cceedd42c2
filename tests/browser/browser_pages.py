"""Helpers of the browser tests: where the built pages are, opening one, its errors."""

import pathlib

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ROOT = pathlib.Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"


def page_url(name):
    """The file:// address of a built page, for example ``chapters/10_communication_costs``."""
    page = HTML / f"{name}.html"
    if not page.exists():
        pytest.fail(f"The page {page} is missing: run `make book` first.", pytrace=False)
    return page.as_uri()


def open_page(browser, name, ready_id):
    """Open a built page and wait until the element ``ready_id`` has been drawn into."""
    browser.get(page_url(name))
    WebDriverWait(browser, 30).until(
        lambda d: d.find_element(By.ID, ready_id).get_attribute("class") and
        "pargrad-widget" in d.find_element(By.ID, ready_id).get_attribute("class"))
    return browser.find_element(By.ID, ready_id)


# Errors of the book's theme, not of the widgets: sphinx-thebe declares
# THEBE_JS_URL twice on every page, and the theme complains once about its
# colour mode when a new profile has none stored; and the browser asks a
# served book for a favicon it does not have.  Anything else fails a test.
THEME_ERRORS = ("Identifier 'THEBE_JS_URL' has already been declared",
                "Got invalid theme mode", "/favicon.ico - Failed to load resource")


def script_errors(browser):
    """The JavaScript errors and failed loads logged since the last call, but the theme's."""
    return [entry["message"] for entry in browser.get_log("browser")
            if entry["level"] == "SEVERE"
            and not any(known in entry["message"] for known in THEME_ERRORS)]
