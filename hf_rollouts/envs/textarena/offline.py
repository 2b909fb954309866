"""Why a TextArena game cannot run here, read from its module's source without importing it (importing some games
downloads NLTK data): it calls a hosted LLM during play (TwentyQuestions, GuessWho, Debate, ...: OpenRouter over the
network), or it needs NLTK data that is not installed (Wordle, Hangman, ...). :func:`static_problem` says which,
with what to do; ``None`` when nothing is known (the adapter then makes and resets one game to find out).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# Markers, in a game module's source, of a game that calls a hosted model during play.
_HOSTED_MODEL_MARKERS = re.compile(r"OpenRouter\w*|\bta\.agents\.\w+|\btextarena\.agents\b|\bJury\b|make_online")
_NLTK_DOWNLOAD = re.compile(r"nltk\.download\(([^)]*)\)")
_NLTK_CATEGORIES = (
    "corpora",
    "taggers",
    "tokenizers",
    "chunkers",
    "models",
    "misc",
    "stemmers",
    "grammars",
    "sentiment",
)


def _module_source(entry_point: Any, ta: Any) -> str | None:
    if isinstance(entry_point, str):
        module = entry_point.split(":")[0]
    else:
        module = getattr(entry_point, "__module__", "")
    if not module.startswith("textarena."):
        return None
    path = Path(ta.__file__).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _nltk_resources(source: str) -> list[str]:
    names: list[str] = []
    for args in _NLTK_DOWNLOAD.findall(source):
        names += re.findall(r"['\"]([\w\-]+)['\"]", args)
    if re.search(r"corpus import[^\n]*\bwords\b|words\.words\(", source):
        names.append("words")
    if "pos_tag" in source:
        names.append("averaged_perceptron_tagger_eng")
    return sorted(set(names))


def _nltk_missing(names: list[str]) -> list[str]:
    try:
        import nltk
    except ImportError:
        return names
    missing = []
    for name in names:
        for category in _NLTK_CATEGORIES:
            try:
                nltk.data.find(f"{category}/{name}")
                break
            except LookupError:
                continue
        else:
            missing.append(name)
    return missing


def static_problem(env_id: str, entry_point: Any, ta: Any) -> str | None:
    """Why the game cannot run offline, read from its module's source; ``None`` if nothing is known."""
    source = _module_source(entry_point, ta)
    if source is None:
        return None
    hosted = _HOSTED_MODEL_MARKERS.search(source)
    if hosted:
        return (
            f"it calls a hosted LLM during play ({hosted.group(0)}: OpenRouter over the network, with an API key), "
            "which TextArenaEnv does not allow: rewards would depend on a remote model"
            + (" — use hf_rollouts' own offline env 'twenty_questions' instead" if "TwentyQuestions" in env_id else "")
        )
    if "nltk" in source:
        missing = _nltk_missing(_nltk_resources(source))
        if missing:
            return (
                f"it needs the NLTK data {missing}, which is not installed, and TextArena would try to download it "
                f"from the internet when the game is imported; install it first where the network allows "
                f"(python -m nltk.downloader {' '.join(missing)}) and point NLTK_DATA at it"
            )
    return None


__all__ = ["static_problem"]
