"""The answers behind ``answer_metrics.LEAD_THRESHOLD``, each checked by hand."""

#: family, the answer's opening, the gold sentence, and whether a reader would say the answer
#: opens with the definition or lead.
EXAMPLES: list[dict] = []
