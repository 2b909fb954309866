"""Write a small GSM8K-shaped dataset of one-step word problems: a train and a held-out json that share no problem.

No model hub is reachable here, so the dataset the training guide's "dataset env" run learns on is made by this
seeded generator. Each row has GSM8K's two columns: ``question`` ("Mia has 7 pencils. She buys 5 more. How many
pencils does Mia have now?") and ``answer`` (a worked line with GSM8K's calculator annotation, then ``#### 12``)::

    python scripts/make_word_problems.py --output-dir outputs/word_problems       # train.json, test.json
    hf-rollouts tasks --from-dataset outputs/word_problems/train.json ...          # -> task rows (the dataset env)

Problems are one step (an addition or a subtraction of one- or two-digit numbers) in one of several story
templates; train and test are split by *problem* (template, name, item and numbers): none is in both files.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ("Mia", "Tom", "Ava", "Sam", "Lily", "Ben", "Emma", "Jack", "Zoe", "Leo", "Nora", "Max")
ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "shells", "balloons", "coins")

# (question, worked answer line, operator): {n} a name, {x} an item, {a} and {b} the numbers
TEMPLATES = (
    ("{n} has {a} {x}. {p} buys {b} more. How many {x} does {n} have now?", "{n} has {a} + {b} = {e} {x}.", "+"),
    (
        "{n} had {a} {x} and gave {b} to a friend. How many {x} does {n} have left?",
        "{n} has {a} - {b} = {e} {x} left.",
        "-",
    ),
    (
        "There are {a} {x} in a box. {n} puts in {b} more. How many {x} are in the box?",
        "The box has {a} + {b} = {e} {x}.",
        "+",
    ),
    ("{n} had {a} {x}. {p} lost {b} of them. How many {x} are left?", "{a} - {b} = {e} {x} are left.", "-"),
    (
        "{n} found {a} {x} on Monday and {b} {x} on Tuesday. How many {x} did {n} find in all?",
        "{n} found {a} + {b} = {e} {x}.",
        "+",
    ),
    (
        "A shelf holds {a} {x}. {n} takes away {b}. How many {x} are still on the shelf?",
        "{a} - {b} = {e} {x} are still there.",
        "-",
    ),
)
PRONOUN = {"Mia": "She", "Ava": "She", "Lily": "She", "Emma": "She", "Zoe": "She", "Nora": "She"}


def problem(rng: random.Random, max_number: int) -> tuple:
    """One problem's key: (template index, name, item, a, b); subtraction keeps a > b."""
    t = rng.randrange(len(TEMPLATES))
    a, b = rng.randint(2, max_number), rng.randint(2, max_number)
    if TEMPLATES[t][2] == "-":
        a, b = max(a, b) + 1, min(a, b)
    return t, rng.choice(NAMES), rng.choice(ITEMS), a, b


def render(key: tuple) -> dict[str, str]:
    """GSM8K's columns of one problem: ``question`` and ``answer`` (the worked line, then ``#### <number>``)."""
    t, n, x, a, b = key
    q, worked, op = TEMPLATES[t]
    e = a + b if op == "+" else a - b
    fill = {"n": n, "x": x, "a": a, "b": b, "e": e, "p": PRONOUN.get(n, "He")}
    calc = f"<<{a}{op}{b}={e}>>"
    return {
        "question": q.format(**fill),
        "answer": worked.format(**fill).replace(f"= {e}", f"= {calc}{e}") + f"\n#### {e}",
    }


def make(num_train: int, num_test: int, max_number: int, seed: int) -> tuple[list[dict], list[dict]]:
    """``(train, test)`` rows: distinct problems, none in both lists (seeded)."""
    rng = random.Random(seed)
    keys: list[tuple] = []
    seen: set[tuple] = set()
    while len(keys) < num_train + num_test:
        key = problem(rng, max_number)
        if key not in seen:
            seen.add(key)
            keys.append(key)
    rows = [render(k) for k in keys]
    return rows[num_test:], rows[:num_test]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", default="outputs/word_problems")
    parser.add_argument("--num-train", type=int, default=1000)
    parser.add_argument("--num-test", type=int, default=200)
    parser.add_argument("--max-number", type=int, default=20, help="Largest number in a problem.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    train, test = make(args.num_train, args.num_test, args.max_number, args.seed)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {len(train)} train and {len(test)} test problems to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
