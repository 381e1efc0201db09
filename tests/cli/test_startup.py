"""Start-up of the ``nest`` command (issue 63): ``import nest_integrations.cli`` and
``nest --help`` load no model library, and a subcommand imports only its own module. Checked
by which modules a fresh process holds, not by timing (``benchmarks/results/startup.md`` has the
seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: What costs seconds to import (issue 63: torch 2.7 s, llama_index.core 2.8 s, chromadb and
#: transformers 1.4 s each on an AVX2 EPYC) or, for numpy, a fifth of a second.
HEAVY = ("torch", "transformers", "chromadb", "llama_index", "llama_cpp", "langchain_core",
         "numpy", "fastapi")

PROBE = """
import json, sys
{body}
print(json.dumps({{"heavy": [m for m in {heavy!r} if m in sys.modules],
                   "cli": sorted(m for m in sys.modules if m.startswith("nest_integrations.cli."))}}))
"""


def _probe(body: str) -> dict:
    code = PROBE.format(body=body, heavy=HEAVY)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_the_cli_loads_no_model_library() -> None:
    got = _probe("import nest_integrations.cli")
    assert got["heavy"] == []
    assert got["cli"] == ["nest_integrations.cli.common"]  # no subcommand module yet


def test_nest_help_loads_no_model_library() -> None:
    got = _probe(
        "import contextlib, io\n"
        "from nest_integrations import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()) as help_text:\n"
        "    try:\n"
        "        cli.main(['--help'])\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 0, exit.code\n"
        "assert all(name in help_text.getvalue() for name in cli.COMMANDS), help_text.getvalue()\n"
        "assert cli.main([]) == 2  # no command: the help on stderr\n"
    )
    assert got["heavy"] == []
    assert got["cli"] == ["nest_integrations.cli.common"]


def test_a_subcommand_imports_its_own_module_only() -> None:
    got = _probe(
        "from nest_integrations import cli\n"
        "args = cli.build_parser(cli._named_command(['-v', 'ask', 'q?'])).parse_args(\n"
        "    ['-v', 'ask', 'q?'])\n"
        "assert args.command == 'ask' and args.question == 'q?' and args.verbose == 1\n"
    )
    assert got["cli"] == ["nest_integrations.cli.ask", "nest_integrations.cli.common"]
    assert "chromadb" not in got["heavy"] and "llama_index" not in got["heavy"]
