"""Tests of the Twenty Questions knowledge base, question parser and KB gamemaster."""

from __future__ import annotations

import copy
import json
from importlib import resources

import pytest

from hf_rollouts.envs.twenty_questions.knowledge import (
    NO,
    UNANSWERABLE_PHRASES,
    UNKNOWN,
    YES,
    Gamemaster,
    KnowledgeBase,
    KnowledgeBaseGamemaster,
    normalize,
)

CATEGORY_WORDS = ("animal", "plant", "food", "tool", "vehicle", "furniture", "container", "mammal", "toy", "instrument")


@pytest.fixture(scope="module")
def kb() -> KnowledgeBase:
    return KnowledgeBase.load()


@pytest.fixture(scope="module")
def raw() -> dict:
    text = resources.files("hf_rollouts.envs.twenty_questions").joinpath("objects.json").read_text(encoding="utf-8")
    return json.loads(text)


# ----------------------------------------------------------------------------- data


def test_counts_and_disjoint_sets(kb: KnowledgeBase) -> None:
    assert len(kb.basic) >= 100
    assert len(kb.hardcore) >= 50
    assert len(kb.attributes) >= 20
    assert not set(kb.basic) & set(kb.hardcore)
    assert set(kb.basic) | set(kb.hardcore) == set(kb.objects)
    assert list(kb.basic) == sorted(kb.basic) and list(kb.hardcore) == sorted(kb.hardcore)


def test_every_object_has_every_attribute(kb: KnowledgeBase) -> None:
    for name, values in kb.objects.items():
        assert set(values) == set(kb.attributes), name
        assert all(v is None or isinstance(v, bool) for v in values.values()), name


def test_null_rate_is_low(kb: KnowledgeBase) -> None:
    cells = [v for values in kb.objects.values() for v in values.values()]
    nulls = sum(v is None for v in cells)
    assert nulls / len(cells) <= 0.05
    # No object is mostly unknown.
    for name, values in kb.objects.items():
        assert sum(v is None for v in values.values()) <= 4, name


def test_object_names_are_short_lowercase(kb: KnowledgeBase) -> None:
    for name in kb.objects:
        assert name == name.lower().strip()
        assert 1 <= len(name.split()) <= 2, name
        assert normalize(name) == name, name


def test_attribute_questions_are_questions(kb: KnowledgeBase) -> None:
    for attr, question in kb.attributes.items():
        assert question.endswith("?"), attr
        assert kb.keywords[attr], attr


def test_raw_file_layout(raw: dict) -> None:
    assert set(raw) >= {"attributes", "objects"}
    assert set(raw["objects"]) == {"basic", "hardcore"}
    for attr, spec in raw["attributes"].items():
        assert set(spec) == {"question", "keywords"}, attr
        # No keyword is listed twice within an attribute once normalized.
        normalized = [normalize(k) for k in spec["keywords"]]
        assert len(normalized) == len(set(normalized)), attr
    for canonical, aliases in raw.get("aliases", {}).items():
        assert canonical in raw["objects"]["basic"] or canonical in raw["objects"]["hardcore"], canonical
        assert aliases, canonical


@pytest.mark.parametrize(
    ("premise", "conclusion"),
    [
        ("is_mammal", "is_animal"),
        ("is_animal", "is_alive"),
        ("is_food", "is_edible"),
        ("is_bigger_than_person", "is_bigger_than_breadbox"),
        ("has_screen", "is_electronic"),
        ("is_electronic", "needs_electricity"),
        ("is_a_vehicle", "is_man_made"),
        ("is_musical_instrument", "is_man_made"),
        ("is_furniture", "is_man_made"),
    ],
)
def test_annotations_are_consistent(kb: KnowledgeBase, premise: str, conclusion: str) -> None:
    for name, values in kb.objects.items():
        if values[premise] is True:
            assert values[conclusion] is not False, f"{name}: {premise} but not {conclusion}"


def test_annotations_exclusive(kb: KnowledgeBase) -> None:
    for name, values in kb.objects.items():
        assert not (values["is_animal"] and values["is_plant"]), name
        assert not (values["is_alive"] and values["is_man_made"]), name


