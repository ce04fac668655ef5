"""A pool's tokenizer: the model's own `tokenizer.json`, light enough for the web process."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from django.conf import settings
from tokenizers import Tokenizer

from chatsite.errors import ServiceError

from .errors import ErrorCode
from .models import ModelPool


@lru_cache(maxsize=8)
def load_tokenizer(folder: str) -> Tokenizer:
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise ServiceError(
            ErrorCode.TOKENIZER_MISSING,
            "The model's tokenizer is not prepared; run `python manage.py prepare_model`.",
            status=503,
        )
    return Tokenizer.from_file(str(path))


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def warm_default_tokenizer() -> None:
    """Load the default model's tokenizer now, if it is prepared (a pool with a tokenizer of
    its own loads that on first use): a process pays for it as it starts, not in its first
    user's message. No database."""
    folder = str(settings.MODEL_DIR)
    if (Path(folder) / "tokenizer.json").is_file():
        load_tokenizer(folder)


def pool_tokenizer_folder(pool: ModelPool) -> str:
    return pool.tokenizer_path or str(settings.MODEL_DIR)


def pool_tokenizer(pool: ModelPool) -> Tokenizer:
    """The tokenizer of the model `pool` serves."""
    return load_tokenizer(pool_tokenizer_folder(pool))
