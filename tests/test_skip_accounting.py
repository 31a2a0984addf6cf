"""The skip accounting (tests/skip_accounting.py, which the root conftest.py loads) on runs of
its own: under METFS_REQUIRE_SERVERS=1 a skip that the allowlist does not allow fails the run,
at collection as in a test, while an allowed skip and an expected failure do not; without the
variable every skip is listed and the run passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

TESTS = """
import pytest

def test_runs():
    pass

def test_allowed():
    pytest.skip("allowed here")

def test_unlisted():
    pytest.skip("nobody said so")

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_known_bug():
    assert False
"""

MODULE_SKIP = """
import pytest

pytest.skip("no such server here", allow_module_level=True)

def test_never_collected():
    pass
"""


def run(
    tmp_path: Path, *args: str, require: bool, user: str = "any", why: str = "an example"
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmetfs_skips_allowed = allowed.toml\naddopts = -rs\n"
    )
    (tmp_path / "allowed.toml").write_text(
        '[[skip]]\ntest = "test_x.py::test_allow*"\nreason = "allowed here"\n'
        f'user = "{user}"\nwhy = "{why}"\n'
    )
    (tmp_path / "test_x.py").write_text(TESTS)
    (tmp_path / "test_module.py").write_text(MODULE_SKIP)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    env.pop("METFS_REQUIRE_SERVERS", None)
    if require:
        env["METFS_REQUIRE_SERVERS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "skip_accounting", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_unlisted_skip_fails_the_run_only_when_required(tmp_path: Path) -> None:
    r = run(tmp_path, "test_x.py", require=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "test_x.py::test_unlisted: nobody said so" in r.stdout, r.stdout
    assert "test_x.py::test_allowed:" not in r.stdout, r.stdout
    assert "FAILED: 1 skip(s) not allowed by allowed.toml" in r.stdout.splitlines()[-1], r.stdout

    r = run(tmp_path, "test_x.py", require=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "would fail under METFS_REQUIRE_SERVERS=1" in r.stdout, r.stdout
    assert "test_x.py::test_unlisted: nobody said so" in r.stdout, r.stdout
    # -rs lists every skip with its reason, the allowed one too.
    assert "SKIPPED [1] test_x.py:8: allowed here" in r.stdout, r.stdout


def test_allowed_skips_and_expected_failures_pass_when_required(tmp_path: Path) -> None:
    r = run(tmp_path, "test_x.py", "-k", "not unlisted", require=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skips: 1, each allowed for" in r.stdout, r.stdout


def test_a_skipped_module_counts(tmp_path: Path) -> None:
    r = run(tmp_path, "test_module.py", "test_x.py", "-k", "not unlisted", require=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "test_module.py: no such server here" in r.stdout, r.stdout


def test_an_ordinary_users_entry_does_not_allow_roots_skip(tmp_path: Path) -> None:
    r = run(tmp_path, "test_x.py", "-k", "not unlisted", require=True, user="ordinary")
    if os.geteuid() == 0:
        assert r.returncode == 1, r.stdout + r.stderr
        assert "test_x.py::test_allowed: allowed here" in r.stdout, r.stdout
    else:
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("why", ["", " "])
def test_an_entry_without_a_why_is_refused(tmp_path: Path, why: str) -> None:
    r = run(tmp_path, "test_x.py", require=False, why=why)
    assert r.returncode == pytest.ExitCode.USAGE_ERROR, r.stdout + r.stderr
    assert "needs test, reason, user (ordinary or any) and a why" in r.stderr, r.stderr