@pytest.mark.parametrize(
    ("obj", "attr", "expected"),
    [
        ("dog", "is_mammal", True),
        ("narwhal", "lives_in_water", True),
        ("penguin", "can_fly", False),
        ("bat", "can_fly", True),
        ("apple", "is_food", True),
        ("clock", "is_alive", False),
        ("car", "has_wheels", True),
        ("knife", "is_sharp", True),
        ("television", "has_screen", True),
        ("guitar", "is_musical_instrument", True),
        ("elephant", "is_bigger_than_person", True),
        ("coin", "can_hold_in_one_hand", True),
        ("stethoscope", "is_man_made", True),
        ("whale", "has_legs", False),
    ],
)
def test_known_facts(kb: KnowledgeBase, obj: str, attr: str, expected: bool) -> None:
    assert kb.value(obj, attr) is expected


def test_load_is_cached(kb: KnowledgeBase) -> None:
    assert KnowledgeBase.load() is kb


# --------------------------------------------------------------------------- parser

PARSER_TABLE = [
    ("Is it an animal?", "is_animal"),
    ("is it a living thing", "is_alive"),
    ("Is it alive?", "is_alive"),
    ("Is it a mammal?", "is_mammal"),
    ("Is it a plant?", "is_plant"),
    ("Can you eat it?", "is_edible"),
    ("Is it edible?", "is_edible"),
    ("Is it a type of food?", "is_food"),
    ("Does it fly?", "can_fly"),
    ("Can it fly?", "can_fly"),
    ("Is it bigger than a bread box?", "is_bigger_than_breadbox"),
    ("Is it larger than a breadbox?", "is_bigger_than_breadbox"),
    ("Is it bigger than a person?", "is_bigger_than_person"),
    ("Is it taller than a human?", "is_bigger_than_person"),
    ("Would I find it in a kitchen?", "used_in_kitchen"),
    ("Is it used for cooking food?", "used_in_kitchen"),
    ("Would I find it in a house?", "is_found_indoors"),
    ("Is it usually found outside?", "is_found_outdoors"),
    ("Does it run on electricity?", "needs_electricity"),
    ("Does it use batteries?", "needs_electricity"),
    ("Does it need to be plugged in?", "needs_electricity"),
    ("Is it an electronic device?", "is_electronic"),
    ("Is it made of metal?", "is_made_of_metal"),
    ("IS IT MADE OF WOOD?", "is_made_of_wood"),
    ("Is it made out of plastic?", "is_made_of_plastic"),
    ("Is it made of fabric?", "is_made_of_fabric"),
    ("Is it man-made?", "is_man_made"),
    ("Does it live in the water?", "lives_in_water"),
    ("Is it found in the ocean?", "lives_in_water"),
    ("Does it have legs?", "has_legs"),
    ("Does it have wheels?", "has_wheels"),
    ("Is it a vehicle?", "is_a_vehicle"),
    ("Is it a tool?", "is_a_tool"),
    ("Is it a piece of furniture?", "is_furniture"),
    ("Is it a container?", "is_a_container"),
    ("Can you put things in it?", "is_a_container"),
    ("Is it soft?", "is_soft"),
    ("Is it sharp?", "is_sharp"),
    ("Does it make noise?", "makes_sound"),
    ("Do people wear it?", "is_worn"),
    ("Is it a piece of clothing?", "is_worn"),
    ("Is it a toy?", "used_for_entertainment"),
    ("Is it used for entertainment?", "used_for_entertainment"),
    ("Does it have a screen?", "has_screen"),
    ("Is it a musical instrument?", "is_musical_instrument"),
    ("Can you hold it in one hand?", "can_hold_in_one_hand"),
    ("Could I hold it in my hand?", "can_hold_in_one_hand"),
]


@pytest.mark.parametrize(("question", "expected"), PARSER_TABLE)
def test_parse_question_table(kb: KnowledgeBase, question: str, expected: str) -> None:
    assert kb.parse_question(question) == expected


def test_canonical_questions_parse_to_their_attribute(kb: KnowledgeBase) -> None:
    for attr, question in kb.attributes.items():
        assert kb.parse_question(question) == attr, question


@pytest.mark.parametrize(
    "question",
    [
        "",
        "   ",
        "asdf qwerty zxcv",
        "What color is it?",
        "Is it heavy?",
        "Is it bigger than a car?",
        "Hello there!",
        # Keyword present, but answering that attribute would be wrong:
        "Is it smaller than a breadbox?",
        "Would it fit in a bread box?",
        "Does it have four legs?",
        "Does it eat plants?",
        "Is it a wild animal?",
        "Is it a scientific instrument?",
        "Is it an object rather than a living thing?",
        "Is it an animal or a plant?",
        "Is it made of wood or metal?",
    ],
)
def test_parse_question_none(kb: KnowledgeBase, question: str) -> None:
    assert kb.parse_question(question) is None


