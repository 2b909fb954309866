"""A headless browser for the viewer's tests and screenshots: the system's Chromium and chromedriver (Debian's
``chromium`` and ``chromium-driver``) driven by Selenium. Nothing is downloaded: :func:`missing` says what is absent
(and how to install it) so a test can skip with that reason."""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
INSTALL = "apt-get update && apt-get install -y chromium chromium-driver; pip install 'selenium>=4.25,<5'"


def _binaries() -> tuple[str | None, str | None]:
    browser = os.environ.get("HF_ROLLOUTS_CHROMIUM") or next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)
    driver = os.environ.get("HF_ROLLOUTS_CHROMEDRIVER") or shutil.which("chromedriver")
    return browser, driver


def missing() -> str | None:
    """Why no browser can be started here (None: one can)."""
    browser, driver = _binaries()
    absent = [name for name, found in (("chromium", browser), ("chromedriver", driver)) if not found]
    if importlib.util.find_spec("selenium") is None:
        absent.append("selenium")
    return f"no {', '.join(absent)} on this machine (install: {INSTALL})" if absent else None


def start_browser(width: int = 1400, height: int = 1000) -> Any:
    """A headless Chromium (a Selenium ``WebDriver``); call ``quit()`` when done."""
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = _binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                 f"--window-size={width},{height}", "--disable-extensions", "--lang=en-US"):  # fmt: skip
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(driver))


__all__ = ["INSTALL", "missing", "start_browser"]
