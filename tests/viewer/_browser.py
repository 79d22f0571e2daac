"""Headless Chromium through Selenium, with Debian's chromium and chromedriver only."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

CHROMIUM = ("/usr/bin/chromium", "chromium")
CHROMEDRIVER = ("/usr/bin/chromedriver", "chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)


def find(candidates: tuple[str, ...]) -> str | None:
    for name in candidates:
        found = shutil.which(name)
        if found:
            return found
    return None


def start_chromium(profile: Path) -> Any:
    """A headless Chromium driven by /usr/bin/chromedriver; Selenium Manager never runs."""
    os.environ["SE_OFFLINE"] = "true"  # never download a driver or browser
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = find(CHROMIUM), find(CHROMEDRIVER)
    assert binary is not None and driver is not None
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)
