"""The CI skip policy (tests/_policy.py, tests/allowed_skips.txt): a skip outside the allowed
list fails a CI run, an allowed one does not, and outside CI nothing changes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests._policy import SkipRule, read_skip_rules

REPO = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, body: str, ci: bool, *args: str) -> subprocess.CompletedProcess:
    """pytest on one test file at the path of the langchain-tests unit suite, under the
    policy (loaded as the real conftest loads it)."""
    tmp_path.mkdir()
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests._policy"]\n')
    f = tmp_path / "tests" / "integrations" / "langchain" / "test_standard_unit.py"
    f.parent.mkdir(parents=True)
    f.write_text(textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # faster start; the policy needs none of them
    if ci:
        env["CI"] = "true"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
           "--rootdir", str(tmp_path), str(f), *args]  # fmt: skip
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


ALLOWED = '''
    import pytest

    class TestChatNestUnit:
        def test_serdes(self):
            pytest.skip("Model is not serializable.")

        def test_ok(self):
            pass
'''
DISALLOWED = ALLOWED + '''
    def test_needs_faiss():
        pytest.importorskip("faiss_not_installed_here")
'''


def test_a_skip_outside_the_list_fails_ci_and_is_named(tmp_path: Path) -> None:
    bad = _run(tmp_path / "bad", DISALLOWED, ci=True)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "1 skip(s) not allowed by tests/allowed_skips.txt" in bad.stdout
    named = "DISALLOWED SKIP tests/integrations/langchain/test_standard_unit.py::test_needs_faiss"
    assert f"{named}: could not import 'faiss_not_installed_here'" in bad.stdout
    assert bad.stdout.count("DISALLOWED SKIP") == 1  # the allowed skip is not listed
    good = _run(tmp_path / "good", ALLOWED, ci=True)
    assert good.returncode == 0 and "DISALLOWED" not in good.stdout, good.stdout
    assert "SKIPPED [1]" in good.stdout and "Model is not serializable." in good.stdout
    local = _run(tmp_path / "local", DISALLOWED, ci=False)  # outside CI: printed, not enforced
    assert local.returncode == 0 and "could not import" in local.stdout, local.stdout
    forced = _run(tmp_path / "forced", DISALLOWED, False, "--strict-skips")
    assert forced.returncode == 1 and "DISALLOWED SKIP" in forced.stdout


def test_the_allowed_list_allows_no_missing_dependency_or_browser() -> None:
    rules = read_skip_rules()
    assert rules  # the file parses
    ids = ["tests/dresd/test_dresd.py", "tests/dresd/test_dresd.py::test_x",
           "tests/server/test_server_page.py::test_playground_streams_highlights_and_shows_exact"
           "_sources",
           "tests/integrations/langchain/test_standard_integration.py::TestChatNestCorpus::test_x"]
    reasons = ["could not import 'faiss': No module named 'faiss'",
               "/usr/bin/chromium not found: apt-get install -y chromium (see .ci/run)",
               "ray[data] is not installed (it is in the test extra)", "selenium is not installed",
               "no default_lm fixture in tests/conftest.py", "Skipped"]
    for nodeid in ids:
        for reason in reasons:
            assert not [r.line for r in rules if r.allows(nodeid, reason)], (nodeid, reason)
    # the standard suites' own skips are allowed, only in those suites
    suite = "tests/integrations/langchain/test_standard_integration.py::TestChatNestCorpus::test_x"
    assert any(r.allows(suite, "Test requires tool calling.") for r in rules)
    assert not any(r.allows("tests/decoding/test_engine.py::test_x", "Test requires tool calling.")
                   for r in rules)


def test_malformed_rules_are_a_usage_error(tmp_path: Path) -> None:
    f = tmp_path / "rules.txt"
    f.write_text("# comment\n\ntests/x.py::* :: ok\\.\n")
    assert read_skip_rules(f) == [SkipRule("tests/x.py::*", __import__("re").compile(r"ok\."), 3)]
    f.write_text("tests/x.py::* no separator\n")
    with pytest.raises(pytest.UsageError, match="rules.txt:1"):
        read_skip_rules(f)
    f.write_text("tests/x.py::* :: (unclosed\n")
    with pytest.raises(pytest.UsageError, match="bad regex"):
        read_skip_rules(f)
