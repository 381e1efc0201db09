"""``nest serve``: argument parsing and start-up (registered in ``nest_integrations.cli``)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from nest_integrations import assembly
from nest_integrations.config import PRESETS
from nest_integrations.lm.backend import add_backend_args, apply_backend_args
from nest_integrations.defaults import (
    DEFAULT_COLLECTION,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_PRESET,
)
from nest_integrations.server.protocol import DEFAULT_SERVED_MODEL

LOG = logging.getLogger(__name__)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """Arguments of ``nest serve`` (the parser comes from the CLI registry)."""
    p.description = (
        "Serve NEST over HTTP: POST /v1/chat/completions (streamed or not), /v1/completions, "
        "POST /v1/attributions (any text, e.g. another model's answer), GET /v1/models, /health, "
        "and the playground page at /. Copied spans come back as url_citation annotations with "
        "their source offsets."
    )
    p.add_argument("--collection", default=DEFAULT_COLLECTION,
                   help=f"the Chroma collection served (default: {DEFAULT_COLLECTION}); a "
                   "request may name it in 'collection', any other name gets a 400")
    p.add_argument("--persist-dir", default=None, help="store folder (default: $NEST_HOME/store)")
    p.add_argument("--chroma-url", default=None, help="a Chroma server, e.g. http://localhost:8000")
    p.add_argument("--model", default=None,
                   help="a Hugging Face model id or folder; with --backend llama.cpp a .gguf "
                   "file or a quantisation of the embedded model (Q4_0, Q8_0, ...); default: "
                   "embedded SmolLM2")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: no auth)")
    p.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS),
                   help=f"preset (NestConfig + answer policy) when a request names none "
                   f"(default {DEFAULT_PRESET})")
    p.add_argument("--decoding", default=None,
                   help="decoding method when a request names none (default: the preset's)")
    p.add_argument("--served-model-name", default=DEFAULT_SERVED_MODEL,
                   help="the model id clients send and /v1/models lists "
                   f"(default {DEFAULT_SERVED_MODEL})")
    p.add_argument("--max-queue", type=int, default=8,
                   help="requests that may wait while one generates; more get 429 (default 8)")
    p.add_argument("--max-tokens-cap", type=int, default=1024,
                   help="largest max_tokens accepted (default 1024)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20,
                   help="largest request body accepted (default 1 MiB)")
    add_backend_args(p)


def serve_spec(args: argparse.Namespace) -> assembly.EngineSpec:
    """The engine ``nest serve`` runs for ``args`` (always over the Chroma store)."""
    return assembly.EngineSpec.for_store(
        args.collection,
        persist_dir=args.persist_dir,
        chroma_url=args.chroma_url,
        model=args.model,
        config=args.preset,
        decoding=args.decoding,
        dtype=getattr(args, "dtype", None),
        backend=getattr(args, "backend", None),
    )


def build_engine(args: argparse.Namespace) -> Any:
    """The engine ``nest serve`` runs, from the one assembly every entry point uses (the
    process-wide model cache included)."""
    return assembly.build_engine(serve_spec(args))


def settings_from_args(args: argparse.Namespace) -> Any:
    from nest_integrations.server.app import ServerSettings

    if args.max_queue < 0:
        raise ValueError(f"--max-queue={args.max_queue} is invalid: use an integer >= 0")
    if args.max_tokens_cap < 1 or args.max_body_bytes < 1024:
        raise ValueError("--max-tokens-cap must be >= 1 and --max-body-bytes >= 1024")
    return ServerSettings(
        model_name=args.served_model_name,
        preset=args.preset,
        decoding=args.decoding,
        api_key=args.api_key,
        max_queue=args.max_queue,
        max_tokens_cap=args.max_tokens_cap,
        default_max_tokens=min(DEFAULT_MAX_NEW_TOKENS, args.max_tokens_cap),
        max_body_bytes=args.max_body_bytes,
        collection=args.collection,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    from nest_integrations._optional import require

    uvicorn = require("uvicorn", extra="server")
    from nest_integrations.server.app import create_app

    settings = settings_from_args(args)  # bad options fail before the model loads
    apply_backend_args(args)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        LOG.warning("binding %s without --api-key: anyone who can reach it can use it", args.host)
    app = create_app(build_engine(args), settings)
    sys.stderr.write(
        f"nest serve: http://{args.host}:{args.port}/ (playground), OpenAI API at /v1\n"
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
