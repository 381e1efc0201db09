"""Question sets only the benchmarks read (not shipped in the wheel).

- ``quality_set``: the dev/test quality question set of ``python -m benchmarks.quality`` (three
  sources split by document, an open-ended split);
- ``phrasings``: phrasing families (every question asked several ways) and the wrong-attribute
  metric of ``python -m benchmarks.robust``;
- ``profiles``: a held-out corpus of fictional country profiles and its questions;
- ``faq``: the Python FAQ's questions (human-written, over the Python documentation);
- ``factsheets`` (prose country and product sheets with synonym questions), ``glossary``
  (FOLDOC from Debian's ``dict-foldoc``) and ``answer_sets`` (the families of
  ``python -m benchmarks.answers``: factoid, synonym, definition, explanation; tests:
  ``tests/benchmarks/test_answer_sets.py``);
  ``phrasings``, ``profiles`` and ``faq`` are read by ``python -m benchmarks.robust`` (and
  ``profiles`` by ``python -m benchmarks.completion_gate``).

The loop that runs them through systems is ``benchmarks.harness.qa_dev``. Tests:
``tests/evaluation/test_quality.py``, ``tests/benchmarks/test_phrasings.py``.
"""
