"""Tests that need something of the machine (root, `ip`, nginx) say so through
`require`: skipped where it is missing, failed under CI=true, where .ci/run
provides it, so a check never silently stops running."""
import os

import pytest


def require(ok, why):
    """Skips the calling test with `why` unless `ok`; under CI=true, fails instead."""
    if ok:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why} (CI=true: this test must run)")
    pytest.skip(why)
