"""Run a Python snippet in a real child process that SIGKILLs itself at a chosen point.

The point is a file-system call of the child: the ``n``-th ``os.<func>`` call whose target path
matches ``match`` (a regex), ``before`` or ``after`` the call runs. The hook is installed by a
prelude of the child's own script, from the ``CRASH_AT`` environment variable, so no library
code knows about it; the library runs unchanged until the kernel kills the process (no
``finally``, no ``atexit``, no flush: what a power cut or the OOM killer leaves).

Targets: ``fsync`` (the file behind the descriptor), ``replace``/``rename``/``link`` (the
destination), ``unlink`` (the path).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PRELUDE = r'''
import json as _json, os as _os, re as _re, signal as _signal

def _install(spec):
    name, pattern = spec["func"], _re.compile(spec["match"])
    n, when, orig, seen = int(spec["n"]), spec["when"], getattr(_os, name), [0]

    def target(args):
        if name == "fsync":
            fd = args[0] if isinstance(args[0], int) else args[0].fileno()
            return _os.readlink(f"/proc/self/fd/{fd}")
        return _os.fspath(args[1] if name in ("replace", "rename", "link") else args[0])

    def hooked(*args, **kwargs):
        hit = pattern.search(target(args)) is not None
        if hit:
            seen[0] += 1
            if seen[0] == n and when == "before":
                _os.kill(_os.getpid(), _signal.SIGKILL)
        out = orig(*args, **kwargs)
        if hit and seen[0] == n and when == "after":
            _os.kill(_os.getpid(), _signal.SIGKILL)
        return out

    setattr(_os, name, hooked)

if _os.environ.get("CRASH_AT"):
    _install(_json.loads(_os.environ["CRASH_AT"]))

import torch as _torch
_torch.set_num_threads(1)  # as in the parent (tests/conftest.py): identical float results
'''


@dataclass(frozen=True)
class KillAt:
    """SIGKILL at the ``n``-th ``os.<func>`` call on a path matching ``match``."""

    func: str
    match: str
    n: int = 1
    when: str = "before"

    def __str__(self) -> str:
        return f"{self.when}-{self.func}-{self.match}-{self.n}"


def run_child(script: str, kill: KillAt | None = None, timeout: float = 300, **env: str) -> None:
    """Run ``script`` in a fresh interpreter; with ``kill``, assert it died of SIGKILL (so the
    kill point was reached), else that it exited 0."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    child_env = {**os.environ, "PYTHONPATH": path, **env}
    child_env.pop("CRASH_AT", None)
    if kill is not None:
        child_env["CRASH_AT"] = json.dumps(asdict(kill))
    proc = subprocess.run([sys.executable, "-c", PRELUDE + script], env=child_env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    want = -signal.SIGKILL if kill is not None else 0
    assert proc.returncode == want, (
        f"child exited {proc.returncode}, expected {want} (kill point {kill} "
        f"{'never reached' if kill is not None and proc.returncode == 0 else ''})\n"
        f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-4000:]}"
    )
