"""The environment of a benchmark run and its record: the command as typed, the machine, the
load at start and end, the commit, the date and the wall time."""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"


def setup() -> None:
    """Defaults every benchmark runs with: ``$NEST_HOME`` the repo's ``.nest`` (where the tests
    and ``scripts/install.sh`` put the converted model), the Hugging Face Hub offline, Chroma's
    telemetry off. Values already set win."""
    os.environ.setdefault("NEST_HOME", str(REPO / ".nest"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")


def cpu_model() -> str:
    """``lscpu``'s model name (else what the cost model names the machine by)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.strip().lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    from nest_integrations.lm.cost import machine_name

    return machine_name()


def commit() -> str:
    """The checkout's short commit, ``+dirty`` when tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {"cpu": cpu_model(), "cpus": os.cpu_count(),
                            "python": platform.python_version()}
    try:
        import torch

        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
        from nest_integrations.lm import backend

        info["native_bf16"] = backend.cpu_has_native_bf16()
    except ImportError:
        pass
    return info


def model_mappings(suffix: str = ".gguf") -> list[dict[str, Any]]:
    """The memory maps of model files (``suffix``) in this process, from ``/proc/self/smaps``:
    file name, mapped kB, and kB mapped through 2 MB pages (``FilePmdMapped``; empty where the
    kernel does not say). Two models that map the same file can differ here, and a model whose
    weights sit in 4 kB pages pays TLB misses on every step: a run-to-run shift of several
    percent between two rows of one run that no interleaving evens out."""
    out: list[dict[str, Any]] = []
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return out
    cur: dict[str, Any] | None = None
    for line in text.splitlines():
        head = line.split(None, 5)
        if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:  # a mapping's first line
            name = head[5] if len(head) == 6 else ""
            cur = {"file": Path(name).name, "kb": 0, "pmd_kb": 0} if name.endswith(suffix) \
                else None
            if cur is not None:
                out.append(cur)
        elif cur is not None and line.startswith(("Size:", "FilePmdMapped:")):
            cur["kb" if line.startswith("Size:") else "pmd_kb"] = int(line.split()[1])
    return out


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class Run:
    """One run's record, started when the benchmark starts and finished when it writes."""

    command: str
    when: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    load_start: list[float] = field(default_factory=load)
    commit: str = field(default_factory=commit)
    started: float = field(default_factory=time.perf_counter)
    record: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, module: str, argv: Sequence[str]) -> Run:
        """The run of ``python -m <module> <argv>`` (``NEST_THREADS=`` in front when set)."""
        return cls(command_line(module, argv, os.environ.get("NEST_THREADS")))

    def finish(self) -> dict[str, Any]:
        """The record: command, date, machine, load at start and end, commit, wall seconds."""
        if not self.record:
            self.record = {
                "command": self.command, "when": self.when, "machine": machine(),
                "load_start": self.load_start, "load_end": load(), "commit": self.commit,
                "wall_s": round(time.perf_counter() - self.started, 1),
            }
            maps = model_mappings()
            if maps:
                self.record["model_mappings"] = maps
        return self.record


def command_line(module: str, argv: Sequence[str], threads_env: str | None = None) -> str:
    """The command as typed: ``[NEST_THREADS=n ]python -m <module> <args>``."""
    env = f"NEST_THREADS={shlex.quote(threads_env)} " if threads_env else ""
    return env + f"python -m {module}" + "".join(" " + shlex.quote(a) for a in argv)


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The argument parser of ``python -m <module>``: its docstring's first line as the
    description, and ``--out`` (the results folder, default ``benchmarks/results``)."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}",
                                 description=(doc or "").strip().split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    return ap


def question_parser(module: str, doc: str | None, *, sets: str, sets_help: str,
                    n_closed: int, n_open: int, stem: str) -> argparse.ArgumentParser:
    """``parser`` with the options of a benchmark over question sets (``benchmarks.robust``,
    ``benchmarks.evidence``): ``--split`` (dev or test), ``--sets`` (comma-separated, default
    ``sets``), questions per set (``--n-closed``, ``--n-open``), ``--seed``, ``--work`` (the
    stores' folder) and ``--stem`` (the results' file name); read the sets with
    ``question_sets``."""
    ap = parser(module, doc)
    ap.add_argument("--split", default="dev", choices=("dev", "test"))
    ap.add_argument("--sets", default=sets, help=sets_help)
    ap.add_argument("--n-closed", type=int, default=n_closed, help="closed questions per set")
    ap.add_argument("--n-open", type=int, default=n_open, help="open-ended prompts per set")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None, help="the stores' folder")
    ap.add_argument("--stem", default=stem, help="the results' file name")
    return ap


def question_sets(ap: argparse.ArgumentParser, args: argparse.Namespace,
                  held_out: Sequence[str]) -> list[str]:
    """The sets ``args.sets`` names (a ``question_parser``'s); a ``held_out`` set on the dev
    split is an error (``ap.error``: they are asked on test only)."""
    sets = [s for s in args.sets.split(",") if s]
    if args.split == "dev" and any(s in held_out for s in sets):
        ap.error(f"the {', '.join(held_out)} sets are held out: --split test only")
    return sets


def start(ap: argparse.ArgumentParser, argv: Sequence[str] | None = None
          ) -> tuple[argparse.Namespace, Run]:
    """Parse ``argv`` (default: the command line), set the environment (``setup``) and start
    the run record."""
    import sys

    args_list = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(args_list)
    setup()
    return args, Run.start(ap.prog.removeprefix("python -m "), args_list)
