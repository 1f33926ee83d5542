"""What every real-browser test shares: Debian's Chromium, its headless flags, the marks that
skip cleanly without it (the module-wide ``browser`` fixture is in conftest.py)."""

from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"]

BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is missing: install it with `apt-get install -y chromium` "
        "(`make test` runs `make browser`, which does when it can)",
    ),
]
