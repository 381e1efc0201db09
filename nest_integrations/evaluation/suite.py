"""End-to-end evaluation: model + datastore + tasks -> ``run_eval`` -> files.

Two datastores:

- **Wikipedia leads** (default): the train split of corpus B is the datastore; tasks are
  in-corpus completion, held-out completion and "What is X?" QA.
- **A corpus folder + a JSONL task file**: any files ``nest ingest`` reads, and one task.

Usage::

    from nest_integrations.evaluation.suite import evaluate
    from nest_integrations.evaluation.runner import SETTINGS

    run, paths = evaluate(SETTINGS["small"], "benchmarks/results")
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

from nest_integrations.evaluation.runner import EvalRun, EvalSettings, machine_info, run_eval
from nest_integrations.evaluation.tasks import Task

LOG = logging.getLogger(__name__)


def eval_home() -> Path:
    """``$NEST_HOME/eval``: cached embeddings and the evaluation key store."""
    from nest_integrations.paths import nest_home

    return nest_home() / "eval"


def wiki_setup(
    lm: Any, settings: EvalSettings, *, wheel: str | None = None, progress: bool = True
) -> tuple[list[Task], list[Any], dict[str, Any]]:
    """Tasks, datastore passages (train split) and corpus provenance for corpus B."""
    from nest_integrations.evaluation.corpora import lead_passages, load_wiki_leads, split_of
    from nest_integrations.evaluation.tasks import completion_task, qa_task

    leads, prov = load_wiki_leads(wheel)
    all_leads = list(leads.values())
    train = [lead for lead in all_leads if split_of(lead.title) == "train"]
    test = [lead for lead in all_leads if split_of(lead.title) == "test"]
    passages = lead_passages(train, progress=progress)
    kw = {"prefix_tokens": settings.prefix_tokens, "reference_tokens": settings.reference_tokens}
    split = "sha1(title) % 100 split: {}".format
    tasks = [
        completion_task(
            lm, train, in_corpus=True, n=settings.n_completion, pool=split("train"), **kw
        ),
        completion_task(
            lm, test, in_corpus=False, n=settings.n_completion, pool=split("test"), **kw
        ),
        qa_task(
            train, n=settings.n_qa, max_new_tokens=settings.qa_max_new_tokens, pool=split("train")
        ),
    ]
    description = (
        f"Wikipedia leads ({prov['requirement']}), datastore = train split "
        f"({len(train)} leads, {len(passages)} passages)"
    )
    if settings.n_entity_qa > 0:
        task, extra = entity_setup(settings)
        tasks.append(task)
        passages = passages + extra
        description += (
            f" + the generated entity corpus (seed {settings.entity_seed}, {len(extra)} "
            "documents)"
        )
    tasks = [t for t in tasks if t.examples]
    prov = {**prov, "description": description, "datastore_passages": len(passages)}
    return tasks, passages, prov


def entity_setup(settings: EvalSettings) -> tuple[Task, list[Any]]:
    """The entity-QA task and the entity corpus's passages (one per document)."""
    from nest_integrations.evaluation.entities import generate_corpus
    from nest_integrations.evaluation.tasks import entity_qa_task
    from nest_integrations.ingest import default_token_counter, load_documents, split_documents

    corpus = generate_corpus(settings.entity_seed)
    questions = corpus.sample_questions(settings.n_entity_qa, seed=settings.entity_seed)
    task = entity_qa_task(
        questions, max_new_tokens=settings.qa_max_new_tokens, seed=settings.entity_seed
    )
    docs, issues = load_documents(
        texts=[d.text for d in corpus.documents],
        ids=[d.id for d in corpus.documents],
        metadatas=[{"title": d.name, "kind": d.kind} for d in corpus.documents],
    )
    for issue in issues:
        LOG.warning("entity corpus: %s", issue)
    return task, split_documents(docs, default_token_counter())


