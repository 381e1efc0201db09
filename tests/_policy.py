"""Suite-wide policy (loaded by ``tests/conftest.py``): skips, timeouts, seeds, Hypothesis.

Skips. Every skip reason is printed (``-rfEsx`` in pyproject's ``addopts``). In CI (``CI`` set
to a true value, as ``.ci/run`` does) or with ``--strict-skips``, a test that skips for a reason
that matches no rule of ``tests/allowed_skips.txt`` makes the run fail (exit status 1) and is
listed at the end. The rules allow only the skips of the framework standard suites
(langchain-tests) for features the adapters do not declare, and GPU-only tests; a missing
required dependency, a missing test extra or a missing browser is never allowed.

Timeouts. pyproject sets a global ``timeout`` (the slow real-model tests, fixtures included);
tests outside the slow set get the tighter ``QUICK_TIMEOUT`` unless they carry their own
``@pytest.mark.timeout``.

Randomness. Before each test the global RNGs (``random``, NumPy's legacy one, torch) are seeded
with a constant, so a test that draws from them gets the same values in any order. Hypothesis
never writes its example database into the tree, and in CI it is derandomized (the same
examples on every run); its caches live in the temp dir, not in the tree.
"""

from __future__ import annotations

import fnmatch
import os
import random
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis.configuration import set_hypothesis_home_dir

ALLOWED_SKIPS = Path(__file__).with_name("allowed_skips.txt")
QUICK_TIMEOUT = 180  # s; the slowest quick test takes about 20 s on 2 loaded cores
_TRUE = {"1", "true", "yes", "on"}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in _TRUE


# ----------------------------------------------------------------------------- Hypothesis

# Its caches (./.hypothesis by default) go to the temp dir, never into the tree.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "nest-tests-hypothesis")
hypothesis_settings.register_profile("nest", database=None)
hypothesis_settings.register_profile("nest-ci", database=None, derandomize=True, print_blob=True)
hypothesis_settings.load_profile("nest-ci" if in_ci() else "nest")


# ----------------------------------------------------------------------------- skip rules


@dataclass(frozen=True)
class SkipRule:
    """``NODEID_GLOB :: REASON_REGEX``: a skip is allowed when its test id matches the glob
    (``fnmatch``) and its reason matches the regex (``re.fullmatch``)."""

    nodeid: str
    reason: re.Pattern[str]
    line: int

    def allows(self, nodeid: str, reason: str) -> bool:
        return fnmatch.fnmatchcase(nodeid, self.nodeid) and bool(self.reason.fullmatch(reason))


def read_skip_rules(path: Path = ALLOWED_SKIPS) -> list[SkipRule]:
    """The rules of ``path`` (``#`` starts a comment). A malformed line is a usage error."""
    rules = []
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        glob, sep, rx = (part.strip() for part in line.partition(" :: "))
        if not sep or not glob or not rx:
            raise pytest.UsageError(f"{path}:{n}: expected 'NODEID_GLOB :: REASON_REGEX': {raw!r}")
        try:
            rules.append(SkipRule(glob, re.compile(rx), n))
        except re.error as e:
            raise pytest.UsageError(f"{path}:{n}: bad regex {rx!r}: {e}") from None
    return rules


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason given to ``pytest.skip`` / ``importorskip`` / a skip mark."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--strict-skips", action="store_true", default=False,
        help="fail the run when a test skips for a reason not in tests/allowed_skips.txt "
             "(always on when CI is set)",
    )  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--strict-skips") or in_ci():
        config.pluginmanager.register(SkipPolicy(read_skip_rules()), "nest-skip-policy")


class SkipPolicy:
    """Records every skip; at the end fails the session on those no rule allows."""

    def __init__(self, rules: list[SkipRule]) -> None:
        self.rules = rules  # read at start: a malformed list fails before any test runs
        self.skips: list[tuple[str, str]] = []
        self.bad: list[tuple[str, str]] = []

    def _record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips.append((report.nodeid, skip_reason(report)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)  # a module-level skip (the whole file) is a collection skip

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.bad = [(n, r) for n, r in self.skips
                    if not any(rule.allows(n, r) for rule in self.rules)]  # fmt: skip
        if self.bad and session.exitstatus in (pytest.ExitCode.OK,
                                               pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.bad:
            return
        terminalreporter.section(
            f"{len(self.bad)} skip(s) not allowed by tests/allowed_skips.txt: the run fails",
            red=True,
        )
        for nodeid, reason in self.bad:
            terminalreporter.line(f"DISALLOWED SKIP {nodeid}: {reason}", red=True)


# ----------------------------------------------------------------------------- timeouts, seeds


#: File order for the two pytest-xdist workers of scripts/test.sh (``--dist loadfile
#: --no-loadscope-reorder``: one file per worker at a time, in this order). The longest files
#: start first, so none is left running alone at the end: the README's (it makes the session's
#: sample store, about 3 min, then runs every README block), the real-model oracles. The other
#: users of the sample store go last, when it is there (tests/conftest.py ``sample_store``).
FIRST_FILES = ("test_readme.py", "test_lossless_oracles.py", "test_knn_ssd_real.py",
               "test_model.py", "test_ray_ingest.py", "test_key_codecs.py")
LAST_FILES = ("test_outputs_baseline.py", "test_sample_questions.py", "test_edges_cited.py")


def _file_rank(item: pytest.Item) -> int:
    name = item.path.name
    if name in FIRST_FILES:
        return FIRST_FILES.index(name)
    return len(FIRST_FILES) + 1 + LAST_FILES.index(name) if name in LAST_FILES else len(FIRST_FILES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_file_rank)  # stable: test order kept within each file
    for item in items:
        if item.get_closest_marker("slow") is None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(QUICK_TIMEOUT))


@pytest.fixture(autouse=True)
def _seed_global_rngs() -> None:
    """Seed the global RNGs before every test: values never depend on test order."""
    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
