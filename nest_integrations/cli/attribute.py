"""`nest attribute`: attribute any text (another model's answer, a draft) to a collection.

The passages come from the collection filled by ``nest ingest`` (retrieved with ``--question``,
else with the text); the attributor is ``assembly.attributor_from_defaults``, the same store,
embedder and model cache as ``nest ask``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nest_integrations import assembly
from nest_integrations.cli.common import UsageError, out, store_args

_SCORERS = ("embedding", "keys", "combined", "fuzzy")


def add_attribute_args(p: argparse.ArgumentParser) -> None:
    """Arguments of `nest attribute`."""
    p.description = (
        "Split TEXT into sentences and cite, for each, the passages of a collection that hold "
        "it verbatim or support it, with exact offsets; sentences nothing supports are listed "
        "as unsupported."
    )
    p.add_argument("text", nargs="?", help="the text to attribute (or --file)")
    p.add_argument("--file", metavar="F", help="read the text from F ('-' = stdin)")
    p.add_argument("--question", help="retrieve the passages with this question (default: the "
                   "text itself)")
    store_args(p)
    p.add_argument("--scorer", choices=_SCORERS, default="embedding",
                   help="support scorer (default embedding; keys/combined load the model)")
    p.add_argument("--threshold", type=float, default=None,
                   help="support threshold (default: the scorer's calibrated one)")
    p.add_argument("-k", type=int, default=None, help="passages to retrieve (default 4)")


def _read_text(args: argparse.Namespace) -> str:
    if args.file and args.text:
        raise UsageError("give the text or --file, not both")
    if args.file:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    elif args.text is not None:
        text = args.text
    else:
        raise UsageError("nothing to attribute: give the text or --file F")
    if not text.strip():
        raise UsageError("the text to attribute is empty")
    return text


def cmd_attribute(args: argparse.Namespace) -> int:
    from nest_integrations.attribution import AttributionConfig

    text = _read_text(args)
    fields = {"scorer": args.scorer, "support_threshold": args.threshold}
    if args.k is not None:
        fields["k"] = args.k
    attributor = assembly.attributor_from_defaults(
        args.collection, persist_dir=args.persist_dir, chroma_url=args.chroma_url,
        config=AttributionConfig(**fields),
    )
    result = attributor(text, question=args.question)
    if args.json:
        from nest_integrations.output import attribution_fields

        payload = attribution_fields(result)
        payload["passages"] = [{"passage_id": p.id, "doc_id": p.doc_id,
                                "title": p.metadata.get("title")} for p in result.passages]
        payload.update(scorer=result.scorer, threshold=result.threshold,
                       tokenizer=result.tokenizer)
        out(json.dumps(payload, indent=2, ensure_ascii=False))
        return 0
    _print(result)
    return 0


def _print(result) -> None:  # noqa: ANN001
    titles = {p.id: str(p.metadata.get("title") or p.doc_id) for p in result.passages}
    marks = {"verbatim": "=", "support": "~", "unsupported": "!"}
    for s in result.sentences:
        score = f" {s.score:.2f}" if s.score is not None and s.verdict != "verbatim" else ""
        out(f"[{marks[s.verdict]}] {s.verdict}{score}: {s.text}")
        for c in result.citations:
            if c.start < s.end and c.end > s.start:
                where = (f"{c.source_start}-{c.source_end}" if c.source_start is not None
                         else f"passage {c.passage_start}-{c.passage_end}")
                out(f"      {c.kind} [{titles.get(c.passage_id, c.doc_id)} {where}]: {c.text}")
    n = len(result.sentences)
    out(f"{n - len(result.unsupported)}/{n} sentences supported "
        f"(scorer {result.scorer}, threshold {result.threshold:.2f})")
