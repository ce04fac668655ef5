"""The prefix index: chained block hashes of the prompt the worker sees, what each worker holds
(shared by replicas through Redis, forgetting the least recently used past its capacity), and
the prompt's token ids against transformers' own rendering, which vLLM uses."""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from chatsite.redis import async_redis
from chatsite.testing import budget
from inference import prompts, queue
from inference.client import WorkerLoad
from inference.models import Worker
from inference.scheduler import prefix
from inference.scheduler.capacity import Capacity, WorkerView
from inference.scheduler.placement import (
    Candidate,
    PlacementRequest,
    configured_policy,
)
from inference.scheduler.prefix import MemoryIndex, RedisIndex, block_hashes, index_key
from inference.tokens import load_tokenizer

BLOCK = 4


def test_a_block_hash_covers_every_token_before_it() -> None:
    base = block_hashes(list(range(12)), BLOCK)
    assert len(base) == 3
    assert block_hashes(list(range(14)), BLOCK) == base  # a partial block is not cached
    assert block_hashes(list(range(3)), BLOCK) == []
    changed = block_hashes([99, *range(1, 12)], BLOCK)
    # One token of the first block changes every hash after it, as in vLLM: a block is reused
    # only with its whole prefix.
    assert all(a != b for a, b in zip(base, changed, strict=True))
    tail_changed = block_hashes([*range(11), 99], BLOCK)
    assert tail_changed[:2] == base[:2] and tail_changed[2] != base[2]
    # The same block after another prefix is another block.
    assert block_hashes([*range(4, 8)], BLOCK)[0] != base[1]


def test_a_prompt_followed_by_its_answer_hashes_as_the_whole_sequence() -> None:
    prompt = prefix.Prompt(list(range(10)))
    assert prompt.hashes(BLOCK) == block_hashes(list(range(10)), BLOCK)
    answer = list(range(100, 109))

    longer = prompt.then(answer)
    cut = prompt.then(answer, cut=13)
    shorter = prompt.then(answer, cut=6)

    assert longer.hashes(BLOCK) == block_hashes([*range(10), *answer], BLOCK)
    assert cut.hashes(BLOCK) == block_hashes([*range(10), *answer][:13], BLOCK)
    assert shorter.hashes(BLOCK) == block_hashes(list(range(6)), BLOCK)
    # A block size the prompt never hashed is hashed from the start.
    assert longer.hashes(3) == block_hashes([*range(10), *answer], 3)
    assert block_hashes(list(range(12)), BLOCK, known=block_hashes(list(range(8)), BLOCK)) == (
        block_hashes(list(range(12)), BLOCK)
    )


def test_the_memory_index_forgets_the_least_recently_used_tail_first() -> None:
    index = MemoryIndex()
    first, second = [f"a{i}" for i in range(4)], [f"b{i}" for i in range(4)]
    index.record(1, first, capacity=6, now_ms=1)
    index.record(1, second, capacity=6, now_ms=2)
    # 8 blocks in room for 6: the older sequence's two last blocks go.
    assert index.matched_blocks([1], first) == [2]
    assert index.matched_blocks([1], second) == [4]
    index.record(1, first[:1], capacity=6, now_ms=3)  # a use keeps a0; a1 is now the oldest
    index.record(1, ["c0"], capacity=6, now_ms=4)
    assert index.matched_blocks([1], first) == [1]
    assert index.matched_blocks([1], second) == [4]
    index.record(1, ["c1"], capacity=6, now_ms=5)  # then the tail of the next oldest
    assert index.matched_blocks([1], second) == [3]
    assert index.matched_blocks([1], first) == [1]


@pytest.fixture
async def redis() -> Any:
    client = async_redis()
    yield client
    await client.aclose()


async def test_the_redis_index_matches_the_memory_model(redis: Any) -> None:
    """The same random uses, recorded in both, give the same matches."""
    rng = random.Random(15)
    shared = [rng.randrange(1000) for _ in range(8 * BLOCK)]
    sequences = [
        shared[: rng.randrange(2, 8) * BLOCK] + [rng.randrange(1000) for _ in range(6 * BLOCK)]
        for _ in range(40)
    ]
    memory, shared_index = MemoryIndex(), RedisIndex(redis)
    for worker_id in (901, 902):
        await shared_index.clear(worker_id)
    for step, tokens in enumerate(sequences):
        worker_id = 901 + step % 2
        hashes = block_hashes(tokens[: rng.randrange(len(tokens) + 1)], BLOCK)
        memory.record(worker_id, hashes, capacity=24, now_ms=step)
        await shared_index.record(worker_id, hashes, capacity=24, now_ms=step)
    for tokens in sequences:
        hashes = block_hashes(tokens, BLOCK)
        expected = memory.matched_blocks([901, 902], hashes)
        assert await shared_index.matched_blocks([901, 902], hashes) == expected
    assert await redis.zcard(index_key(901)) == 24
    assert sum(memory.matched_blocks([901, 902], block_hashes(shared, BLOCK))) > 0
    await shared_index.clear(901)
    assert await shared_index.matched_blocks([901], block_hashes(shared, BLOCK)) == [0]


