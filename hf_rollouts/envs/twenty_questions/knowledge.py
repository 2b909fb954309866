"""Offline knowledge base and rule-based gamemaster for Twenty Questions.

The data lives in ``objects.json`` next to this module (loaded with
:mod:`importlib.resources`, so it works from an installed wheel):

* ``attributes``: ``{name: {"question": str, "keywords": [str, ...]}}`` — a fixed
  list of yes/no attributes, each with a canonical question and the phrases
  that map a free-text question onto it.
* ``objects``: ``{"basic": {object: {attribute: bool | null}}, "hardcore": {...}}``
  — every object is annotated with *every* attribute; ``null`` means "genuinely
  ambiguous" and is answered "I don't know".
* ``aliases`` (optional): ``{object: [alias, ...]}`` — other names accepted in
  guesses (``"fridge"`` for ``"refrigerator"``).

Three pieces build on it:

* :class:`KnowledgeBase` — the validated, immutable data plus the question
  parser (:meth:`KnowledgeBase.parse_question`) and the guess detector
  (:meth:`KnowledgeBase.guessed_object`).
* :class:`Gamemaster` — the tiny interface every gamemaster implements:
  ``answer(question, solution) -> "Yes" | "No" | "I don't know"``.
* :class:`KnowledgeBaseGamemaster` — answers from the knowledge base.

Matching is done on *normalized* text (see :func:`normalize`): lowercase,
accents and apostrophes removed, every other non-alphanumeric character turned
into a space, and the articles ``a``/``an``/``the`` dropped. A keyword matches
when its normalized form occurs in the normalized question as whole words.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Final, Protocol, runtime_checkable

__all__ = [
    "NO",
    "UNANSWERABLE_PHRASES",
    "UNKNOWN",
    "YES",
    "Gamemaster",
    "KnowledgeBase",
    "KnowledgeBaseGamemaster",
    "normalize",
]

YES: Final[str] = "Yes"
NO: Final[str] = "No"
UNKNOWN: Final[str] = "I don't know"

_PACKAGE: Final[str] = __package__
_DATA_FILE: Final[str] = "objects.json"

_ARTICLES: Final[frozenset[str]] = frozenset({"a", "an", "the"})

#: Phrases that make a question unanswerable from the attribute table even though
#: it contains a keyword: inverted comparisons ("smaller than a breadbox"), counts
#: ("four legs"), narrower categories ("wild animal", "scientific instrument") and
#: questions about what the object does to other things ("does it eat ...") and
#: contrasts ("an object rather than a living thing").
#: When one of them is at least as specific (as many words) as the best keyword
#: match, :meth:`KnowledgeBase.parse_question` returns ``None`` instead of a wrong
#: attribute. They may not coincide with any attribute keyword.
UNANSWERABLE_PHRASES: Final[tuple[str, ...]] = (
    "smaller than",
    "shorter than",
    "lighter than",
    "less than",
    "fewer than",
    "fit in",
    "fits in",
    "fit inside",
    "fits inside",
    "how many",
    "how much",
    "does it eat",
    "do they eat",
    "it eats",
    "two legs",
    "four legs",
    "six legs",
    "eight legs",
    "many legs",
    "wild animal",
    "farm animal",
    "domestic animal",
    "land animal",
    "flying animal",
    "power tool",
    "kitchen tool",
    "scientific instrument",
    "medical instrument",
    "surgical instrument",
    "measuring instrument",
    "optical instrument",
    "navigation instrument",
    "navigational instrument",
    "writing instrument",
    "precision instrument",
    "rather than",
    "instead of",
)

#: Normalized openings of a guess ("Is it a clock?" -> "is it clock"). A question
#: is a guess when, after one of these (or none), what is left is exactly an
#: object name or alias.
_GUESS_PREFIXES: Final[tuple[str, ...]] = (
    "is it",
    "is this",
    "is that",
    "is it maybe",
    "is it perhaps",
    "is it actually",
    "is it by any chance",
    "is it called",
    "it is",
    "its",
    "it must be",
    "it could be",
    "it might be",
    "could it be",
    "might it be",
    "would it be",
    "can it be",
    "is answer",
    "answer is",
    "is your answer",
    "my answer is",
    "my answer",
    "final answer",
    "final answer is",
    "my final answer",
    "my final answer is",
    "is object",
    "object is",
    "is your object",
    "is secret object",
    "is thing",
    "is your thing",
    "guess",
    "guess is",
    "my guess",
    "my guess is",
    "final guess",
    "final guess is",
    "my final guess",
    "my final guess is",
    "i guess",
    "i guess its",
    "i guess it is",
    "i will guess",
    "ill guess",
    "let me guess",
    "i think",
    "i think its",
    "i think it is",
    "i bet its",
    "i bet it is",
    "are you thinking of",
    "were you thinking of",
    "you are thinking of",
    "youre thinking of",
)
_GUESS_LEADING_FILLERS: Final[frozenset[str]] = frozenset(
    {"ok", "okay", "so", "then", "well", "hmm", "hm", "alright", "right", "great", "thanks", "now", "and"}
)
_GUESS_TRAILING_FILLERS: Final[frozenset[str]] = frozenset({"then", "perhaps", "maybe", "right", "correct", "please"})
_SENTENCE_SPLIT: Final[re.Pattern[str]] = re.compile(r"[.!?;\n]+")


def normalize(text: str) -> str:
    """Canonical form used for all matching.

    Contract: lowercase ASCII words separated by single spaces; accents folded
    (``"café"`` -> ``"cafe"``), apostrophes removed (``"don't"`` -> ``"dont"``),
    any other non-alphanumeric character is a word break (``"t-shirt"`` ->
    ``"t shirt"``), and the articles ``a``, ``an``, ``the`` are dropped. The
    result may be empty. ``normalize(normalize(x)) == normalize(x)``.
    """
    folded = unicodedata.normalize("NFKD", text)
    folded = "".join(c for c in folded if not unicodedata.combining(c)).lower()
    folded = re.sub(r"['\u2019\u2018`]", "", folded)
    words = re.sub(r"[^a-z0-9]+", " ", folded).split()
    return " ".join(w for w in words if w not in _ARTICLES)


@dataclass(frozen=True)
class KnowledgeBase:
    """The Twenty Questions objects and their yes/no attributes.

    Fields (treat every container as read-only; :meth:`load` returns one shared,
    cached instance):

    * ``attributes``: attribute name -> canonical question ("Is it alive?").
    * ``objects``: every object (basic and hardcore) -> ``{attribute: True |
      False | None}`` with exactly the keys of ``attributes``.
    * ``basic`` / ``hardcore``: sorted, disjoint tuples of object names whose
      union is ``objects``' keys.
    * ``keywords``: attribute name -> phrases mapping a question to it.
    * ``aliases``: alias -> canonical object name (accepted in guesses).

    Construction validates all of the above and raises ``ValueError`` with the
    offending name when the data is inconsistent (missing attribute, overlapping
    sets, an object or alias spelled like an attribute keyword, ...).
    """

    attributes: dict[str, str]
    objects: dict[str, dict[str, bool | None]]
    basic: tuple[str, ...]
    hardcore: tuple[str, ...]
    keywords: dict[str, tuple[str, ...]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    # Derived indexes, built in __post_init__.
    _phrases: tuple[tuple[tuple[str, ...], str | None], ...] = field(init=False, repr=False, compare=False)
    _by_first_word: dict[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)
    _names: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._validate()
        object.__setattr__(self, "_phrases", self._build_phrase_index())
        by_first: dict[str, list[int]] = {}
        for rank, (phrase, _attr) in enumerate(self._phrases):
            by_first.setdefault(phrase[0], []).append(rank)
        object.__setattr__(self, "_by_first_word", {w: tuple(r) for w, r in by_first.items()})
        object.__setattr__(self, "_names", self._build_name_index())

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls) -> KnowledgeBase:
        """The knowledge base shipped with the package (parsed once, then cached).

        Raises ``ValueError`` if the packaged ``objects.json`` is inconsistent.
        """
        return _load_packaged()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KnowledgeBase:
        """Build a knowledge base from the ``objects.json`` structure.

        ``data`` must have ``attributes`` and ``objects`` (with ``basic`` and
        ``hardcore``); ``aliases`` is optional. Raises ``ValueError`` on a
        malformed structure or inconsistent data.
        """
        try:
            raw_attrs = data["attributes"]
            raw_objects = data["objects"]
            raw_basic = raw_objects["basic"]
            raw_hard = raw_objects["hardcore"]
        except (KeyError, TypeError) as e:
            raise ValueError(
                "knowledge base data needs 'attributes' and 'objects': {'basic': {...}, 'hardcore': {...}}"
            ) from e
        attributes: dict[str, str] = {}
        keywords: dict[str, tuple[str, ...]] = {}
        for name, spec in raw_attrs.items():
            if not isinstance(spec, Mapping) or not isinstance(spec.get("question"), str):
                raise ValueError(f"attribute {name!r} needs a 'question' string")
            attributes[name] = spec["question"]
            keywords[name] = tuple(spec.get("keywords", ()))
        overlap = sorted(set(raw_basic) & set(raw_hard))
        if overlap:
            raise ValueError(f"objects {overlap} are both basic and hardcore; each object belongs to one set")
        merged = {**raw_basic, **raw_hard}
        not_mappings = sorted(name for name, values in merged.items() if not isinstance(values, Mapping))
        if not_mappings:
            raise ValueError(f"objects {not_mappings} must map attribute names to true/false/null")
        objects = {name: dict(values) for name, values in sorted(merged.items())}
        aliases: dict[str, str] = {}
        for canonical, names in data.get("aliases", {}).items():
            if isinstance(names, str) or not all(isinstance(a, str) for a in names):
                raise ValueError(f"aliases of {canonical!r} must be a list of strings")
            for alias in names:
                if alias in aliases and aliases[alias] != canonical:
                    raise ValueError(f"alias {alias!r} is given to both {aliases[alias]!r} and {canonical!r}")
                aliases[alias] = canonical
        return cls(
            attributes=attributes,
            objects=objects,
            basic=tuple(sorted(raw_basic)),
            hardcore=tuple(sorted(raw_hard)),
            keywords=keywords,
            aliases=aliases,
        )

    # --------------------------------------------------------------- validation

    def _validate(self) -> None:
        attr_names = set(self.attributes)
        if not attr_names:
            raise ValueError("knowledge base has no attributes")
        for label, names in (("basic", self.basic), ("hardcore", self.hardcore)):
            if tuple(sorted(names)) != tuple(names):
                raise ValueError(f"KnowledgeBase.{label} must be sorted")
        overlap = sorted(set(self.basic) & set(self.hardcore))
        if overlap:
            raise ValueError(f"objects {overlap} are both basic and hardcore")
        if set(self.basic) | set(self.hardcore) != set(self.objects):
            stray = sorted(set(self.objects) ^ (set(self.basic) | set(self.hardcore)))
            raise ValueError(f"objects {stray} must be listed in exactly one of basic/hardcore and in objects")
        for name, values in self.objects.items():
            if name != name.strip().lower() or not name:
                raise ValueError(f"object name {name!r} must be lowercase with no surrounding spaces")
            missing = sorted(attr_names - set(values))
            extra = sorted(set(values) - attr_names)
            if missing or extra:
                raise ValueError(f"object {name!r}: missing attributes {missing}, unknown attributes {extra}")
            bad = sorted(a for a, v in values.items() if v is not None and not isinstance(v, bool))
            if bad:
                raise ValueError(f"object {name!r}: attributes {bad} must be true, false or null")
        unknown = sorted(set(self.keywords) - attr_names)
        if unknown:
            raise ValueError(f"keywords given for unknown attributes {unknown}")
        for alias, canonical in self.aliases.items():
            if canonical not in self.objects:
                raise ValueError(f"alias {alias!r} points to unknown object {canonical!r}")

    def _build_phrase_index(self) -> tuple[tuple[tuple[str, ...], str | None], ...]:
        """(normalized phrase as words, attribute or None for a veto), most specific first.

        Specificity: more words first; on equal word counts a veto
        (:data:`UNANSWERABLE_PHRASES`) beats a keyword, then the keyword of the
        rarer attribute (fewer objects annotated ``True``: "bigger than a
        person" beats "bigger than a breadbox"), then longer text, then the
        order of the data file.
        """
        owner: dict[str, str | None] = {}
        order: list[str] = []
        for attr in self.attributes:
            for keyword in self.keywords.get(attr, ()):
                phrase = normalize(keyword)
                if not phrase:
                    raise ValueError(f"attribute {attr!r}: keyword {keyword!r} is empty once normalized")
                if phrase in owner:
                    if owner[phrase] != attr:
                        raise ValueError(
                            f"keyword {keyword!r} maps to both {owner[phrase]!r} and {attr!r}; keep it in one attribute"
                        )
                    continue
                owner[phrase] = attr
                order.append(phrase)
        for veto in UNANSWERABLE_PHRASES:
            phrase = normalize(veto)
            if phrase in owner:
                raise ValueError(f"unanswerable phrase {veto!r} is also a keyword of {owner[phrase]!r}")
            owner[phrase] = None
            order.append(phrase)
        rank = {p: i for i, p in enumerate(order)}
        true_count = {a: sum(values[a] is True for values in self.objects.values()) for a in self.attributes}

        def specificity(p: str) -> tuple[int, bool, int, int, int]:
            attr = owner[p]
            rarity = -1 if attr is None else true_count[attr]
            return (-len(p.split()), attr is not None, rarity, -len(p), rank[p])

        ranked = sorted(order, key=specificity)
        return tuple((tuple(p.split()), owner[p]) for p in ranked)

    def _build_name_index(self) -> dict[str, str]:
        """normalized object name or alias -> canonical object name."""
        names: dict[str, str] = {}
        keyword_phrases = {" ".join(p) for p, attr in self._phrases if attr is not None}
        entries = [(name, name) for name in self.objects] + list(self.aliases.items())
        for spelling, canonical in entries:
            key = normalize(spelling)
            if not key:
                raise ValueError(f"object name or alias {spelling!r} is empty once normalized")
            if key in names and names[key] != canonical:
                raise ValueError(f"{spelling!r} names both {names[key]!r} and {canonical!r}")
            if key in keyword_phrases:
                raise ValueError(
                    f"object name or alias {spelling!r} is also an attribute keyword; "
                    "'Is it a ...?' would be ambiguous between a guess and a question"
                )
            names[key] = canonical
        return names

    # ------------------------------------------------------------------ queries

    def canonical_name(self, name: str) -> str | None:
        """The canonical object for an object name or alias (any case/spacing), else ``None``."""
        return self._names.get(normalize(name))

    def parse_question(self, question: str) -> str | None:
        """Map a free-text yes/no question to an attribute name.

        Rule-based: the most specific keyword phrase occurring in the question
        (as whole words, case-insensitive, articles ignored) decides; more words
        is more specific, so "used for cooking" (kitchen) beats "food" and
        "live in water" beats "in water"; between equally long phrases the
        rarer attribute wins ("bigger than a person" over "bigger than a
        breadbox"). Returns ``None`` when

        * no keyword occurs;
        * an :data:`UNANSWERABLE_PHRASES` entry is at least as specific as the
          best keyword ("Is it smaller than a breadbox?", "... four legs?");
        * the question is an either/or over different attributes ("Is it an
          animal or a plant?"): one yes/no answer would mislead.

        Negation is not handled: "Is it not alive?" maps to ``is_alive``.
        """
        words = normalize(question).split()
        if not words:
            return None
        matches: list[tuple[int, int, int]] = []  # (rank in self._phrases, start, end)
        for start, word in enumerate(words):
            for rank in self._by_first_word.get(word, ()):
                end = start + len(self._phrases[rank][0])
                if tuple(words[start:end]) == self._phrases[rank][0]:
                    matches.append((rank, start, end))
        if not matches:
            return None
        best = min(matches)[0]
        if "or" in words:
            # Keep matches not nested inside a longer one ("sea creature" hides "creature").
            spans = {(start, end) for _, start, end in matches}
            outer = [
                (rank, start, end)
                for rank, start, end in matches
                if not any(s <= start and end <= e and e - s > end - start for s, e in spans)
            ]
            attrs = {self._phrases[rank][1] for rank, _, _ in outer} - {None}
            if len(attrs) > 1:
                return None
        return self._phrases[best][1]

    def guessed_object(self, question: str) -> str | None:
        """The canonical object named by a guess, else ``None``.

        A guess is the whole message, or its last sentence, reduced to an object
        name or alias after an optional guess opening ("Is it a clock?", "My
        guess is: clock", "clock?", "Is the answer a narwhal?", "Are you
        thinking of a fridge?"). Anything else left over ("Is it a red
        apple?", "Is it an apple or a pear?") means it is not a guess. Attribute
        questions never qualify: no object or alias is spelled like an
        attribute keyword (checked at construction).
        """
        texts = [question]
        sentences = [s for s in _SENTENCE_SPLIT.split(question) if normalize(s)]
        if len(sentences) > 1:
            texts.append(sentences[-1])
        for text in texts:
            found = self._guess_in(normalize(text))
            if found is not None:
                return found
        return None

    def _guess_in(self, norm: str) -> str | None:
        words = norm.split()
        while len(words) > 1 and words[0] in _GUESS_LEADING_FILLERS:
            words = words[1:]
        while len(words) > 1 and words[-1] in _GUESS_TRAILING_FILLERS:
            words = words[:-1]
        text = " ".join(words)
        candidates = [text] + [text[len(p) + 1 :] for p in _GUESS_PREFIXES if text.startswith(p + " ")]
        for candidate in candidates:
            if candidate in self._names:
                return self._names[candidate]
        return None

    def value(self, obj: str, attribute: str) -> bool | None:
        """The annotation of ``attribute`` for object (or alias) ``obj``.

        Raises ``KeyError`` naming the object or attribute when either is unknown.
        """
        name = self.canonical_name(obj)
        if name is None:
            raise KeyError(f"unknown object {obj!r}")
        if attribute not in self.attributes:
            raise KeyError(f"unknown attribute {attribute!r}; known: {sorted(self.attributes)}")
        return self.objects[name][attribute]


@functools.lru_cache(maxsize=1)
def _load_packaged() -> KnowledgeBase:
    text = resources.files(_PACKAGE).joinpath(_DATA_FILE).read_text(encoding="utf-8")
    return KnowledgeBase.from_dict(json.loads(text))


@runtime_checkable
class Gamemaster(Protocol):
    """Answers yes/no questions about a secret object.

    Contract: ``answer`` returns exactly one of :data:`YES`, :data:`NO`,
    :data:`UNKNOWN` (``"Yes"``, ``"No"``, ``"I don't know"``). ``solution`` is a
    canonical object name from the knowledge base. Guesses are resolved by the
    environment before a gamemaster is asked, so implementations only see
    questions.
    """

    def answer(self, question: str, solution: str) -> str:
        """Answer ``question`` about ``solution`` with "Yes", "No" or "I don't know"."""
        ...


class KnowledgeBaseGamemaster:
    """A :class:`Gamemaster` that answers from the :class:`KnowledgeBase`.

    The question is mapped to an attribute with
    :meth:`KnowledgeBase.parse_question`; ``True`` -> "Yes", ``False`` -> "No",
    ``None`` (ambiguous annotation) or an unparseable question -> "I don't know".
    It does not recognise guesses ("Is it a clock?" is just an unparseable
    question here).
    """

    def __init__(self, kb: KnowledgeBase | None = None) -> None:
        self.kb = kb if kb is not None else KnowledgeBase.load()

    def answer(self, question: str, solution: str) -> str:
        """Answer ``question`` about ``solution``.

        ``solution`` must name an object of the knowledge base (an alias or a
        different case is accepted); otherwise ``ValueError`` is raised.
        """
        name = self.kb.canonical_name(solution)
        if name is None:
            raise ValueError(
                f"solution {solution!r} is not in the Twenty Questions knowledge base, so "
                "KnowledgeBaseGamemaster cannot answer questions about it; use an object from "
                "KnowledgeBase.load().basic or KnowledgeBase.load().hardcore (or add it to objects.json)."
            )
        attribute = self.kb.parse_question(question)
        if attribute is None:
            return UNKNOWN
        value = self.kb.objects[name][attribute]
        if value is None:
            return UNKNOWN
        return YES if value else NO