def test_parse_question_uses_word_boundaries(kb: KnowledgeBase) -> None:
    # "fly" must not fire inside "butterfly", "eat" not inside "great"/"heater", "leg" not inside "legal".
    assert kb.parse_question("Is it a butterfly?") is None
    assert kb.parse_question("Is it a great heater?") is None
    assert kb.parse_question("Is it legal?") is None


def test_most_specific_match_wins(kb: KnowledgeBase) -> None:
    assert kb.parse_question("Is it bigger than a person, like way bigger than a breadbox?") == "is_bigger_than_person"
    assert kb.parse_question("Is it a sea creature?") == "lives_in_water"
    assert kb.parse_question("Is it used to cook food?") == "used_in_kitchen"
    assert kb.parse_question("Is it bigger than a breadbox but smaller than a person?") == "is_bigger_than_breadbox"


def test_either_or_over_one_attribute_is_answered(kb: KnowledgeBase) -> None:
    assert kb.parse_question("Is it made of fabric or cloth?") == "is_made_of_fabric"
    assert kb.parse_question("Does it use electricity or batteries?") == "needs_electricity"
    assert kb.parse_question("Is it a sea creature or not?") == "lives_in_water"


def test_unanswerable_phrases_are_not_keywords(kb: KnowledgeBase) -> None:
    keywords = {normalize(k) for ks in kb.keywords.values() for k in ks}
    assert not keywords & {normalize(p) for p in UNANSWERABLE_PHRASES}


# ---------------------------------------------------------------------------- guess

GUESSES = [
    ("Is it a clock?", "clock"),
    ("Is it an apple?", "apple"),
    ("My guess is: clock", "clock"),
    ("clock?", "clock"),
    ("Clock", "clock"),
    ("Is the answer a narwhal?", "narwhal"),
    ("Is it the sextant?", "sextant"),
    ("Is it a fridge?", "refrigerator"),
    ("Is it a TV?", "television"),
    ("Is it a teddy bear?", "teddy bear"),
    ("I think I know! Is it a venus flytrap?", "venus flytrap"),
    ("Okay, is it a dog then?", "dog"),
    ("Final answer: abacus", "abacus"),
    ("Are you thinking of a metronome?", "metronome"),
]


@pytest.mark.parametrize(("question", "expected"), GUESSES)
def test_guessed_object(kb: KnowledgeBase, question: str, expected: str) -> None:
    assert kb.guessed_object(question) == expected


@pytest.mark.parametrize(
    "question",
    [
        "Is it an animal?",
        "Is it a plant?",
        "Is it food?",
        "Is it a tool?",
        "Is it a vehicle?",
        "Is it furniture?",
        "Is it a container?",
        "Is it alive?",
        "Is it bigger than a bread box?",
        "Is it a red apple?",
        "Is it an apple or a pear?",
        "Does it have a clock?",
        "Is it a unicorn?",
        "",
    ],
)
def test_not_a_guess(kb: KnowledgeBase, question: str) -> None:
    assert kb.guessed_object(question) is None


def test_every_object_and_alias_can_be_guessed(kb: KnowledgeBase) -> None:
    for name in kb.objects:
        assert kb.guessed_object(f"Is it a {name}?") == name
    for alias, canonical in kb.aliases.items():
        assert kb.guessed_object(f"Is it a {alias}?") == canonical, alias


def test_names_do_not_collide_with_attribute_words(kb: KnowledgeBase) -> None:
    spellings = {normalize(n) for n in kb.objects} | {normalize(a) for a in kb.aliases}
    for word in CATEGORY_WORDS:
        assert word not in spellings
    for attr, keywords in kb.keywords.items():
        for keyword in keywords:
            assert normalize(keyword) not in spellings, (attr, keyword)
            assert kb.guessed_object(f"Is it a {keyword}?") is None, (attr, keyword)
    for question in kb.attributes.values():
        assert kb.guessed_object(question) is None, question


# ------------------------------------------------------------------------ gamemaster


