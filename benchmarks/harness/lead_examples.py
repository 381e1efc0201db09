"""The answers behind ``answer_metrics.LEAD_THRESHOLD``, each checked by hand (issue 60).

``EXAMPLES``: 10 real answers, 9 from the first dev runs of ``python -m benchmarks.answers``
(``rag`` and ``default`` at 7a39c92; that run's records are replaced since) and one quoted in issue 60,
labelled by reading them: does the answer open with the entry's definition or the topic's lead
(a paraphrase counts, a second sense, usage note, example or heading does not)? On them the
"not the lead" answers score at most 0.23 and the "lead" ones at least 0.50.

``NEAR_MISSES``: side sentences and headings of the short pydoc leads, which share the
statement's name with the lead and score up to 0.37 (so the threshold sits above them): 0.5
separates every case here, and ``tests/benchmarks/test_answer_metrics.py`` checks that it does.
"""

_FOR = ('The "for" statement is used to iterate over the elements of a sequence (such as a '
        "string, tuple or list) or other iterable object:")
_NONLOCAL = ('The "nonlocal" statement causes the listed identifiers to refer to previously '
             "bound variables in the nearest enclosing scope excluding globals.")
_INTERLACING = ('A video display system which builds an image on the VDU in two phases, known '
                'as "fields", consisting of even and odd horizontal lines.')
_DUPLEX = ("Used to describe a communications channel that can carry signals in both "
           "directions, in contrast to a simplex channel which only ever carries a signal in "
           "one direction.")
_INTERRUPT = ("An interrupt caused by a specific machine language operation code (e.g. the "
              "Motorola 68000's TRAP, the IBM System/390's SVC or the ARM's SWI) rather than by "
              "a hardware event.")
_PRIORITY = ("A data structure with three operations: insert a new item, return the highest "
             "priority item, and remove the highest priority item.")

#: family, the answer's opening, the gold sentence, and whether a reader would say the answer
#: opens with the definition or lead.
EXAMPLES: list[dict] = [
    {"family": "definition", "lead": True, "gold": _INTERLACING,
     "answer": 'Interlacing is a video display system that builds an image on the VDU in two '
               'phases, known as "fields", consisting of even and odd horizontal lines.'},
    {"family": "definition", "lead": True,
     "gold": "The operator that returns the remainder after integer division of its first "
             "argument by its second.",
     "answer": "The modulo operator is a bitwise operator that returns the remainder of an "
               "integer division operation."},
    {"family": "definition", "lead": True, "gold": _DUPLEX,
     "answer": "A double-ended communication channel is a communication channel that can carry "
               "signals in both directions, in contrast to a single-ended communication channel "
               "that only carries a single signal."},
    {"family": "definition", "lead": True, "gold": _INTERRUPT,
     "answer": "A software interrupt is a specific type of hardware interrupt that is caused by "
               "a specific machine language operation code (e.g. the Motorola 68000's TRAP, the "
               "IBM System/390's SVC or ARM's SWI) rather than a hardware event."},
    {"family": "explanation", "lead": True, "gold": _FOR,
     "answer": 'The "for" statement is a built-in Python function that allows you to iterate '
               "over a sequence (such as a list, tuple, or string) to perform a "
               "sequence-specific operation."},
    {"family": "definition", "lead": False, "gold": _INTERLACING,
     "answer": "For a given screen resolution, refresh rate (frames per second) and phosphor "
               "persistence, interlacing reduces flicker because the top and bottom of the "
               "screen are redrawn twice as often as if the scan simply proceded from top to "
               "bottom in a single vertical sweep."},
    {"family": "definition", "lead": False,
     "gold": "Any completely inoperable system or component, especially one that has just "
             'crashed and burned: "Uh, oh ...',
     "answer": "Toast is a type of toffee that is made from a mixture of flour and sugar."},
    {"family": "definition", "lead": False,
     "gold": "An extra option added to a routine without changing the calling sequence.",
     "answer": "The hidden flag is a flag that is used to select between two (usually quite "
               "different) modes of operation."},
    {"family": "definition", "lead": False, "gold": _PRIORITY,
     "answer": "The obvious way to represent priority queues is by maintaining a sorted list "
               "but this can make the insert operation very slow."},
    {"family": "explanation", "lead": False, "gold": _NONLOCAL,  # quoted in issue 60
     "answer": 'The specification for the "nonlocal" statement.'},
]

#: Openings that are not the lead but share its words (module docstring).
NEAR_MISSES: list[dict] = [
    {"family": "explanation", "lead": False, "gold": _NONLOCAL,
     "answer": 'The "nonlocal" statement\n************************\n\n   nonlocal_stmt ::= ...'},
    {"family": "explanation", "lead": False, "gold": _NONLOCAL,
     "answer": 'Names listed in a "nonlocal" statement, unlike those listed in a "global" '
               "statement, must refer to pre-existing bindings in an enclosing scope."},
    {"family": "explanation", "lead": False,
     "gold": 'The "try" statement specifies exception handlers and/or cleanup code for a group '
             "of statements:",
     "answer": 'The "try" statement\n*******************\n\nThe "try" statement specifies'},
]