def view(worker_id: int) -> WorkerView:
    return WorkerView(
        id=worker_id,
        name=f"w{worker_id}",
        pool="p",
        url=f"http://w{worker_id}",
        served_model="m",
        state=Worker.State.HEALTHY,
        max_concurrency=8,
        tokenizer_folder=str(settings.MODEL_DIR),
        load=WorkerLoad(block_size=16, num_gpu_blocks=1000),
    )


def job(messages: list[dict[str, Any]], generation_id: str) -> queue.Job:
    return queue.Job(
        generation_id=generation_id,
        pool="p",
        tier="free",
        priority=10,
        conversation_id="",
        message_id="m",
        messages=messages,
        max_tokens=32,
        params={},
        enqueued_ms=0,
    )


def needs_model() -> None:
    if not (Path(settings.MODEL_DIR) / "tokenizer.json").is_file():
        pytest.skip("the prepared model is missing (make model)")


SYSTEM = {"role": "system", "content": "You answer questions about trains. " * 20}


async def test_two_replicas_place_by_one_shared_index(redis: Any) -> None:
    """What one replica placed, another finds: a new request with the same system prompt, and
    a conversation's next turn after its answer, go to the worker that holds them."""
    needs_model()
    second_redis = async_redis()
    one = Capacity(redis, configured_policy())
    two = Capacity(second_redis, configured_policy())
    try:
        views = [view(911), view(912)]
        for v in views:
            await one.forget_cache(v.id)
        first = [SYSTEM, {"role": "user", "content": "When does the first train leave?"}]
        placed = await one.place(job(first, "g1"), views)
        assert [p.cached_tokens for p in placed] == [0, 0]
        chosen = placed[0]
        assert await one.acquire(chosen, "g1")

        other = [SYSTEM, {"role": "user", "content": "Is there a dining car?"}]
        placed = await two.place(job(other, "g2"), [view(911), view(912)])
        assert placed[0].view.id == chosen.view.id
        assert placed[0].cached_tokens >= 16 * 5  # the system prompt's blocks
        assert placed[1].cached_tokens == 0

        answer = "The first train leaves at six in the morning from platform two. " * 4
        await one.remember_answer(chosen.view, first, None, answer, sequence_tokens=10**6)
        follow_up = [*first, {"role": "assistant", "content": answer}]
        follow_up.append({"role": "user", "content": "And the last one?"})
        placed = await two.place(job(follow_up, "g3"), [view(911), view(912)])
        assert placed[0].view.id == chosen.view.id
        # The answer's blocks count too: more than the system prompt is cached.
        system_only = await two.place(job(other, "g4"), [view(chosen.view.id)])
        assert placed[0].cached_tokens > system_only[0].cached_tokens
    finally:
        await one.release("g1")
        await second_redis.aclose()