def custom_setup(
    corpus: Sequence[str | os.PathLike[str]],
    tasks_file: str | os.PathLike[str],
    settings: EvalSettings,
    *,
    jsonl_format: str = "chat",
    progress: bool = True,
) -> tuple[list[Task], list[Any], dict[str, Any]]:
    """A corpus folder (or files) as the datastore and one JSONL task."""
    from nest_integrations.evaluation.corpora import folder_passages
    from nest_integrations.evaluation.tasks import load_jsonl_task

    task = load_jsonl_task(
        tasks_file,
        max_new_tokens=settings.jsonl_max_new_tokens,
        default_format=jsonl_format,
        name=Path(tasks_file).stem,
    )
    passages = folder_passages(corpus, progress=progress)
    prov = {
        "description": f"{', '.join(str(c) for c in corpus)} ({len(passages)} passages)",
        "paths": [str(c) for c in corpus],
        "tasks_file": str(tasks_file),
        "datastore_passages": len(passages),
    }
    return [task], passages, prov


def evaluate(
    settings: EvalSettings,
    out_dir: str | os.PathLike[str],
    *,
    lm: Any = None,
    corpus: Sequence[str | os.PathLike[str]] | None = None,
    tasks_file: str | os.PathLike[str] | None = None,
    jsonl_format: str = "chat",
    wheel: str | None = None,
    device: str | None = None,
    progress: bool = True,
    plots: bool = True,
    key_dir: str | os.PathLike[str] | None = None,
) -> tuple[EvalRun, list[Path]]:
    """Run one evaluation configuration and write its outputs into ``out_dir``.

    ``lm`` defaults to the embedded SmolLM2-135M-Instruct; token keys are cached in
    ``key_dir`` (default ``$NEST_HOME/eval/keys``).
    """
    from nest_integrations import assembly
    from nest_integrations.evaluation.report import write_outputs
    from nest_integrations.evaluation.retrieval import build_retriever
    from nest_integrations.index.store import DiskKeyStore

    start = time.perf_counter()
    machine_start = machine_info()
    # The paper-style harness reproduces the paper: its policy has no title match and no
    # guards, and every span of ``min_citation_tokens`` tokens counts as a citation.
    spec = assembly.EngineSpec(config=settings.nest_config(), policy="paper",
                               device=device).resolved()
    if lm is None:
        lm = assembly.shared_model(None, device, spec.config.key_source)
    if tasks_file is not None:
        if not corpus:
            raise ValueError("a JSONL task file needs a corpus (folder or files) as the datastore")
        tasks, passages, corpus_prov = custom_setup(
            corpus, tasks_file, settings, jsonl_format=jsonl_format, progress=progress
        )
    else:
        tasks, passages, corpus_prov = wiki_setup(lm, settings, wheel=wheel, progress=progress)
    retriever = build_retriever(passages, settings.retriever, eval_home() / "embeddings")
    LOG.info("building the %s retriever over %d passages", settings.retriever, len(passages))
    retriever.retrieve(tasks[0].examples[0].retrieval_query, 1)  # builds lazy indexes untimed
    store = DiskKeyStore.open(
        Path(key_dir) if key_dir else eval_home() / "keys", lm, allow_new_namespace=True
    )
    # Stage 1 runs in the harness (per system); the engine gets the passages it retrieved.
    engine = assembly.build_engine(spec, lm=lm, key_store=store)
    calibration = cal = None
    try:
        if "nest-cal" in settings.systems:  # `nest calibrate` on this datastore
            from nest_integrations.calibrate import calibrate_passages

            cfg = settings.nest_config()
            cal = calibrate_passages(
                lm, store, retriever, passages, n_texts=settings.calibration_texts,
                n_passages=settings.n_passages, n_neighbors=cfg.n_neighbors,
                default=cfg.to_dict(), progress=progress,
            )
            calibration = cal["overrides"]
        run = run_eval(
            engine, tasks, settings, retriever, progress=progress, calibration=calibration
        )
    finally:
        store.close()
    run.provenance = {
        "model": lm.name,
        "model_fingerprint": lm.fingerprint,
        "corpus": corpus_prov,
        "machine_start": machine_start,
        "machine_end": machine_info(),
        "wall_s": time.perf_counter() - start,
    }
    if calibration is not None:
        run.provenance["calibration"] = {
            k: cal[k] for k in ("overrides", "suggested", "ppl", "feasible", "n_tokens", "split")
        }
    paths = write_outputs(run, out_dir, plots=plots)
    LOG.info("evaluation %s done in %.0f s: %s", settings.name, run.provenance["wall_s"], paths)
    return run, paths


__all__ = ["custom_setup", "entity_setup", "eval_home", "evaluate", "wiki_setup"]
