"""An HTTP moderation API in OpenAI's format (`POST {url}/moderations`).

OpenAI's categories are mapped onto ours; a category of theirs that spans two of ours
scores both.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from moderation.categories import Category

from .base import Classifier, ClassifierError, Scores, post_json

OPENAI_CATEGORIES: dict[str, tuple[str, ...]] = {
    "harassment": (Category.HARASSMENT,),
    "harassment/threatening": (Category.HARASSMENT, Category.VIOLENT_CRIMES),
    "hate": (Category.HATE,),
    "hate/threatening": (Category.HATE, Category.VIOLENT_CRIMES),
    "illicit": (Category.NON_VIOLENT_CRIMES,),
    "illicit/violent": (Category.VIOLENT_CRIMES,),
    "self-harm": (Category.SUICIDE_SELF_HARM,),
    "self-harm/intent": (Category.SUICIDE_SELF_HARM,),
    "self-harm/instructions": (Category.SUICIDE_SELF_HARM,),
    "sexual": (Category.SEXUAL_CONTENT,),
    "sexual/minors": (Category.CHILD_SEXUAL_EXPLOITATION,),
    "violence": (Category.VIOLENT_CRIMES,),
    "violence/graphic": (Category.VIOLENT_CRIMES,),
}


def map_openai_scores(category_scores: dict[str, Any]) -> Scores:
    """OpenAI's `category_scores` in our taxonomy (the highest where several map to one)."""
    scores: Scores = {}
    for name, value in category_scores.items():
        for category in OPENAI_CATEGORIES.get(name, ()):
            scores[category] = max(float(value), scores.get(category, 0.0))
    return {str(k): v for k, v in scores.items()}


class OpenAIModerationClassifier(Classifier):
    """Any service answering OpenAI's moderation API (URL and key from settings)."""

    name = "openai_moderation"

    def classify(self, text: str) -> Scores:
        url = settings.MODERATION_OPENAI_URL.rstrip("/")
        headers = {}
        if settings.MODERATION_OPENAI_API_KEY:
            headers["Authorization"] = f"Bearer {settings.MODERATION_OPENAI_API_KEY}"
        answer = post_json(
            f"{url}/moderations",
            {"model": settings.MODERATION_OPENAI_MODEL, "input": text},
            headers=headers,
            timeout=settings.MODERATION_OPENAI_TIMEOUT_SECONDS,
            what="moderation API",
        )
        try:
            result = answer["results"][0]
            category_scores = result["category_scores"]
            if not isinstance(category_scores, dict):
                raise TypeError("category_scores is not an object")
            return map_openai_scores(category_scores)
        except (KeyError, IndexError, TypeError) as exc:
            raise ClassifierError("moderation API sent an unreadable answer") from exc
