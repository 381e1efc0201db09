"""Follow-up questions in a chat (issue 60): two-turn conversations over corpora the package
never saw, split dev/test by document.

Three families, each a first question that names its subject, the answer a person would give,
and a follow-up that needs the first turn to be understood:

- ``ellipsis`` ("And in Y?", "What about Y?", "And Y?", "How about Y?"): the same attribute of
  another country. Gold: Y's value, on Y's profile.
- ``pronoun`` ("What is its Z?", "What is the Z there?", "And its Z?", "Tell me its Z."):
  another attribute of the same country. Gold: X's value of Z, on X's profile.
- ``explain`` ("How does it work?", "And how does it work?", "How does it operate?",
  "Explain how it works."): after "What is a D?", how the device D works. Gold: the key terms of
  D's operation paragraph (an invented part and material that no other paragraph names).

The countries are fictional profiles (``sets.profiles``, seed ``PROFILE_SEED``, not 0: no rule
was tuned on them); the devices are written here (``generate_devices``): reference pages titled
by device, with a definition, an operation paragraph, a history and uses, all names and terms
drawn from syllables with a seeded RNG. Each split holds its own documents (every document of a
conversation is in its split), so a choice made on dev never saw a test document.

Usage::

    fs = build_followups()
    fs.conversations("dev", "ellipsis")[0].messages     # user, assistant, user
    fs.profiles.write_jsonl("profiles.jsonl"); fs.devices.write_jsonl("devices.jsonl")
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from benchmarks.sets.profiles import ProfileCorpus, _name, generate_profiles

#: The set's version; a change of the output for the same seeds bumps it.
VERSION = 1
PROFILE_SEED = 60
DEVICE_SEED = 60
N_PROFILES = 80  # 40 per split: one ellipsis and one pronoun conversation per country
N_DEVICES = 60  # 30 per split
FAMILIES = ("ellipsis", "pronoun", "explain")
SPLITS = ("dev", "test")

FIRST = ["What is the {a} of {x}?", "{x}: what is the {a}?", "Tell me the {a} of {x}.",
         "What's the {a} of {x}?"]
ELLIPSIS = ["And in {y}?", "What about {y}?", "And {y}?", "How about {y}?"]
PRONOUN = ["What is its {a}?", "What is the {a} there?", "And its {a}?", "Tell me its {a}."]
EXPLAIN_FIRST = ["What is a {d}?", "What is the {d}?", "Tell me about the {d}.",
                 "What is a {d} used for?"]
EXPLAIN = ["How does it work?", "And how does it work?", "How does it operate?",
           "Explain how it works."]


@dataclass(frozen=True)
class Conversation:
    """Two user turns and the answer between them; the gold of the last turn: ``answers``
    (any one makes an answer right), ``distractors`` (any one makes it wrong), the document."""

    id: str
    family: str
    split: str
    corpus: str  # "profiles" | "devices"
    messages: tuple[tuple[str, str], ...]  # (role, content)
    gold_doc_id: str
    answers: tuple[str, ...]
    distractors: tuple[str, ...] = ()
    standalone: str = ""  # the follow-up as a self-contained question (for reading, not scored)

    def chat(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]


@dataclass
class DeviceCorpus:
    documents: list[dict[str, Any]]
    devices: list[dict[str, Any]]  # name, doc_id, lead, keys (operation terms), other terms
    seed: int

    write_jsonl = ProfileCorpus.write_jsonl  # one JSON document a line


@dataclass
class FollowupSet:
    profiles: ProfileCorpus
    devices: DeviceCorpus
    items: list[Conversation] = field(default_factory=list)

    def conversations(self, split: str, family: str | None = None) -> list[Conversation]:
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is invalid: choose one of {list(SPLITS)}")
        if family is not None and family not in FAMILIES:
            raise ValueError(f"family={family!r} is invalid: choose one of {list(FAMILIES)}")
        return [c for c in self.items if c.split == split and family in (None, c.family)]


# ----------------------------------------------------------------------------- devices

_KINDS = [
    ("pump", "water works", "move water uphill"), ("kiln", "pottery", "fire clay"),
    ("loom", "weaving", "weave cloth"), ("press", "printing", "print pages"),
    ("lamp", "mining", "light tunnels"), ("still", "perfumery", "separate oils"),
    ("mill", "farming", "grind grain"), ("clock", "navigation", "keep time at sea"),
    ("filter", "brewing", "clear beer"), ("furnace", "glassmaking", "melt sand"),
    ("bellows", "smithing", "feed air to a forge"), ("drill", "well digging", "bore wells"),
]
_EFFECTS = ["turns the motion into steady pressure", "keeps the heat even",
            "holds the load in place", "releases it a little at a time",
            "stops it from flowing back", "spreads it evenly across the chamber"]
_TOWNS_END = ["ford", "holm", "wick", "by", "stead", "mouth"]


def _term(rng: random.Random, used: set[str]) -> str:
    while True:
        t = _name(rng, 2, 3).lower()
        if t not in used:
            used.add(t)
            return t


def generate_devices(seed: int = DEVICE_SEED, n: int = N_DEVICES) -> DeviceCorpus:
    """``n`` reference pages of invented devices (module docstring), each with its own terms."""
    rng = random.Random(f"devices:{VERSION}:{seed}")
    used: set[str] = set()
    documents, devices = [], []
    for i in range(n):
        kind, trade, purpose = _KINDS[i % len(_KINDS)]
        name = f"{_term(rng, used).capitalize()} {kind}"
        part, material = f"{_term(rng, used)} plate", f"{_term(rng, used)}ite"
        person = f"{_term(rng, used).capitalize()} {_term(rng, used).capitalize()}"
        town = _term(rng, used).capitalize() + rng.choice(_TOWNS_END)
        year = rng.randint(1620, 1890)
        effect = rng.choice(_EFFECTS)
        lead = f"A {name} is a {kind} used in {trade} to {purpose}."
        operation = rng.choice([
            f"It works by pressing a layer of {material} against a {part}, which {effect}.",
            f"The {part} inside it draws {material} through a narrow channel and {effect}.",
            f"Inside, a {part} is packed with {material}; as it turns, the {part} {effect}.",
        ])
        history = (f"The first {name} was built in {year} by {person} of {town}. Early models "
                   f"were made of oak and bronze.")
        uses = (f"Today the {name} is still used in small workshops, and collectors in {town} "
                "keep working examples.")
        text = "\n\n".join([name, lead, "Operation\n" + operation, "History\n" + history,
                            "Uses\n" + uses])
        doc_id = f"device/{name.lower().replace(' ', '-')}"
        documents.append({"id": doc_id, "text": text, "metadata": {"title": name,
                                                                   "kind": "device"}})
        devices.append({"name": name, "doc_id": doc_id, "lead": lead,
                        "keys": (part.split()[0], material), "others": (person, town, str(year))})
    return DeviceCorpus(documents, devices, seed)


# ----------------------------------------------------------------------------- the set


def _split_of(i: int, n: int) -> str:
    return "dev" if i < n // 2 else "test"


def build_followups(profile_seed: int = PROFILE_SEED, device_seed: int = DEVICE_SEED,
                    n_profiles: int = N_PROFILES, n_devices: int = N_DEVICES) -> FollowupSet:
    """The three families over both corpora (module docstring); the same for the same seeds."""
    rng = random.Random(f"followups:{VERSION}:{profile_seed}:{device_seed}")
    profiles = generate_profiles(seed=profile_seed, n=n_profiles, per_profile=1)
    devices = generate_devices(device_seed, n_devices)
    fs = FollowupSet(profiles, devices)
    countries = [d["metadata"]["title"] for d in profiles.documents]
    order = list(range(len(countries)))
    rng.shuffle(order)  # which countries go to dev: by document, at random
    split = {countries[j]: _split_of(k, len(order)) for k, j in enumerate(order)}
    value = {(q.entity, q.attribute): q.answer for q in profiles.questions}
    for q in profiles.questions:  # complete the table: every (country, attribute) value
        value.update({(q.entity, a): v for a, v in q.other_attributes})
    attributes = sorted({a for _, a in value})
    doc = {d["metadata"]["title"]: d["id"] for d in profiles.documents}
    for y in countries:  # ellipsis: Y is the follow-up's country, X another of its split
        x = rng.choice([c for c in countries if c != y and split[c] == split[y]])
        a = rng.choice(attributes)
        first = rng.choice(FIRST).format(a=a, x=x)
        first = first[:1].upper() + first[1:]
        fs.items.append(Conversation(
            f"ellipsis/{doc[y]}", "ellipsis", split[y], "profiles",
            (("user", first), ("assistant", f"The {a} of {x} is {value[(x, a)]}."),
             ("user", rng.choice(ELLIPSIS).format(y=y))),
            doc[y], (value[(y, a)],),
            tuple(value[(c, a)] for c in countries if c != y),
            f"What is the {a} of {y}?"))
    for x in countries:  # pronoun: another attribute of the same country
        a, b = rng.sample(attributes, 2)
        first = rng.choice(FIRST).format(a=a, x=x)
        fs.items.append(Conversation(
            f"pronoun/{doc[x]}", "pronoun", split[x], "profiles",
            (("user", first[:1].upper() + first[1:]),
             ("assistant", f"The {a} of {x} is {value[(x, a)]}."),
             ("user", rng.choice(PRONOUN).format(a=b))),
            doc[x], (value[(x, b)],),
            tuple(value[(c, b)] for c in countries if c != x) + (value[(x, a)],),
            f"What is the {b} of {x}?"))
    dorder = list(range(len(devices.devices)))
    rng.shuffle(dorder)
    dsplit = {j: _split_of(k, len(dorder)) for k, j in enumerate(dorder)}
    for j, d in enumerate(devices.devices):
        others = tuple(k for e in devices.devices if e is not d for k in e["keys"])
        fs.items.append(Conversation(
            f"explain/{d['doc_id']}", "explain", dsplit[j], "devices",
            (("user", rng.choice(EXPLAIN_FIRST).format(d=d["name"])),
             ("assistant", d["lead"]), ("user", rng.choice(EXPLAIN))),
            d["doc_id"], tuple(d["keys"]), others, f"How does the {d['name']} work?"))
    fs.items.sort(key=lambda c: (SPLITS.index(c.split), FAMILIES.index(c.family), c.id))
    return fs


__all__ = ["DEVICE_SEED", "EXPLAIN", "ELLIPSIS", "FAMILIES", "PROFILE_SEED", "PRONOUN",
           "SPLITS", "VERSION", "Conversation", "DeviceCorpus", "FollowupSet",
           "build_followups", "generate_devices"]
