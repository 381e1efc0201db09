"""``jsonl.jsonl_values``: the one JSON Lines reader of the eval tasks and the DReSD / KNN-SSD
prompt files (blank lines skipped, line numbers kept, a bad line named in the error)."""

from __future__ import annotations

import pytest

from nest_integrations.builders.dresd_responses import read_prompts as dresd_prompts
from nest_integrations.evaluation.tasks import load_jsonl_task
from nest_integrations.jsonl import jsonl_values
from nest_integrations.knn_ssd.domains import read_prompts as knn_ssd_prompts


def test_values_with_their_line_numbers_past_blank_lines():
    lines = ['{"a": 1}\n', "\n", "   \n", '"text"\n', "[1, 2]"]
    assert list(jsonl_values("f.jsonl", lines)) == [(1, {"a": 1}), (4, "text"), (5, [1, 2])]


def test_a_bad_line_is_named_and_chained():
    with pytest.raises(ValueError, match=r"^f\.jsonl:3: not JSON \(Expecting value\)$") as err:
        list(jsonl_values("f.jsonl", ['{"a": 1}', "", "nope"]))
    assert err.value.__cause__ is not None


@pytest.mark.parametrize("read", [
    dresd_prompts, knn_ssd_prompts, lambda p: load_jsonl_task(p, max_new_tokens=4),
], ids=["dresd", "knn-ssd", "eval-task"])
def test_every_jsonl_reader_reports_the_same_error(tmp_path, read):
    f = tmp_path / "prompts.jsonl"
    f.write_text('{"prompt": "a", "text": "a"}\n\n{broken\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"prompts\.jsonl:3: not JSON \("):
        read(f)
