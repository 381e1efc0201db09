"""``NestLLM``: NEST as a LangChain text-completion model (``LLM``), citations in
``generation_info``."""

from __future__ import annotations

from typing import Any, Iterator

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.llms import LLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult
from pydantic import ConfigDict

from nest_integrations import output
from nest_integrations.integrations._common import citation_payload
from nest_integrations.integrations.langchain._engine import NestModelParams
from nest_integrations.types import NestResult


class NestLLM(NestModelParams, LLM):
    """Complete raw text with NEST (no chat template): the natural fit for "continue this".

    Takes the same parameters as ``ChatNest`` (``model``, ``collection``, ``persist_dir``,
    ``chroma_url``, ``retriever``, ``engine``, ``config``, ``decoding``, ``temperature``,
    ``max_tokens``, ``stop``) with the same defaults (``nest_integrations.assembly``: no
    corpus unless one is named); nothing is loaded until the first call.

    Instantiate:
        .. code-block:: python

            from nest_integrations.langchain import NestLLM

            llm = NestLLM(collection="docs", max_tokens=64)

    Invoke:
        .. code-block:: python

            text = llm.invoke("The assert statement")

    Citations:
        .. code-block:: python

            result = llm.generate(["The assert statement"])
            info = result.generations[0][0].generation_info
            info["citations"]        # payload dicts: start_index/end_index, cited_text, extras
            info["nest"]             # NEST statistics (attribution_ratio, ...)
            result.llm_output["token_usage"]

    Stream:
        .. code-block:: python

            for piece in llm.stream("The assert statement"):
                print(piece, end="")

        Each ``GenerationChunk.generation_info["citations"]`` holds the citations completed by
        then (each once); the last chunk also has ``nest``, ``finish_reason`` and
        ``token_usage``.
    """

    model_config = ConfigDict(
        populate_by_name=True,
        arbitrary_types_allowed=True,
        protected_namespaces=(),
        extra="forbid",
    )

    @property
    def _llm_type(self) -> str:
        return "nest"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return self._nest_params()

    def _call(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> str:
        return self._nest_generate(prompt, stop, kwargs).text

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        generations, usages = [], []
        for prompt in prompts:
            result = self._nest_generate(prompt, stop, kwargs)
            generations.append([Generation(text=result.text, generation_info=self._info(result))])
            usages.append(output.usage(result))
        usage = output.add_usage(*usages)
        return LLMResult(
            generations=generations,
            llm_output={"model_name": self.resolved_model_name, "token_usage": usage},
        )

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        tracker = output.CitationStream("completed")
        for item in self._nest_stream(prompt, stop, kwargs):
            if item.result is not None:
                done = tracker.finish(item.result)
                info = {**self._info(item.result),
                        "citations": [citation_payload(c) for c in done]}
                chunk = GenerationChunk(text="", generation_info=info)
            else:
                done = tracker.step(item.citation, item.support)
                info = {"citations": [citation_payload(c) for c in done]} if done else None
                chunk = GenerationChunk(text=item.text, generation_info=info)
            if run_manager is not None:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    def _info(self, result: NestResult) -> dict[str, Any]:
        return {
            "citations": [citation_payload(c) for c in result.citations],
            "finish_reason": result.stats.finish_reason,
            "nest": self.nest_metadata(result),
            "token_usage": output.usage(result),
        }