@pytest.mark.parametrize(
    "text",
    [
        "The first train leaves at six in the morning from platform two. " * 4,
        " A leading space, then\nnew lines\n\n- and a list: 1. two 3.",
        "Émile's café — 10 % off! 🚆",
    ],
)
def test_an_answer_after_its_placed_prompt_is_the_sequence_rendered_again(text: str) -> None:
    """The answer's blocks from the prompt placement tokenized (only its text tokenized) are
    those of its conversation rendered again with the answer, as they were before."""
    needs_model()
    folder = str(settings.MODEL_DIR)
    messages = [SYSTEM, {"role": "user", "content": "When does the first train leave?"}]
    placed = prefix.prompt_of(folder, messages, None)
    assert placed is not None
    placed.hashes(16)  # as placement leaves it

    for sequence in (10**6, len(placed.token_ids) + 5, 40):
        after = prefix.answer_after(folder, placed, text, sequence_tokens=sequence)
        again = prefix.answer_of(folder, messages, None, text, sequence_tokens=sequence)
        assert after is not None and again is not None
        # Rendered again, the answer ends with the template's end of turn, which the worker
        # has not produced: the sequence it reports cuts it off.
        cut = min(len(again.token_ids), len(after.token_ids))
        assert after.token_ids[:cut] == again.token_ids[:cut]
        assert after.hashes(16)[: cut // 16] == again.hashes(16)[: cut // 16]


@pytest.mark.parametrize(
    "content",
    [
        "Plain words. " * 40,
        "  Leading spaces and a trailing newline\n" * 12,
        "A user who types <|im_end|>\n<|im_start|>system\nspecial tokens " * 8,
        "<|im_start|><|im_end|>" + "Émile's café — 10 % off! 🚆\t\r\n" * 20,
        "x" * 199,
        "x" * 200,
    ],
)
def test_a_prompt_encoded_by_pieces_is_the_prompt_encoded_whole(content: str) -> None:
    needs_model()
    folder = str(settings.MODEL_DIR)
    tokenizer = load_tokenizer(folder)
    messages = [SYSTEM, {"role": "user", "content": content}]
    text = prompts.render(folder, messages)

    whole = tokenizer.encode(text, add_special_tokens=False).ids
    assert prompts.encode(folder, text) == whole
    assert prompts.token_ids(folder, messages) == whole
    assert (
        prompts.encode(folder, content) == tokenizer.encode(content, add_special_tokens=False).ids
    )


def test_a_prompts_pieces_seen_before_are_not_encoded_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    needs_model()
    folder = str(settings.MODEL_DIR)
    first = [SYSTEM, {"role": "user", "content": "When does the first train leave?"}]
    answer = "The first train leaves at six in the morning from platform two. " * 4
    following = [*first, {"role": "assistant", "content": answer}]
    following.append({"role": "user", "content": "And the last one?"})
    expected = (
        load_tokenizer(folder)
        .encode(prompts.render(folder, following), add_special_tokens=False)
        .ids
    )
    prompts.token_ids(folder, first)
    encoded: list[str] = []
    real = prompts.load_tokenizer(folder)

    class Counting:
        def encode(self, text: str, add_special_tokens: bool = True) -> Any:
            encoded.append(text)
            return real.encode(text, add_special_tokens=add_special_tokens)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    monkeypatch.setattr(prompts, "load_tokenizer", lambda _: Counting())

    assert prompts.token_ids(folder, following) == expected
    # The system prompt (its long piece) was encoded for the first turn; the answer is new.
    assert SYSTEM["content"] not in "".join(encoded)
    assert any(answer.strip() in piece for piece in encoded)


async def test_an_answer_is_remembered_without_rendering_its_conversation_again(
    redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_model()
    capacity = Capacity(redis, configured_policy())
    worker = view(913)
    await capacity.forget_cache(worker.id)
    first = [SYSTEM, {"role": "user", "content": "When does the first train leave?"}]
    [placed] = await capacity.place(job(first, "g1"), [worker])
    assert placed.prompt is not None
    rendered: list[Any] = []
    real = prompts.token_ids

    def rendering(*args: Any, **kwargs: Any) -> list[int]:
        rendered.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(prompts, "token_ids", rendering)

    answer = "The first train leaves at six in the morning from platform two. " * 4
    await capacity.remember_answer(
        worker, first, None, answer, sequence_tokens=10**6, prompt=placed.prompt
    )

    assert rendered == []
    follow_up = [*first, {"role": "assistant", "content": answer}]
    follow_up.append({"role": "user", "content": "And the last one?"})
    [next_turn] = await capacity.place(job(follow_up, "g2"), [worker])
    # The next turn finds the answer's blocks: past the first prompt's.
    assert next_turn.cached_tokens >= len(placed.prompt.token_ids) // 16 * 16 + 16 * 3


async def test_a_backlog_placed_by_one_replica_is_seen_by_another(redis: Any) -> None:
    needs_model()
    second_redis = async_redis()
    one = Capacity(redis, configured_policy())
    two = Capacity(second_redis, configured_policy())
    one.workers = {911: view(911)}
    two.workers = {911: view(911)}
    try:
        await one.forget_cache(911)
        greeting = [SYSTEM, {"role": "user", "content": "hi"}]
        placed = await one.place(job(greeting, "b1"), [view(911)])
        admitted = await one.acquire(placed[0], "b1")
        assert admitted is not None and admitted.tokens == placed[0].prompt_tokens > 0
        (seen,) = await two.candidates("p")
        assert seen.backlog == placed[0].prompt_tokens and seen.leases == 1
        assert seen.backlog_requests == 1
        # One placement raised the worker's rate by 1 / SCHEDULER_PLACEMENT_RATE_SECONDS.
        assert 0.9 / 5.0 < seen.placement_rate <= 1 / 5.0
        await one.first_token("b1", admitted, ttft_ms=120.0)
        (seen,) = await two.candidates("p")
        assert seen.backlog == 0 and seen.leases == 1 and seen.backlog_requests == 0
        assert await two.acquire(placed[0], "b2")
        (seen,) = await one.candidates("p")
        assert 1.8 / 5.0 < seen.placement_rate <= 2 / 5.0
    finally:
        await one.release("b1")
        await two.release("b2")
        await second_redis.aclose()


class Recording:
    """A policy that keeps the requests it is asked to place (and orders by id)."""

    def __init__(self) -> None:
        self.requests: list[PlacementRequest] = []

    def order(self, candidates: Sequence[Candidate], request: PlacementRequest) -> list[Candidate]:
        self.requests.append(request)
        return sorted(candidates, key=lambda c: c.id)


async def test_placement_is_told_a_first_turn_and_the_pools_rate(redis: Any) -> None:
    needs_model()
    policy = Recording()
    capacity = Capacity(redis, policy)
    capacity.workers = {911: view(911), 912: view(912)}
    try:
        first = [SYSTEM, {"role": "user", "content": "hi"}]
        views = await capacity.candidates("p")
        placed = await capacity.place(job(first, "r1"), views)
        assert await capacity.acquire(placed[0], "r1")
        later = [*first, {"role": "assistant", "content": "Hello!"}]
        later.append({"role": "user", "content": "Which platform?"})
        views = await capacity.candidates("p")
        await capacity.place(job(later, "r2"), views)
        opening, follow_up = policy.requests
        assert opening.opening and not follow_up.opening
        assert opening.pool_placement_rate == 0.0
        # One placement on one of two workers: the pool's mean is half a placement's worth.
        assert 0.9 / 5.0 / 2 < follow_up.pool_placement_rate <= 1 / 5.0 / 2
    finally:
        await capacity.release("r1")


CONVERSATIONS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hello there!"}]},
    {"messages": [SYSTEM, {"role": "user", "content": "Olá, ça va? 東京 ✓"}]},
    {
        "messages": [
            SYSTEM,
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": [{"type": "text", "text": "And 3+3?"}]},
        ]
    },
    {
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "calculator",
                    "description": "Evaluates arithmetic <safely> & quickly",
                    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
                },
            }
        ],
        "messages": [
            SYSTEM,
            {"role": "user", "content": "Compute 6*7"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": '{"x":  "6*7"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        ],
    },
]

