"""Headless Chromium driven through WebDriver, for the dashboard's tests, its
screenshots and `sia bench dashboard`: Debian's `chromium` and `chromedriver`
(`make browser`), with selenium told the driver's path so that it never looks for, or
downloads, one of its own."""

from __future__ import annotations

import shutil
from typing import Any

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def unavailable() -> str | None:
    """Why no headless browser can be driven here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if not any(shutil.which(b) for b in CHROMIUM):
        return "no chromium binary (make browser: apt-get install chromium, as root)"
    if not shutil.which("chromedriver"):
        return "no chromedriver (make browser: apt-get install chromium-driver, as root)"
    return None


def chrome(width: int = 1280, height: int = 800) -> Any:
    """A headless Chromium of that window size (`unavailable()` first says whether
    there is one); `quit()` it when done."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = next(p for p in map(shutil.which, CHROMIUM) if p)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--hide-scrollbars", f"--window-size={width},{height}"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options,
                            service=Service(executable_path=shutil.which("chromedriver")))
