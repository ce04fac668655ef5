"""A `/v1` request's text checked part by part: its system prompt and every message on its own,
however long the whole, and a part seen in an earlier turn not scored again (until staff change
the rules)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from accounts.services import api_key_create
from chatsite.memo import DigestMemo
from conversations.models import Conversation
from inference.models import Generation, ModelPool
from moderation import engine, services
from moderation.classifiers.local import LocalClassifier
from moderation.models import Flag, Rule

from .helpers import BENIGN, HARMFUL, INSULT

pytestmark = pytest.mark.django_db(transaction=True)

# A long system prompt of harmless sentences, as API clients send with every turn.
MANUAL = "You are the support assistant of a bakery. Answer politely and briefly. " * 40


def post(user: User, body: dict[str, Any], *, store: bool) -> Any:
    raw_key = api_key_create(user=user, name="t", store_conversations=store)[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client.post("/v1/chat/completions", body, "application/json")


@pytest.mark.parametrize("store", [True, False], ids=["kept", "unkept"])
def test_a_request_longer_than_a_message_is_checked_all_the_same(
    user: User, pool: ModelPool, store: bool
) -> None:
    # Each part within a message's limit, the whole past it: none may go unchecked.
    sentence = "The bread was good and the shop was warm. "
    long_part = sentence * (settings.SYSTEM_PROMPT_MAX_CHARS // len(sentence))
    body = {
        "model": pool.name,
        "messages": [
            {"role": "system", "content": long_part},
            {"role": "user", "content": long_part},
            {"role": "assistant", "content": long_part},
            {"role": "user", "content": HARMFUL},
        ],
        # Streamed: a request let through answers at once, without waiting for a worker.
        "stream": True,
    }
    assert len(long_part) * 3 > settings.MESSAGE_MAX_CHARS

    response = post(user, body, store=store)

    assert response.status_code == 400  # a request let through streams its answer (200)
    assert response.json()["error"]["code"] == "content_blocked"
    assert not Generation.objects.filter(user=user).exists()
    assert not Conversation.objects.filter(owner=user).exists()
    # The flag quotes the part that was blocked, not the system prompt it came with.
    assert Flag.objects.get(user=user).excerpt == HARMFUL


@pytest.mark.parametrize("store", [True, False], ids=["kept", "unkept"])
def test_an_insult_behind_a_long_system_prompt_is_blocked(
    user: User, pool: ModelPool, store: bool
) -> None:
    body = {
        "model": pool.name,
        "messages": [{"role": "system", "content": MANUAL}, {"role": "user", "content": INSULT}],
        "stream": True,
    }

    response = post(user, body, store=store)

    assert response.status_code == 400  # a request let through streams its answer (200)
    assert Flag.objects.get(user=user).categories == ["harassment"]


def test_parts_scored_before_are_not_scored_again(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    scored: list[str] = []
    classify_many = LocalClassifier.classify_many

    def counting(self: LocalClassifier, texts: list[str]) -> list[dict[str, float]]:
        scored.extend(texts)
        return classify_many(self, texts)

    monkeypatch.setattr(LocalClassifier, "classify_many", counting)
    first = engine.evaluate_parts([MANUAL, BENIGN], engine.policy())
    assert scored == [MANUAL, BENIGN]

    second = engine.evaluate_parts([MANUAL, BENIGN, "An answer.", INSULT], engine.policy())

    # The next turn's request carries the first again: only its new parts are scored.
    assert scored == [MANUAL, BENIGN, "An answer.", INSULT]
    assert not first.is_blocked
    assert second.blocked == ["harassment"] and second.part == 3
    assert (
        second.scores["harassment"] == engine.evaluate(INSULT, engine.policy()).scores["harassment"]
    )
    # Output windows and single messages are not kept: they do not come back.
    engine.evaluate(BENIGN, engine.policy())
    assert scored[-1] == BENIGN


def test_a_staff_rule_applies_to_parts_scored_before_it(user: User, staff: User) -> None:
    text = "Tell me about frobnicating widgets."
    assert not engine.evaluate_parts([MANUAL, text], engine.policy()).is_blocked

    services.rule_save(rule=Rule(category="S2", kind="term", pattern="frobnicating"), by=staff)
    verdict = engine.evaluate_parts([MANUAL, text], engine.policy())

    assert verdict.blocked == ["S2"] and verdict.part == 1


def test_the_memo_keeps_the_most_recently_used() -> None:
    memo: DigestMemo[dict[str, float]] = DigestMemo(2)
    a, b, c = ((1, memo.digest(text)) for text in ("a", "b", "c"))
    memo.put(a, {"S1": 0.1})
    memo.put(b, {"S1": 0.2})
    assert memo.get(a) == {"S1": 0.1}  # now the most recent

    memo.put(c, {"S1": 0.3})

    assert len(memo) == 2
    assert memo.get(b) is None
    assert memo.get(a) == {"S1": 0.1} and memo.get(c) == {"S1": 0.3}
