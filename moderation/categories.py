"""One taxonomy for every classifier: the MLCommons hazard categories S1-S14 as Llama Guard 3
names them, plus `harassment` and `profanity`. Every backend scores text in these terms (0..1),
so thresholds, flags and the review queue never depend on which backend spoke."""

from __future__ import annotations

from django.db import models


class Category(models.TextChoices):
    VIOLENT_CRIMES = "S1", "S1 Violent Crimes"
    NON_VIOLENT_CRIMES = "S2", "S2 Non-Violent Crimes"
    SEX_RELATED_CRIMES = "S3", "S3 Sex-Related Crimes"
    CHILD_SEXUAL_EXPLOITATION = "S4", "S4 Child Sexual Exploitation"
    DEFAMATION = "S5", "S5 Defamation"
    SPECIALIZED_ADVICE = "S6", "S6 Specialized Advice"
    PRIVACY = "S7", "S7 Privacy"
    INTELLECTUAL_PROPERTY = "S8", "S8 Intellectual Property"
    INDISCRIMINATE_WEAPONS = "S9", "S9 Indiscriminate Weapons"
    HATE = "S10", "S10 Hate"
    SUICIDE_SELF_HARM = "S11", "S11 Suicide & Self-Harm"
    SEXUAL_CONTENT = "S12", "S12 Sexual Content"
    ELECTIONS = "S13", "S13 Elections"
    CODE_INTERPRETER_ABUSE = "S14", "S14 Code Interpreter Abuse"
    HARASSMENT = "harassment", "Harassment"
    PROFANITY = "profanity", "Profanity"


CATEGORIES: tuple[str, ...] = tuple(Category.values)


def label(category: str) -> str:
    """The human name of a category code (the code itself if unknown)."""
    try:
        return str(Category(category).label)
    except ValueError:
        return category
