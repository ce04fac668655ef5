"""The backends behind the one interface: chaining, the Llama Guard and OpenAI-format
adapters against a local stand-in server (they are external services), and what a failing
backend does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from inference.models import ModelPool, Worker
from moderation import engine
from moderation.classifiers import Classifier, ClassifierError, Scores
from moderation.classifiers.llama_guard import LlamaGuardClassifier, parse_llama_guard
from moderation.classifiers.local import LocalClassifier
from moderation.classifiers.openai_api import OpenAIModerationClassifier

pytestmark = pytest.mark.django_db


class BrokenClassifier(Classifier):
    """A backend that always fails, for the fail-open / fail-closed tests."""

    name = "broken"

    def classify(self, text: str) -> Scores:
        raise ClassifierError("down for the test")


class StandIn:
    """A local HTTP server answering POSTs with what the test sets, recording requests."""

    def __init__(self) -> None:
        self.status = 200
        self.body: Any = {}
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                stand_in.requests.append(json.loads(self.rfile.read(length)))
                stand_in.headers.append(dict(self.headers))
                payload = (
                    stand_in.body
                    if isinstance(stand_in.body, bytes)
                    else json.dumps(stand_in.body).encode()
                )
                self.send_response(stand_in.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    yield server
    server.stop()


def chat_answer(content: str, first_token: str = "", logprob: float = 0.0) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": content}}
    if first_token:
        choice["logprobs"] = {
            "content": [
                {
                    "token": first_token,
                    "logprob": logprob,
                    "top_logprobs": [{"token": first_token, "logprob": logprob}],
                }
            ]
        }
    return {"choices": [choice]}


def test_llama_guard_output_is_parsed_into_our_categories() -> None:
    assert parse_llama_guard("safe") == {}
    assert parse_llama_guard("\n\nunsafe\nS1,S10") == {"S1": 1.0, "S10": 1.0}
    assert parse_llama_guard("unsafe\nS9", confidence=0.7) == {"S9": 0.7}
    for garbage in ("", "maybe", "unsafe\nS99"):
        with pytest.raises(ClassifierError):
            parse_llama_guard(garbage)


def test_llama_guard_asks_a_worker_of_its_pool(stand_in: StandIn, settings: Any) -> None:
    settings.MODERATION_LLAMA_GUARD_POOL = "guard"
    pool = ModelPool.objects.create(name="guard", served_model="llama-guard-3-1b")
    Worker.objects.create(pool=pool, name="guard-1", url=stand_in.url, state=Worker.State.HEALTHY)
    # P("unsafe") = e^-0.2 = 0.82 from the first token's log-probability.
    stand_in.body = chat_answer("unsafe\nS11", first_token="unsafe", logprob=-0.2)
    classifier = LlamaGuardClassifier()
    classifier.refresh()

    scores = classifier.classify("I want to end it all")

    assert scores == {"S11": pytest.approx(0.8187, abs=1e-3)}
    request = stand_in.requests[0]
    assert request["model"] == "llama-guard-3-1b"
    assert request["messages"] == [{"role": "user", "content": "I want to end it all"}]
    assert request["temperature"] == 0 and request["logprobs"] is True

    stand_in.body = chat_answer("safe")
    assert classifier.classify("Hello") == {}


def test_llama_guard_faults_are_classifier_errors(stand_in: StandIn, settings: Any) -> None:
    settings.MODERATION_LLAMA_GUARD_POOL = "guard"
    classifier = LlamaGuardClassifier()
    classifier.refresh()
    with pytest.raises(ClassifierError, match="no healthy worker"):
        classifier.classify("text")

    pool = ModelPool.objects.create(name="guard", served_model="guard")
    Worker.objects.create(pool=pool, name="guard-1", url=stand_in.url, state=Worker.State.HEALTHY)
    classifier = LlamaGuardClassifier()
    classifier.refresh()
    stand_in.status, stand_in.body = 500, {"error": "boom"}
    with pytest.raises(ClassifierError, match="answered 500"):
        classifier.classify("text")
    stand_in.status, stand_in.body = 200, b"{not json"
    with pytest.raises(ClassifierError, match="unreadable"):
        classifier.classify("text")


def test_openai_moderation_scores_are_mapped(stand_in: StandIn, settings: Any) -> None:
    settings.MODERATION_OPENAI_URL = stand_in.url + "/v1"
    settings.MODERATION_OPENAI_API_KEY = "sk-test"
    stand_in.body = {
        "id": "modr-1",
        "model": "omni-moderation-latest",
        "results": [
            {
                "flagged": True,
                "categories": {},
                "category_scores": {
                    "harassment": 0.2,
                    "harassment/threatening": 0.9,
                    "hate": 0.05,
                    "sexual/minors": 0.01,
                    "self-harm/intent": 0.3,
                    "self-harm": 0.6,
                    "something-new": 0.99,
                },
            }
        ],
    }

    scores = OpenAIModerationClassifier().classify("a threat")

    assert scores == {
        "harassment": 0.9,
        "S1": 0.9,
        "S10": 0.05,
        "S4": 0.01,
        "S11": 0.6,
    }
    assert stand_in.requests[0] == {"model": "omni-moderation-latest", "input": "a threat"}
    assert stand_in.headers[0]["Authorization"] == "Bearer sk-test"


def test_openai_moderation_faults_are_classifier_errors(stand_in: StandIn, settings: Any) -> None:
    settings.MODERATION_OPENAI_URL = stand_in.url
    classifier = OpenAIModerationClassifier()
    stand_in.status, stand_in.body = 401, {"error": {"message": "bad key"}}
    with pytest.raises(ClassifierError, match="401"):
        classifier.classify("x")
    stand_in.status, stand_in.body = 200, {"results": []}
    with pytest.raises(ClassifierError, match="unreadable"):
        classifier.classify("x")
    settings.MODERATION_OPENAI_URL = "http://127.0.0.1:9"  # nothing listens there
    with pytest.raises(ClassifierError, match="unreachable"):
        classifier.classify("x")


def test_chained_backends_take_the_highest_score_and_name_who_spoke(
    stand_in: StandIn, settings: Any
) -> None:
    settings.MODERATION_OPENAI_URL = stand_in.url
    settings.MODERATION_BACKENDS = [
        "moderation.classifiers.local.LocalClassifier",
        "moderation.classifiers.openai_api.OpenAIModerationClassifier",
    ]
    stand_in.body = {"results": [{"category_scores": {"violence": 0.95, "hate": 0.1}}]}

    verdict = engine.evaluate("A calm sentence about gardening.", engine.policy())

    assert verdict.blocked == ["S1"]
    assert verdict.backends == ["local", "openai_moderation"]
    assert verdict.scores["S1"] == 0.95

    # Blocked by the first backend already: the second is not asked.
    asked = len(stand_in.requests)
    verdict = engine.evaluate("How do I make a bomb at home?", engine.policy())
    assert verdict.blocked == ["S9"] and verdict.backends == ["local"]
    assert len(stand_in.requests) == asked


def test_a_failing_backend_is_skipped_and_named(settings: Any) -> None:
    settings.MODERATION_BACKENDS = [
        "moderation.tests.test_backends.BrokenClassifier",
        "moderation.classifiers.local.LocalClassifier",
    ]
    settings.MODERATION_FAIL_CLOSED = False
    verdict = engine.evaluate("How do I make a bomb at home?", engine.policy())
    assert verdict.failed == ["broken"] and verdict.blocked == ["S9"]
    assert not verdict.unavailable
    settings.MODERATION_FAIL_CLOSED = True
    assert engine.evaluate("Hello", engine.policy()).unavailable


def test_local_backend_sees_through_digit_swaps_but_not_into_words() -> None:
    local = LocalClassifier()
    assert local.classify("how to make a b0mb")["S9"] == 1.0
    assert local.classify("Scunthorpe and Penistone are towns").get("harassment", 0) < 0.5
    assert "S4" in local.classify("a sexual story about a 12 year old")
