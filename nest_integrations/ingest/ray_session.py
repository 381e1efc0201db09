"""The Ray session of ``ingest.ray_keys``: Ray Data present, the address reachable, connect to
(or start) Ray and disconnect afterwards. Re-exported from ``ingest.ray_keys``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from typing import Any, Iterator

LOG = logging.getLogger(__name__)

#: Object store of an in-process local instance (bytes); key rows are small and streamed.
LOCAL_OBJECT_STORE_BYTES = 500 * 1024 * 1024


class RayConnectionError(ConnectionError):
    """No Ray cluster answers at the given address."""


def _require_ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "encoding token keys on Ray (--ray) needs Ray Data: "
            "pip install 'nest-integrations[ray]' (or pip install 'ray[data]>=2.40')"
        ) from exc
    return ray


@contextlib.contextmanager
def _ray_session(address: str | None) -> Iterator[Any]:
    """Connect to (or start) Ray; disconnect afterwards unless the session was already open."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    common: dict[str, Any] = {
        "logging_level": logging.WARNING,
        "log_to_driver": False,
        "include_dashboard": False,
    }
    if address in (None, "", "local"):
        LOG.info("ray keys: starting a local Ray instance")
        ray.init(address="local", object_store_memory=LOCAL_OBJECT_STORE_BYTES, **common)
    else:
        _check_reachable(address)
        try:
            ray.init(address=address, **common)
        except (ConnectionError, RuntimeError, TimeoutError) as exc:
            hint = (
                "Start one with `ray start --head --port 6379` and pass --ray HOST:6379"
            )
            if _auth_failure(exc):
                hint = (
                    "The cluster requires token authentication: set RAY_AUTH_MODE=token and "
                    "its token (RAY_AUTH_TOKEN, or the file ~/.ray/auth_token); Ray enables "
                    "tokens only for clusters it finds itself, not for an explicit address"
                )
            raise RayConnectionError(
                f"could not connect to a Ray cluster at {address!r}: {exc}. {hint}"
            ) from exc
    try:
        yield ray
    finally:
        ray.shutdown()


def _auth_failure(exc: BaseException | None) -> bool:
    """Whether a Ray connection error was caused by a missing or wrong auth token."""
    while exc is not None:
        if type(exc).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _check_reachable(address: str, timeout: float = 3.0) -> None:
    """Fail fast (instead of Ray's long retry loop) when nothing listens at HOST:PORT."""
    if address == "auto" or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(
            f"Ray address {address!r} is invalid: allowed HOST:PORT (e.g. 127.0.0.1:6379), "
            "'auto', or nothing for a local instance"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise RayConnectionError(
            f"no Ray cluster at {address}: {exc}. Start one with `ray start --head --port "
            f"{port}` (then pass --ray {address}), or use --ray without an address for a "
            "local instance"
        ) from exc
