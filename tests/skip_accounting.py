"""Skip accounting, a pytest plugin (the root conftest.py loads it for every run from the
repository's root, so for `tests` and `bindings/python/tests` alike).

Every skip is listed with its reason at the end of the run (pytest.ini adds `-rs`). Under
``METFS_REQUIRE_SERVERS=1``, which scripts/test.sh sets, a skip that the allowlist does not allow
fails the run: a test that stops running because a server, a package, a user or a device went
missing cannot pass unseen. The allowlist is ``tests/skips-allowed.toml`` (the ini option
``metfs_skips_allowed`` names another, relative to the root): each entry a node id pattern, the
exact reason, who may skip it and why that is fine.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from _pytest.terminal import TerminalReporter

DEFAULT = "tests/skips-allowed.toml"


def required() -> bool:
    return os.environ.get("METFS_REQUIRE_SERVERS", "0") not in ("", "0")


@dataclass
class Allowed:
    test: str
    reason: str
    user: str
    why: str
    pattern: re.Pattern[str] = field(init=False)

    def __post_init__(self) -> None:
        # `*` matches any run of characters; everything else, brackets included, is literal.
        self.pattern = re.compile(".*".join(re.escape(p) for p in self.test.split("*")))

    def allows(self, nodeid: str, reason: str, root: bool) -> bool:
        if self.user == "ordinary" and root:
            return False
        return reason == self.reason and self.pattern.fullmatch(nodeid) is not None


def load(path: Path) -> list[Allowed]:
    with open(path, "rb") as f:
        data = tomllib.load(f)
    out = []
    for i, e in enumerate(data.get("skip", [])):
        missing = {"test", "reason", "user", "why"} - e.keys()
        if missing or e["user"] not in ("ordinary", "any") or not e["why"].strip():
            raise pytest.UsageError(
                f"{path}: entry {i + 1} needs test, reason, user (ordinary or any) and a why: {e}"
            )
        out.append(Allowed(e["test"], e["reason"], e["user"], e["why"]))
    return out


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason as pytest reports it (-rs): `Skipped: ` taken off the message."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        msg = str(longrepr[2])
    else:
        msg = str(longrepr)
    return msg[len("Skipped: ") :] if msg.startswith("Skipped: ") else msg


class SkipAccounting:
    def __init__(self, config: pytest.Config) -> None:
        name = config.getini("metfs_skips_allowed") or DEFAULT
        self.path = config.rootpath / name
        self.allowed = load(self.path)
        self.root = os.geteuid() == 0
        self.skips: list[tuple[str, str]] = []

    def record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        # An expected failure is reported as skipped too; it is not a skip.
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips.append((report.nodeid, skip_reason(report)))

    def unlisted(self) -> list[tuple[str, str]]:
        return [
            (nodeid, reason)
            for nodeid, reason in self.skips
            if not any(a.allows(nodeid, reason, self.root) for a in self.allowed)
        ]

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.record(report)

    @pytest.hookimpl
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self.record(report)

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if required() and self.unlisted() and session.exitstatus in (0, 5):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: TerminalReporter) -> None:
        bad = self.unlisted()
        if not self.skips:
            return
        tr = terminalreporter
        allowed = len(self.skips) - len(bad)
        who = "root" if self.root else "an ordinary user"
        rel = os.path.relpath(self.path, tr.config.rootpath)
        if not bad:
            tr.write_line(f"skips: {allowed}, each allowed for {who} by {rel}")
            return
        verdict = (
            "fails the run (METFS_REQUIRE_SERVERS is set)"
            if required()
            else "would fail under METFS_REQUIRE_SERVERS=1"
        )
        tr.section(f"skips not allowed by {rel}: {verdict}", sep="=", red=required())
        for nodeid, reason in bad:
            tr.write_line(f"{nodeid}: {reason}")
        tr.write_line(
            f"{len(bad)} skip(s) not allowed for {who}, {allowed} allowed; make the test run, "
            f"or add an entry with its reason and why to {rel}"
        )

    @pytest.hookimpl
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        # Once more after pytest's last line ("N passed, M skipped"), which a CI log's tail shows.
        bad = self.unlisted()
        tr = config.pluginmanager.getplugin("terminalreporter")
        if required() and bad and tr is not None:
            tr.write_line(
                f"FAILED: {len(bad)} skip(s) not allowed by {os.path.relpath(self.path)} "
                "(listed above; METFS_REQUIRE_SERVERS is set)",
                red=True,
                bold=True,
            )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "metfs_skips_allowed",
        f"the allowlist of skips, relative to the root (default {DEFAULT})",
        default="",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipAccounting(config), "metfs-skip-accounting")
