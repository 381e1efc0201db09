"""Token-key encoding on a Ray cluster: ``nest ingest ... --ray [ADDRESS]``.

The passages that have no keys in the ``DiskKeyStore`` yet (deduplicated by content hash) become
a Ray Data dataset; ``map_batches`` runs them through an actor pool of ``KeyEncoder``s, one
model per actor, loaded in the actor from a picklable ``ModelSpec`` (the model folder, dtype,
device, key source and the fingerprint the keys must carry). Actors return plain rows (content
hash, token count, key bytes in the store dtype, int32 token ids and char offsets); the driver
merges them into the normal store with ``put_keys``, which is idempotent, so a batch that Ray
retries after a worker died is harmless. After the run every passage must have keys, else
``RayKeysIncompleteError`` names how many are missing.

Actors ask for one GPU each when the cluster reports GPUs (``device="cuda"``, the weights keep
the driver model's dtype so keys match a CPU build within fp16 rounding), else CPUs (one actor
per CPU unless ``workers`` is given; torch threads = CPUs per actor). Fault tolerance: an actor
that dies is restarted (``max_restarts``) and its batch retried (``max_task_retries``).

Usage::

    # a cluster: `ray start --head --port 6379` on the head, `ray start --address HEAD:6379` on
    # the others (same Python environment with nest-integrations installed on every node)
    nest ingest docs/ --ray 127.0.0.1:6379      # connect to that cluster
    nest ingest docs/ --ray                     # a local Ray instance started in-process

    from nest_integrations.ingest import IngestPipeline
    IngestPipeline(store, lm, ray_address="127.0.0.1:6379").ingest(["docs/"])

    # or directly, on any DiskKeyStore:
    result = encode_keys_on_ray(key_store, lm, passages, address="127.0.0.1:6379")

Needs the ``ray`` extra: ``pip install 'nest-integrations[ray]'``. The model must be loadable
on every node from ``ModelSpec.path`` (the embedded default is converted under
``$NEST_HOME/models``; run ``nest ingest --no-keys`` once on each node, or share that folder).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from nest_integrations.index.base import KeyStoreMismatchError
from nest_integrations.index.keys import check_lm, content_hash, encode_keys, train_codec
from nest_integrations.ingest.ray_session import (  # re-exported; tests patch the session here
    LOCAL_OBJECT_STORE_BYTES,  # noqa: F401
    RayConnectionError,
    _check_reachable,
    _ray_session,
    _require_ray,
)
from nest_integrations.types import Passage, PassageKeys

LOG = logging.getLogger(__name__)

#: Passages per ``map_batches`` batch (a model forward runs on up to this many passages).
RAY_BATCH = 16
#: Restarts of a dead encoding actor, and retries of the batch it held (per actor).
MAX_RESTARTS = 4
MAX_TASK_RETRIES = 4
_MAX_BLOCKS = 4096  # dataset blocks (a block is about two batches)
_CHECK_CHUNK = 512  # passages per get_keys call when listing missing / verifying


class RayKeysError(RuntimeError):
    """Key encoding on Ray could not run or finish (e.g. a model the actors cannot reload)."""


class RayKeysIncompleteError(RayKeysError):
    """After a Ray run some passages still have no keys in the store."""


def check_ray_address(address: str | None) -> None:
    """Fail fast, before anything is written: Ray Data is installed and, for ``HOST:PORT``,
    something listens there (``None``/``"local"``/``"auto"`` are not probed).

    Raises:
        ImportError: ray is not installed. ValueError: a malformed address.
        RayConnectionError: nothing listens at the address.
    """
    _require_ray()
    if address not in (None, "", "local"):
        _check_reachable(address)


@dataclass(frozen=True)
class ModelSpec:
    """How an actor loads the driver's model (picklable; the weights are not shipped).

    Attributes:
        path: local folder (or Hub id in the node's HF cache) for
            ``HFLanguageModel.from_pretrained``.
        name: the model's name (part of its fingerprint).
        key_source: the LM vector the keys are (``NestConfig.key_source``).
        dtype: torch dtype of the weights, e.g. ``"float32"``.
        fingerprint: the driver model's fingerprint; an actor whose model differs refuses to
            encode.
        device: ``"cpu"`` or ``"cuda"``.
        threads: torch intra-op threads of an actor.
    """

    path: str
    name: str
    key_source: str | int
    dtype: str
    fingerprint: str
    device: str = "cpu"
    threads: int = 1

    @classmethod
    def of(cls, lm: Any, **overrides: Any) -> "ModelSpec":
        """The spec of an ``HFLanguageModel`` (the embedded default, or one loaded with
        ``from_pretrained`` from a folder or Hub id)."""
        from nest_integrations.lm.hf import HFLanguageModel
        from nest_integrations.lm.serialized import unwrap

        lm = unwrap(lm)  # assembly.SerializedLM
        if not isinstance(lm, HFLanguageModel):
            raise RayKeysError(
                f"encoding keys on Ray needs an HFLanguageModel (loaded with from_default or "
                f"from_pretrained) that actors can reload by name; got {type(lm).__name__}"
            )
        from nest_integrations.lm.default import DEFAULT_MODEL_NAME

        if lm.name == DEFAULT_MODEL_NAME:
            from nest_integrations.lm.default import default_model_path

            path = str(default_model_path())
        else:
            path = str(lm.name)
        dtype = str(next(lm.model.parameters()).dtype).removeprefix("torch.")
        spec = cls(
            path=path,
            name=str(lm.name),
            key_source=lm.key_source,
            dtype=dtype,
            fingerprint=lm.fingerprint,
        )
        return _replace(spec, **overrides)

    def load(self) -> Any:
        """Load the model (in an actor)."""
        from nest_integrations.lm.hf import HFLanguageModel

        lm = HFLanguageModel.from_pretrained(
            self.path, device=self.device, dtype=self.dtype, key_source=self.key_source
        )
        lm.name = self.name
        return lm


class KeyEncoder:
    """The ``map_batches`` callable class: one model per actor, loaded in ``__init__``.

    Input batch (numpy format): ``hash``, ``id``, ``text``. Output: ``hash``, ``n_tokens``,
    ``keys`` (bytes, ``(n, key_dim)`` in ``dtype``), ``token_ids`` (bytes, int32),
    ``offsets`` (bytes, ``(n, 2)`` int32), ``pid`` (the worker process).
    """

    def __init__(self, spec: ModelSpec, dtype: str = "float16") -> None:
        import torch

        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model is local
        torch.set_num_threads(max(1, spec.threads))
        self.spec = spec
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.lm = spec.load()
        self.fingerprint = self.lm.fingerprint

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.fingerprint != self.spec.fingerprint:
            raise KeyStoreMismatchError(
                f"the model loaded from {self.spec.path} on this Ray node has fingerprint "
                f"{self.fingerprint}, but the driver's model is {self.spec.fingerprint}: "
                "install the same model on every node"
            )
        passages = [Passage(id=str(i), text=str(t)) for i, t in zip(batch["id"], batch["text"])]
        keys = encode_keys(self.lm, passages, self.dtype)
        return {
            "hash": np.asarray([str(h) for h in batch["hash"]], dtype=object),
            "n_tokens": np.asarray([len(k.token_ids) for k in keys], dtype=np.int64),
            "keys": _column([np.ascontiguousarray(k.keys, dtype=self.dtype) for k in keys]),
            "token_ids": _column([np.asarray(k.token_ids, dtype="<i4") for k in keys]),
            "offsets": _column([np.asarray(k.offsets, dtype="<i4") for k in keys]),
            "pid": np.full(len(keys), os.getpid(), dtype=np.int64),
        }


@dataclass
class RayKeysResult:
    """What one ``encode_keys_on_ray`` run did."""

    passages: int = 0  # unique passages (by content) that needed keys
    encoded: int = 0  # of those, newly written by this run
    tokens: int = 0
    workers: int = 0  # actors in the pool (0: nothing to encode, Ray not started)
    worker_pids: set[int] = field(default_factory=set)  # processes that returned batches
    gpus: bool = False
    address: str = ""
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def encode_keys_on_ray(
    store: Any,
    lm: Any,
    passages: Sequence[Passage],
    *,
    address: str | None = None,
    workers: int | None = None,
    batch_size: int = RAY_BATCH,
    progress: bool = False,
) -> RayKeysResult:
    """Encode the keys of ``passages`` missing from ``store`` on Ray; merge them into ``store``.

    Args:
        store: an open ``DiskKeyStore`` for ``lm``.
        lm: the driver's ``HFLanguageModel`` (only its spec and fingerprint are used here).
        passages: passages that must have keys; stored ones (by content) are skipped.
        address: ``None`` or ``"local"``: start a Ray instance in this process; ``"auto"``: the
            cluster this machine belongs to; ``"HOST:PORT"``: that cluster's GCS (``ray start
            --head`` prints it). A Ray session this process already holds is reused.
        workers: actors in the pool (default: one per GPU when the cluster has GPUs, else one
            per CPU).
        batch_size: passages per batch.
        progress: show a tqdm bar of passages merged.

    Raises:
        ImportError: ray is not installed.
        ValueError: a malformed ``address``.
        RayConnectionError: no cluster at ``address``.
        RayKeysIncompleteError: passages still without keys after the run.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is invalid: allowed an integer >= 1")
    if workers is not None and workers < 1:
        raise ValueError(f"workers={workers!r} is invalid: allowed an integer >= 1")
    _require_ray()
    check_lm(store, lm)
    start = time.perf_counter()
    todo = _missing(store, passages)
    result = RayKeysResult(passages=len(todo), address=address or "local")
    if not todo:
        LOG.info("ray keys: every passage already has keys; Ray not started")
        return result
    spec = ModelSpec.of(lm)
    before = len(store)
    if train_codec(store, lm, list(todo.values())):  # int8/pq: trained in the driver, on a sample
        todo = _missing(store, passages)
        if not todo:
            result.encoded = len(store) - before
            result.seconds = time.perf_counter() - start
            return result
    with _ray_session(address) as ray:
        resources = ray.cluster_resources()
        n_gpus, n_cpus = int(resources.get("GPU", 0)), max(1, int(resources.get("CPU", 1)))
        result.gpus = n_gpus > 0
        if result.gpus:
            n = workers or n_gpus
            spec = _replace(spec, device="cuda", threads=1)
            per_actor: dict[str, Any] = {"num_gpus": 1}
        else:
            n = workers or n_cpus
            cpus = max(1, n_cpus // n)
            spec = _replace(spec, threads=cpus)
            per_actor = {"num_cpus": cpus}
        result.workers = n
        LOG.info(
            "ray keys: %d passages on %d %s actor(s) at %s",
            len(todo), n, "GPU" if result.gpus else "CPU", result.address,
        )  # fmt: skip
        rows = [
            {"hash": h, "id": p.id, "text": p.text}
            for h, p in sorted(todo.items(), key=lambda hp: len(hp[1].text))
        ]  # similar lengths side by side: padded batches waste little
        result.tokens = _run(ray, store, spec, rows, todo, n, per_actor, batch_size, progress,
                             result)  # fmt: skip
    _verify(store, passages)
    result.encoded = len(store) - before
    result.seconds = time.perf_counter() - start
    LOG.info(
        "ray keys: %d passages (%d tokens) encoded by %d worker process(es) in %.1f s "
        "(%.0f tokens/s)",
        result.encoded, result.tokens, len(result.worker_pids), result.seconds,
        result.tokens_per_second,
    )  # fmt: skip
    return result


# -- internals -----------------------------------------------------------------------------


def _run(
    ray: Any,
    store: Any,
    spec: ModelSpec,
    rows: list[dict[str, str]],
    todo: dict[str, Passage],
    n: int,
    per_actor: dict[str, Any],
    batch_size: int,
    progress: bool,
    result: RayKeysResult,
) -> int:
    """Run the map_batches pipeline and merge its output into ``store``; returns tokens."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # ours is the one that counts merged passages
    ctx.print_on_execution_start = False
    # Blocks of about two batches, at least two per actor (every actor gets work; the bar
    # moves), at most _MAX_BLOCKS; an actor holds one block running and one queued.
    blocks = min(_MAX_BLOCKS, max(min(len(rows), 2 * n), -(-len(rows) // (2 * batch_size))))
    ds = ray.data.from_items(rows, override_num_blocks=blocks)
    args: dict[str, Any] = dict(
        fn_constructor_kwargs={"spec": spec, "dtype": store.dtype.name},
        batch_size=batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=n, max_tasks_in_flight_per_actor=2),
        **per_actor,
    )
    # Bounded fault tolerance: a dead actor is restarted and its batch retried, a few times
    # (Ray Data's own default retries forever, which never ends on a batch that always kills its
    # worker, e.g. out of memory). Ray 2.60 takes these as (deprecated) remote args only.
    retries = {"max_restarts": MAX_RESTARTS, "max_task_retries": MAX_TASK_RETRIES}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        try:
            encoded = ds.map_batches(KeyEncoder, **args, **retries)
        except TypeError:  # a Ray that no longer takes them: its defaults (retry forever) apply
            encoded = ds.map_batches(KeyEncoder, **args)
    quiet = logging.getLogger("ray.data")  # its INFO/WARNING lines duplicate our bar and log
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return _merge(encoded, store, todo, len(rows), progress, result)
    finally:
        quiet.setLevel(level)


def _merge(
    encoded: Any,
    store: Any,
    todo: dict[str, Passage],
    total: int,
    progress: bool,
    result: RayKeysResult,
) -> int:
    """Stream the actors' rows into ``store`` (``put_keys`` per batch); returns tokens."""
    from tqdm.auto import tqdm

    tokens = 0
    dtype, key_dim = store.dtype, store.key_dim
    with tqdm(total=total, desc="token keys (ray)", unit="passage", disable=not progress) as bar:
        for batch in encoded.iter_batches(batch_size=None, batch_format="numpy"):
            ps, ks = [], []
            for i, h in enumerate(batch["hash"]):
                p = todo[str(h)]
                m = int(batch["n_tokens"][i])
                ks.append(
                    PassageKeys(
                        passage_id=p.id,
                        keys=np.frombuffer(batch["keys"][i], dtype=dtype).reshape(m, key_dim),
                        token_ids=np.frombuffer(batch["token_ids"][i], dtype="<i4").astype(
                            np.int64
                        ),
                        offsets=np.frombuffer(batch["offsets"][i], dtype="<i4").reshape(m, 2),
                    )
                )
                ps.append(p)
                tokens += m
            store.put_keys(ps, ks)  # idempotent: a retried batch adds nothing twice
            result.worker_pids.update(int(x) for x in batch["pid"])
            bar.update(len(ps))
    return tokens


def _missing(store: Any, passages: Sequence[Passage]) -> dict[str, Passage]:
    """content hash -> passage, for the passages without stored keys (first of each text)."""
    unique: dict[str, Passage] = {}
    for p in passages:
        unique.setdefault(content_hash(p.text), p)
    if callable(getattr(store, "stored_hashes", None)):  # an index query, no key reads
        present = store.stored_hashes(list(unique))
        return {h: p for h, p in unique.items() if h not in present}
    items = list(unique.items())
    todo: dict[str, Passage] = {}
    for i in range(0, len(items), _CHECK_CHUNK):
        part = items[i : i + _CHECK_CHUNK]
        for (h, p), k in zip(part, store.get_keys([p for _, p in part])):
            if k is None:
                todo[h] = p
    return todo


def _verify(store: Any, passages: Sequence[Passage]) -> None:
    missing = _missing(store, passages)
    if missing:
        total = len({p.text for p in passages})
        raise RayKeysIncompleteError(
            f"after the Ray run {len(missing)} of {total} passages still have no token keys in "
            f"{store.path} (e.g. passage {next(iter(missing.values())).id!r}); re-run the same "
            "`nest ingest` command (stored keys are kept) or run it without --ray"
        )


def _column(arrays: list[np.ndarray]) -> np.ndarray:
    out = np.empty(len(arrays), dtype=object)
    for i, a in enumerate(arrays):
        out[i] = a.tobytes()
    return out


def _replace(spec: ModelSpec, **changes: Any) -> ModelSpec:
    import dataclasses

    return dataclasses.replace(spec, **changes) if changes else spec


__all__ = [
    "KeyEncoder",
    "ModelSpec",
    "RayConnectionError",
    "RayKeysError",
    "RayKeysIncompleteError",
    "RayKeysResult",
    "check_ray_address",
    "encode_keys_on_ray",
]
