"""The answer policy: above the paper's algorithm, what a request retrieves, which passages go in
its prompt, which method decodes it and which output guards apply (``answer.py``).

Usage::

    from nest_integrations.policy import POLICIES, plan_answer

    policy = POLICIES["grounded"]             # the default: evidence first, title index
    plan = plan_answer(policy, question, passages, retriever, n_ra=3, decoding=None)
    plan.method, plan.passages, plan.prompt_passages, plan.guards, plan.evidence
"""

from nest_integrations.policy.answer import POLICIES, AnswerPlan, AnswerPolicy, plan_answer

__all__ = ["POLICIES", "AnswerPlan", "AnswerPolicy", "plan_answer"]
