"""The rendered book in a real browser: headless Chromium, driven by Selenium.

Run by ``make test-browser`` (which sets PARGRAD_BROWSER_TESTS=1 and installs
what it needs); ``make test`` leaves this folder out, so it needs no browser.
The pages are opened from ``_build/html`` as files (and once served on
127.0.0.1), with every other host name resolving to nothing, so that a page
that reaches for the network fails here as it would offline.  Screenshots go to ``_build/browser`` (never committed).
"""

import os
import pathlib
import shutil
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "browser"

if not os.environ.get("PARGRAD_BROWSER_TESTS"):
    # Not under `make test-browser`: collect nothing here.
    collect_ignore_glob = ["test_*.py"]

# Chromium as this machine needs it (no sandbox as root, no GPU, no calls home),
# plus: every host name but 127.0.0.1 unresolvable, so nothing can come from the network.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic",
                  "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                  "--window-size=1280,1800"]


def _missing(what, how):
    pytest.fail(f"{what} is missing: {how}. `make test-browser` installs it where it can.",
                pytrace=False)


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the session, with a fresh profile; always quit."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("Selenium", "pip install -r requirements-browser.txt")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if not chromium or not chromedriver:
        _missing("Chromium or ChromeDriver", "apt-get install chromium chromium-driver (as root)")
    if not (HTML / "index.html").exists():
        _missing("The built book", "make book")
    profile = tempfile.mkdtemp(prefix="pargrad-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="session")
def shots():
    """The folder for screenshots: _build/browser, which git ignores."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS


@pytest.fixture(scope="session")
def served():
    """_build/html served on 127.0.0.1 (a free port) for the session; always shut down.

    Files opened as file:// leave no trace in the browser's resource timing;
    served over HTTP, every file a page loads is listed, so a test can check
    that none came from anywhere else.  Yields the base address.
    """
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(HTML)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def pytest_terminal_summary(terminalreporter):
    """Show the agreement table and the screenshots this run wrote, before pytest's last line."""
    if not os.environ.get("PARGRAD_BROWSER_TESTS") or not SHOTS.exists():
        return
    started = terminalreporter.config.stash.get(_STARTED, 0)
    agreement = SHOTS / "agreement.txt"
    if agreement.exists() and agreement.stat().st_mtime >= started:
        terminalreporter.section("the widgets' JavaScript against pargrad")
        terminalreporter.write(agreement.read_text())
    shots = [shot.name for shot in sorted(SHOTS.glob("*.png")) if shot.stat().st_mtime >= started]
    if shots:
        terminalreporter.write_line(f"screenshots in {SHOTS}: {', '.join(shots)}")


_STARTED = pytest.StashKey[float]()


def pytest_configure(config):
    import time

    config.stash[_STARTED] = time.time()