def test_constants() -> None:
    assert (YES, NO, UNKNOWN) == ("Yes", "No", "I don't know")


@pytest.fixture(scope="module")
def gm(kb: KnowledgeBase) -> KnowledgeBaseGamemaster:
    return KnowledgeBaseGamemaster(kb)


def test_gamemaster_satisfies_protocol(gm: KnowledgeBaseGamemaster) -> None:
    assert isinstance(gm, Gamemaster)
    assert KnowledgeBaseGamemaster().kb is KnowledgeBase.load()


@pytest.mark.parametrize(
    ("question", "solution", "expected"),
    [
        ("Is it an animal?", "dog", YES),
        ("Is it an animal?", "clock", NO),
        ("Is it a mammal?", "narwhal", YES),
        ("Can it fly?", "penguin", NO),
        ("Does it make a sound?", "clock", YES),
        ("Can you eat it?", "apple", YES),
        ("Is it bigger than a breadbox?", "elephant", YES),
        ("Is it bigger than a breadbox?", "coin", NO),
        ("What is the meaning of life?", "dog", UNKNOWN),
        ("Is it smaller than a breadbox?", "coin", UNKNOWN),
        ("Is it a clock?", "clock", UNKNOWN),  # guesses are the environment's job
    ],
)
def test_gamemaster_answers(gm: KnowledgeBaseGamemaster, question: str, solution: str, expected: str) -> None:
    assert gm.answer(question, solution) == expected


def test_gamemaster_null_annotation_is_unknown(gm: KnowledgeBaseGamemaster, kb: KnowledgeBase) -> None:
    assert kb.objects["chicken"]["can_fly"] is None
    assert gm.answer("Can it fly?", "chicken") == UNKNOWN


def test_gamemaster_accepts_alias_and_case(gm: KnowledgeBaseGamemaster) -> None:
    assert gm.answer("Does it need electricity?", "Fridge") == YES
    assert gm.answer("Does it need electricity?", "REFRIGERATOR") == YES


def test_gamemaster_answers_are_always_valid(gm: KnowledgeBaseGamemaster, kb: KnowledgeBase) -> None:
    questions = list(kb.attributes.values()) + ["gibberish"]
    for name in kb.objects:
        for question in questions:
            assert gm.answer(question, name) in (YES, NO, UNKNOWN)


def test_unknown_solution_raises_helpful_error(gm: KnowledgeBaseGamemaster) -> None:
    with pytest.raises(ValueError) as info:
        gm.answer("Is it alive?", "unicorn")
    message = str(info.value)
    assert "'unicorn'" in message
    assert "KnowledgeBase.load().basic" in message and "hardcore" in message


# ------------------------------------------------------------------------ validation


def test_from_dict_round_trip(raw: dict, kb: KnowledgeBase) -> None:
    rebuilt = KnowledgeBase.from_dict(raw)
    assert rebuilt == kb


def test_from_dict_rejects_missing_attribute(raw: dict) -> None:
    data = copy.deepcopy(raw)
    del data["objects"]["basic"]["dog"]["is_alive"]
    with pytest.raises(ValueError, match="dog"):
        KnowledgeBase.from_dict(data)


def test_from_dict_rejects_overlapping_sets(raw: dict) -> None:
    data = copy.deepcopy(raw)
    data["objects"]["hardcore"]["dog"] = data["objects"]["basic"]["dog"]
    with pytest.raises(ValueError, match="dog"):
        KnowledgeBase.from_dict(data)


def test_from_dict_rejects_object_named_like_keyword(raw: dict) -> None:
    data = copy.deepcopy(raw)
    data["objects"]["basic"]["animal"] = dict(data["objects"]["basic"]["dog"])
    with pytest.raises(ValueError, match="animal"):
        KnowledgeBase.from_dict(data)


def test_from_dict_rejects_bad_alias(raw: dict) -> None:
    data = copy.deepcopy(raw)
    data.setdefault("aliases", {})["unicorn"] = ["horned horse"]
    with pytest.raises(ValueError, match="unicorn"):
        KnowledgeBase.from_dict(data)


def test_from_dict_rejects_non_boolean_value(raw: dict) -> None:
    data = copy.deepcopy(raw)
    data["objects"]["basic"]["dog"]["is_alive"] = "yes"
    with pytest.raises(ValueError, match="dog"):
        KnowledgeBase.from_dict(data)
