"""A real Chromium (Debian's `chromium` and `chromium-driver`, `.ci/run` installs them) driven
by Selenium, headless, for the admin console's browser tests; and the check that a screenshot
is not blank (a PNG decoded by hand: no imaging library needed)."""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
REQUIRE_BROWSER = os.environ.get("CI") == "true" or os.environ.get("ORCH_REQUIRE_BROWSER") == "1"


def browser_problem() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    return None


def require_browser() -> None:
    problem = browser_problem()
    if problem is None:
        return
    if REQUIRE_BROWSER:
        pytest.fail(f"the browser tests are required here but {problem}", pytrace=False)
    pytest.skip(problem)


def start_chromium(download_dir: Path):  # type: ignore[no-untyped-def]
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root, Chromium's own sandbox refuses to start
        "--disable-dev-shm-usage",
        "--window-size=1366,900",  # a laptop screen
        "--no-first-run",
        "--disable-background-networking",  # loopback only: no update checks, no safe browsing
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--metrics-recording-only",
        f"--user-data-dir={download_dir}",
    ):
        options.add_argument(argument)
    # The given driver: Selenium Manager would try to download one otherwise.
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))


def png_picture_facts(data: bytes) -> tuple[int, int, int, float]:
    """Width, height, and two facts of the PNG's filtered scanlines (as Chromium writes them):
    how many distinct byte values they hold and which share of bytes is not zero. A page of one
    colour filters to almost only zeros with a handful of values; text and lines do not."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    return width, height, len(set(raw)), 1 - raw.count(0) / len(raw)


def save_screenshot(driver, path: Path) -> Path:  # type: ignore[no-untyped-def]
    """The page as a PNG at `path`, checked to be a laptop-sized, non-blank picture."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = driver.get_screenshot_as_png()
    width, height, values, drawn = png_picture_facts(data)
    assert width >= 800 and height >= 500, (width, height)
    assert values >= 64 and drawn >= 0.0005, f"{path.name} looks blank ({values} byte values, {drawn:.2%} drawn)"
    path.write_bytes(data)
    return path