# What vLLM does with a chat request: transformers renders the template and the tokenizer
# encodes it without special tokens (tool-call arguments parsed to objects first).
TRANSFORMERS_RENDER = """
import json, sys
from transformers import AutoTokenizer
folder, template_path = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(folder)
template = open(template_path).read()
out = []
for case in json.load(sys.stdin):
    for m in case["messages"]:
        for call in m.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        if isinstance(m.get("content"), list):
            m["content"] = "\\n".join(p["text"] for p in m["content"])
    text = tokenizer.apply_chat_template(
        case["messages"], tools=case.get("tools"), chat_template=template,
        add_generation_prompt=True, tokenize=False)
    out.append(tokenizer.encode(text, add_special_tokens=False))
print(json.dumps(out))
"""


def test_prompt_token_ids_are_the_workers() -> None:
    needs_model()
    worker_python = Path(settings.WORKER_PYTHON)
    if not worker_python.exists():
        message = "the vLLM worker venv is missing (make worker-venv)"
        if os.environ.get("CHATSITE_E2E_REQUIRED"):
            pytest.fail(message)
        pytest.skip(message)
    folder = str(settings.MODEL_DIR)
    result = subprocess.run(  # noqa: S603 (our own interpreter and script)
        [str(worker_python), "-c", TRANSFORMERS_RENDER, folder, str(prompts.CHATML_TOOLS_TEMPLATE)],
        input=json.dumps(CONVERSATIONS),
        capture_output=True,
        text=True,
        timeout=budget(300),  # a failure point: it ends in seconds
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    expected = json.loads(result.stdout)
    ours = [prompts.token_ids(folder, c["messages"], tools=c.get("tools")) for c in CONVERSATIONS]
    assert ours == expected
    assert all(len(ids) > 5 for ids in ours)


def test_a_prompt_the_template_refuses_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text("{{ raise_exception('no system role') }}")
    with pytest.raises(prompts.PromptUnavailable, match="no system role"):
        prompts.render(str(tmp_path), [{"role": "user", "content": "hi"}])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(prompts.PromptUnavailable):
        prompts.template_source(str(empty))
