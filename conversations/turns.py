"""A chat turn end to end: the request path of ARCHITECTURE.md, steps 1-6, in one place.

The web chat, the JSON API and the OpenAI-compatible API all call these, so a message is
checked, stored and queued the same way whichever door it came through. The tree write and
the generation row share one transaction; the job reaches the queue only after it commits.

The steps, in order: accept (a suspended account is refused; billing judges once whether
the plan may use the model, and the output budget is clamped once), moderate the input,
persist the tree change, assemble the context, reserve (billing), enqueue (inference).
An `Idempotency-Key` replays the turn it already made (charged once); the reservation is
given back if the transaction fails. The way back out is `conversations.finish`.

With tracing on (`chatsite.tracing`), a turn is a `turn` span with one child per step
(`turn.accept`, `turn.moderate_input`, `turn.persist`, `turn.assemble`, `turn.reserve`,
`turn.enqueue`); once its generation exists, the request's log lines name it too.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.auth.models import User

from billing.models import Plan
from billing.quota import Limits
from billing.selectors import plan_for_user, plan_pool, pool_limits
from billing.services import (
    idempotency_claim,
    idempotency_complete,
    idempotency_fingerprint,
    idempotency_release,
    reservation_create,
    reservation_release,
)
from chatsite import dotted, logs, tracing
from chatsite.errors import ServiceError
from chatsite.memo import DigestMemo
from inference.models import Generation, ModelPool
from inference.selectors import generation_stream_kept
from inference.services import (
    GenerationRequest,
    generation_create,
    generation_enqueue,
    generation_new_unkept,
    pool_ensure_room_for_new,
    pool_named,
)
from inference.tokens import pool_tokenizer, pool_tokenizer_folder
from inference.unkept import UnkeptGeneration
from moderation.engine import Verdict
from moderation.models import Flag
from moderation.services import flag_record, moderation_check_input, moderation_ensure_can_send

from . import auto_model, services
from .attachment_context import attachment_context
from .auto_model import is_auto
from .context import AssembledContext, assemble_context, count_tokens
from .memory import personal_preamble
from .models import BranchSummary, Conversation, Message
from .removal import conversation_remove
from .selectors import active_branch
from .summaries import summary_for_branch
from .tasks import summary_request_if_needed

# Tokens a chat template adds around the tools it is given (the instructions that frame them).
TOOLS_OVERHEAD_TOKENS = 80


@dataclass(frozen=True)
class Turn:
    """What a send, edit or regenerate produced."""

    conversation: Conversation
    user_message: Message | None
    assistant_message: Message
    generation: Generation
    replayed: bool = False


def conversation_start(
    *,
    user: User,
    model: str | None = None,
    system_prompt: str = "",
    title: str = "",
    source: str = Conversation.Source.WEB,
) -> Conversation:
    """Start a conversation with a model the user's plan may use."""
    model = (model or settings.DEFAULT_MODEL).strip()
    # `auto` needs the small pool at least; a turn that would take the large one without the
    # plan including it gets the small one.
    pool = settings.AUTO_MODEL_SMALL if is_auto(model) else model
    plan_pool(plan=plan_for_user(user=user), pool=pool_named(model=pool))
    return services.conversation_create(
        owner=user,
        model=model,
        system_prompt=system_prompt,
        title=title,
        source=source,
        count_tokens=_token_counter(model),
    )


def turn_send(
    *,
    user: User,
    conversation: Conversation,
    content: str,
    parent: Message | Any | None = None,
    idempotency_key: str | None = None,
    attachment_ids: Sequence[Any] = (),
) -> Turn:
    """Add a user message under `parent` (default: the current leaf), carrying the files
    `attachment_ids` uploaded to the conversation, and queue its answer."""
    parent_id = parent.pk if isinstance(parent, Message) else parent
    request: dict[str, Any] = {
        "action": "send",
        "conversation": conversation.pk,
        "content": content,
        "parent": parent_id,
    }
    if attachment_ids:
        request["attachments"] = [str(pk) for pk in attachment_ids]
    return _queued_turn(
        user=user,
        conversation=conversation,
        write=lambda: services.message_send(
            conversation=conversation,
            content=content,
            parent=parent,
            count_tokens=_token_counter(conversation.model),
            attachment_ids=attachment_ids,
        ),
        content=content,
        idempotency_key=idempotency_key,
        request=request,
    )


def turn_edit(
    *, user: User, message: Message, content: str, idempotency_key: str | None = None
) -> Turn:
    """Fork at an earlier user message with new content and queue the new answer."""
    return _queued_turn(
        user=user,
        conversation=message.conversation,
        write=lambda: services.message_edit(
            message=message,
            content=content,
            count_tokens=_token_counter(message.conversation.model),
        ),
        content=content,
        idempotency_key=idempotency_key,
        request={"action": "edit", "message": message.pk, "content": content},
    )


def turn_regenerate(*, user: User, message: Message, idempotency_key: str | None = None) -> Turn:
    """Queue a new answer beside the assistant `message`."""
    return _queued_turn(
        user=user,
        conversation=message.conversation,
        write=lambda: services.message_regenerate(message=message),
        content=None,
        idempotency_key=idempotency_key,
        request={"action": "regenerate", "message": message.pk},
    )


_Write = Callable[[], services.Written]


def _token_counter(model: str) -> Callable[[str], int]:
    """Counts a text's tokens with `model`'s tokenizer (the large pool's for `auto`), for
    the tree writes that store a new message's count with it."""
    name = settings.AUTO_MODEL_LARGE if is_auto(model) else model
    pool = pool_named(model=name)
    tokenizer, folder = pool_tokenizer(pool), pool_tokenizer_folder(pool)

    def count(text: str) -> int:
        # A `/v1` request sends its earlier messages again with every turn: each is counted
        # once per process (`TOKEN_COUNTS`), not once per request.
        key = (folder, DigestMemo.digest(text))
        return TOKEN_COUNTS.of(key, lambda: count_tokens(tokenizer, text))

    return count


# Token counts of the texts the tree writes counted lately, by tokenizer.
TOKEN_COUNTS: DigestMemo[int] = DigestMemo(settings.TOKEN_COUNT_MEMO_ENTRIES)


def _auto_choice(
    *, plan: Plan, conversation: Conversation, content: str | None
) -> auto_model.Choice | None:
    """The pool the `auto` model writes this turn's answer with; None for another model. A
    choice the plan does not include falls back to the small pool."""
    if not is_auto(conversation.model):
        return None
    text = content or ""
    tokens = count_tokens(pool_tokenizer(pool_named(model=settings.AUTO_MODEL_LARGE)), text)
    if not conversation._state.adding:
        # The prompt grows with the conversation: its last answer's prompt, as counted then.
        last = (
            Generation.objects.filter(conversation=conversation, prompt_tokens__isnull=False)
            .order_by("-enqueued_at")
            .values_list("prompt_tokens", flat=True)
            .first()
        )
        tokens += last or 0
    facts = auto_model.TaskFacts(tier=plan.tier, text=text, prompt_tokens=tokens)
    choice = auto_model.configured_chooser().choose(facts)
    if choice.pool != settings.AUTO_MODEL_SMALL:
        try:
            plan_pool(plan=plan, pool=pool_named(model=choice.pool))
        except ServiceError:
            return auto_model.Choice(settings.AUTO_MODEL_SMALL, "plan_limit")
    return choice


def _auto_route(choice: auto_model.Choice | None) -> dict[str, str] | None:
    """The `auto` model's choice as the generation, its answer and its stream record it."""
    if choice is None:
        return None
    return {
        "model": choice.pool,
        "reason": f"auto_{choice.reason}",
        "notice": auto_model.notice(choice),
    }


@tracing.traced("turn")
def _queued_turn(
    *,
    user: User,
    conversation: Conversation,
    write: _Write,
    content: str | None,
    idempotency_key: str | None,
    request: dict[str, Any],
    max_tokens: int | None = None,
    params: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
    parts: Sequence[str] = (),
) -> Turn:
    """Run `write` (the tree change) and start its generation, once per idempotency key.

    `content` is the new user text the turn adds (None when it adds none, as a regenerate);
    `parts`, what it is made of when it is a `/v1` request's (`_client_parts`).
    `max_tokens` (at most the plan's) and `params` (sampling: temperature, top_p, stop) are
    the caller's wishes for the answer; `tools` and `tool_choice` a `/v1` client's own tools
    (`generation_start`).
    """
    options: dict[str, Any] = {
        "max_tokens": max_tokens,
        "params": params,
        "tools": tools,
        "tool_choice": tool_choice,
        "parts": parts,
    }
    return _once_per_key(
        user=user,
        idempotency_key=idempotency_key,
        request=request,
        run=lambda: _write_and_start(
            user=user, conversation=conversation, write=write, content=content, **options
        ),
        replay=_replay,
        result=lambda turn: {
            "conversation": str(turn.conversation.pk),
            "user_message": str(turn.user_message.pk) if turn.user_message else None,
            "assistant_message": str(turn.assistant_message.pk),
            "generation": str(turn.generation.pk),
        },
    )


_Made = TypeVar("_Made")


def _once_per_key(
    *,
    user: User,
    idempotency_key: str | None,
    request: dict[str, Any],
    run: Callable[[], _Made],
    replay: Callable[[dict[str, Any]], _Made | None],
    result: Callable[[_Made], dict[str, Any]],
) -> _Made:
    """`run` the turn once per idempotency key (every time without one): a retry with the
    key gets `replay` of what the first made (from its stored `result`), charged once. If
    that is gone (None), the request runs again, as it would without the key."""
    if idempotency_key is None:
        return run()
    fingerprint = idempotency_fingerprint(request)
    stored = idempotency_claim(user=user, key=idempotency_key, fingerprint=fingerprint)
    if stored is not None:
        replayed = replay(stored)
        if replayed is not None:
            return replayed
    try:
        made = run()
    except BaseException:
        idempotency_release(user=user, key=idempotency_key, fingerprint=fingerprint)
        raise
    idempotency_complete(
        user=user, key=idempotency_key, fingerprint=fingerprint, result=result(made)
    )
    return made


def _write_and_start(
    *,
    user: User,
    conversation: Conversation,
    write: _Write,
    content: str | None,
    max_tokens: int | None = None,
    params: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
    parts: Sequence[str] = (),
) -> Turn:
    # Moderation (issue 6), before anything is written or reserved: a suspended account is
    # refused every send, and a blocked text costs nothing and never reaches a worker. The
    # flag of a blocked text commits on its own here, so it survives the refusal.
    accepted = _accept(user=user, conversation=conversation, content=content, max_tokens=max_tokens)
    plan, pool, limits, max_tokens = (
        accepted.plan,
        accepted.pool,
        accepted.limits,
        accepted.max_tokens,
    )
    # A conversation written together with this turn has no row yet: a flag made before it
    # has none to point at (as after the conversation is removed on a refusal).
    saved = None if conversation._state.adding else conversation
    verdict = _moderate_input(user=user, conversation=saved, content=content, parts=parts)
    generation: Generation | None = None
    try:
        with services.turn_transaction():
            with tracing.span("turn.persist"):
                written = write()
            user_message, placeholder = written.user_message, written.placeholder
            generation = generation_start(
                message=placeholder,
                user=user,
                plan=plan,
                pool=pool,
                limits=limits,
                max_tokens=max_tokens,
                params=params,
                tools=tools,
                tool_choice=tool_choice,
                branch=written.branch,
                summaries=written.summaries,
                new_conversation=saved is None,
                route=_auto_route(accepted.choice),
            )
    except BaseException:
        if generation is not None:
            # The rows rolled back after the reservation was made: give it back now.
            reservation_release(user_id=user.pk, reservation_id=str(generation.pk))
        raise
    if user_message is not None:
        _flag_for_review(
            user=user,
            verdict=verdict,
            conversation=conversation,
            message=user_message,
            excerpt=user_message.content,
        )
    return Turn(conversation, user_message, placeholder, generation)


@dataclass(frozen=True)
class _Accepted:
    """What a turn's first step settled: the plan, the pool that answers (and why, for the
    `auto` model), the plan's limits there, and the answer's output budget."""

    plan: Plan
    choice: auto_model.Choice | None
    pool: ModelPool
    limits: Limits
    max_tokens: int


@tracing.traced("turn.accept")
def _accept(
    *, user: User, conversation: Conversation, content: str | None, max_tokens: int | None
) -> _Accepted:
    """Step 1: a suspended account is refused; billing judges once whether the plan may use
    the model; a new conversation may be turned away under pressure; the output budget is
    clamped to the plan's and the pool's."""
    moderation_ensure_can_send(user=user)
    plan = plan_for_user(user=user)
    choice = _auto_choice(plan=plan, conversation=conversation, content=content)
    pool = pool_named(model=choice.pool if choice else conversation.model)
    # Billing is the one judge of whether the plan may use the model (403 if not).
    limits = pool_limits(plan=plan, pool=pool)
    pool_ensure_room_for_new(
        pool=pool,
        tier=plan.tier,
        is_new=lambda: (
            conversation._state.adding
            or not Generation.objects.filter(conversation=conversation).exists()
        ),
    )
    wanted = max_tokens or plan.max_output_tokens
    return _Accepted(
        plan, choice, pool, limits, min(wanted, plan.max_output_tokens, pool.max_output_tokens)
    )


def _moderate_input(
    *,
    user: User,
    conversation: Conversation | None,
    content: str | None,
    parts: Sequence[str] = (),
) -> Verdict | None:
    """Step 2: the new text checked before anything is written or reserved (a blocked one
    raises); the verdict, which may ask for review, or None when nothing was checked.

    A message too long to send is refused by its write, unchecked. A `/v1` request's text
    is checked in its `parts`, every one of them, however long the whole."""
    unchecked = content is None or not content.strip() or len(content) > settings.MESSAGE_MAX_CHARS
    if not parts and unchecked:
        return None
    with tracing.span("turn.moderate_input"):
        return moderation_check_input(
            user=user, conversation=conversation, content=content or "", parts=parts
        )


def _flag_for_review(
    *, user: User, verdict: Verdict | None, conversation: Any, message: Any, excerpt: str
) -> None:
    """A new text the checks let through but asked staff to look at gets its flag."""
    if verdict is not None and verdict.needs_review:
        flag_record(
            user=user,
            conversation=conversation,
            message=message,
            direction=Flag.Direction.INPUT,
            excerpt=excerpt,
            verdict=verdict,
            action=Flag.Action.REVIEW,
        )


@cache
def _tools_provider(path: str) -> Callable[..., Any]:
    return dotted.load_callable("CONVERSATION_TOOLS_PROVIDER", path)


def conversation_tools(*, user: User, conversation: Conversation) -> list[dict[str, Any]]:
    """The tools (OpenAI's format) the model is offered in `conversation` for `user`, from
    `settings.CONVERSATION_TOOLS_PROVIDER` (the plugins' tools by default)."""
    provider = _tools_provider(settings.CONVERSATION_TOOLS_PROVIDER)
    return [spec.to_openai() for spec in provider(user=user, conversation=conversation)]


def generation_start(
    *,
    message: Message,
    user: User,
    plan: Plan,
    pool: ModelPool,
    limits: Limits,
    max_tokens: int,
    params: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
    branch: Sequence[Message] | None = None,
    summaries: Mapping[Any, BranchSummary] | None = None,
    new_conversation: bool = False,
    route: dict[str, str] | None = None,
) -> Generation:
    """Assemble the context for a queued assistant placeholder, reserve, and queue its
    generation after commit: steps 4-6 of a turn. `route`: why `pool` answers if it is not
    the conversation's (the `auto` model's choice), recorded on the generation and its answer
    and told in its stream.

    `branch`: the branch on screen as the tree change just wrote it (root first, ending with
    the placeholder; `services.Written`), taken as it is instead of read back, and
    `summaries`, those through its messages where the change read them with it. A
    `new_conversation` has no summary to look for.

    Without `tools`, the model is offered the tools this user may call in this conversation
    (`conversation_tools`), and the scheduler runs the calls it makes (the tool loop). With
    `tools` (OpenAI's format, from a `/v1` client) those are offered instead and the answer
    ends at the model's calls, which the client runs.
    """
    if message.role != Message.Role.ASSISTANT or message.status != Message.Status.QUEUED:
        raise ValueError("a generation starts from a queued assistant placeholder")
    conversation = message.conversation
    branch = list(branch) if branch is not None else active_branch(conversation=conversation)
    if not branch or branch[-1].pk != message.pk:
        raise ValueError("the placeholder must be the conversation's current leaf")
    branch = branch[:-1]
    prepared = _prepare(
        user=user,
        conversation=conversation,
        pool=pool,
        branch=branch,
        max_tokens=max_tokens,
        tools=tools,
        summary=None if new_conversation else summary_for_branch(branch=branch, known=summaries),
        attachments=None if new_conversation else attachment_context(branch=branch),
        # The owner's instructions and memory: web chat only, not `/v1` (memory.py).
        preamble=personal_preamble(user_id=conversation.owner_id)
        if conversation.source == Conversation.Source.WEB
        else (),
    )
    # Turns dropped that no summary covers: the branch's summary is due.
    summary_request_if_needed(
        conversation=conversation,
        leaf=branch[-1],
        context=prepared.context,
        budget_tokens=prepared.budget_tokens,
    )
    generation = generation_create(
        message_id=message.pk,
        conversation_id=conversation.pk,
        user=user,
        pool=pool,
        tier=plan.tier,
        max_tokens=max_tokens,
        route_reason=route["reason"] if route else "",
    )
    if route:
        services.answers_set_route(answers=Message.objects.filter(pk=message.pk), route=route)
    _reserve_and_enqueue(
        generation,
        prepared,
        limits=limits,
        params=params,
        tool_choice=tool_choice,
        # A `/v1` client named its model: only the web chat's answers may fall back.
        may_fall_back=conversation.source == Conversation.Source.WEB,
        route=route,
    )
    return generation


@dataclass(frozen=True)
class _Prepared:
    """Step 4's result: the context in the window, the tools offered (and who runs them),
    and the prompt's count."""

    context: AssembledContext
    tools: list[dict[str, Any]]
    run_tools: bool
    prompt_tokens: int
    budget_tokens: int


def _prepare(
    *,
    user: User,
    conversation: Conversation,
    pool: ModelPool,
    branch: Sequence[Message],
    max_tokens: int,
    tools: list[dict[str, Any]] | None,
    summary: Any,
    attachments: Any,
    preamble: Sequence[Any],
) -> _Prepared:
    """Assemble the context of the answer to `branch` (root first, without the placeholder)
    within the pool's window, with room for the answer and the tools."""
    tokenizer = pool_tokenizer(pool)
    run_tools = tools is None
    if tools is None:
        tools = conversation_tools(user=user, conversation=conversation)
    # The template writes the tools into the prompt: they take room in the window.
    tools_tokens = (
        count_tokens(tokenizer, json.dumps(tools)) + TOOLS_OVERHEAD_TOKENS if tools else 0
    )
    budget_tokens = pool.context_window - max_tokens - tools_tokens
    with tracing.span("turn.assemble"):
        context = assemble_context(
            branch=list(branch),
            tokenizer=tokenizer,
            budget_tokens=budget_tokens,
            summary=summary,
            attachments=attachments,
            preamble=preamble,
        )
    return _Prepared(context, tools, run_tools, context.prompt_tokens + tools_tokens, budget_tokens)


def _reserve_and_enqueue(
    generation: Generation | UnkeptGeneration,
    prepared: _Prepared,
    *,
    limits: Limits,
    params: dict[str, Any] | None,
    tool_choice: str | dict[str, Any] | None,
    may_fall_back: bool,
    route: dict[str, str] | None,
    relay: bool = False,
) -> None:
    """Steps 5 and 6: reserve the prompt estimate plus max output tokens against every limit
    of the plan at once (a refusal, 413 or 429, ends the turn), then queue the job."""
    # The rest of the request logs with it, and the turn's span names it.
    logs.generation_id.set(str(generation.id))
    tracing.annotate(
        **{
            "chatsite.generation_id": str(generation.id),
            "chatsite.request_id": logs.request_id.get() or "",
        }
    )
    with tracing.span("turn.reserve"):
        reservation_create(
            generation=generation, prompt_tokens=prepared.prompt_tokens, limits=limits
        )
    generation_enqueue(
        generation=generation,
        request=GenerationRequest(
            messages=prepared.context.messages,
            prompt_tokens=prepared.prompt_tokens,
            params=params or {},
            tools=prepared.tools,
            tool_choice=tool_choice,
            run_tools=prepared.run_tools,
            may_fall_back=may_fall_back,
            route=route,
            relay=relay,
        ),
    )


def _replay(stored: dict[str, Any]) -> Turn | None:
    """The turn an idempotency key already made, or None if it no longer exists."""
    generation = (
        Generation.objects.select_related("conversation", "message")
        .filter(pk=stored["generation"])
        .first()
    )
    if generation is None:
        return None
    user_message = (
        Message.objects.filter(pk=stored["user_message"]).first()
        if stored["user_message"]
        else None
    )
    return Turn(generation.conversation, user_message, generation.message, generation, True)


@dataclass(frozen=True)
class UnkeptTurn:
    """A `/v1` turn of a key that keeps nothing: its answer, queued, and nothing written."""

    generation: UnkeptGeneration
    replayed: bool = False
    # Whether the caller reads the answer from the worker itself (inference/relay.py), and
    # the prompt as the worker is asked it, which it then sends.
    relay: bool = False
    messages: list[dict[str, Any]] = field(default_factory=list)


def turn_unkept(
    *,
    user: User,
    model: str,
    system_prompt: str,
    messages: Sequence[services.BranchTurn],
    max_tokens: int | None = None,
    params: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
    idempotency_key: str | None = None,
    relay: bool = False,
) -> UnkeptTurn:
    """`turn_from_messages` for a key that keeps nothing: the same steps but the third.

    With `relay` the caller reads the worker's stream itself once the scheduler has placed
    the answer (inference/relay.py), unless the model is offered tools (the client's, or the
    user's plugins): the turn's `relay` says which. A replay never relays.

    The request is accepted, moderated, assembled, reserved and queued from what it carries;
    no conversation, message or generation row is written (nothing is created to be deleted),
    and the answer's life is in Redis (inference/unkept.py). What lasts of it (its usage, a
    moderation flag) is written by the subscribers, the usage in batches. An
    `Idempotency-Key` replays the answer it made while that answer's stream is kept.
    """
    conversation = services.conversation_new(
        owner=user,
        model=model or None,
        system_prompt=system_prompt,
        source=Conversation.Source.API,
    )
    written = services.branch_new(
        conversation=conversation,
        messages=messages,
        count_tokens=_token_counter(conversation.model),
    )
    return _once_per_key(
        user=user,
        idempotency_key=idempotency_key,
        request=_messages_request(
            model, system_prompt, messages, max_tokens, params, tools, tool_choice
        ),
        run=lambda: _unkept_start(
            user=user,
            conversation=conversation,
            branch=written.branch[:-1],
            parts=_client_parts(system_prompt, messages),
            max_tokens=max_tokens,
            params=params,
            tools=tools,
            tool_choice=tool_choice,
            relay=relay,
        ),
        replay=lambda stored: _unkept_replay(stored, user=user),
        result=lambda turn: {
            "generation": str(turn.generation.id),
            "unkept": True,
            "pool": turn.generation.pool.name,
            "tier": turn.generation.tier,
            "max_tokens": turn.generation.max_tokens,
        },
    )


def _client_parts(system_prompt: str, messages: Sequence[services.BranchTurn]) -> tuple[str, ...]:
    """All the text a `/v1` request carries, by part: the client's own, so all of it goes to
    the input checks, which remember the parts that come back with every turn."""
    return tuple(part for part in [system_prompt, *(m[1] for m in messages)] if part.strip())


@tracing.traced("turn")
def _unkept_start(
    *,
    user: User,
    conversation: Conversation,
    branch: Sequence[Message],
    parts: tuple[str, ...],
    max_tokens: int | None,
    params: dict[str, Any] | None,
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    relay: bool,
) -> UnkeptTurn:
    content = "\n\n".join(parts)
    accepted = _accept(user=user, conversation=conversation, content=content, max_tokens=max_tokens)
    verdict = _moderate_input(user=user, conversation=None, content=content, parts=parts)
    prepared = _prepare(
        user=user,
        conversation=conversation,
        pool=accepted.pool,
        branch=branch,
        max_tokens=accepted.max_tokens,
        tools=tools,
        summary=None,
        attachments=None,
        preamble=(),
    )
    # Tool calls, the client's or the plugins', need the scheduler's tool loop.
    relay = relay and not prepared.tools
    generation = generation_new_unkept(
        user=user, pool=accepted.pool, tier=accepted.plan.tier, max_tokens=accepted.max_tokens
    )
    _reserve_and_enqueue(
        generation,
        prepared,
        limits=accepted.limits,
        params=params,
        tool_choice=tool_choice,
        may_fall_back=False,
        route=_auto_route(accepted.choice),
        relay=relay,
    )
    excerpt = parts[verdict.part] if verdict is not None and parts else content
    _flag_for_review(user=user, verdict=verdict, conversation=None, message=None, excerpt=excerpt)
    return UnkeptTurn(generation, relay=relay, messages=prepared.context.messages)


def _unkept_replay(stored: dict[str, Any], *, user: User) -> UnkeptTurn | None:
    """The answer an idempotency key already made, while its stream is kept; None if it is
    gone (or the key made a kept turn then)."""
    if not stored.get("unkept") or not generation_stream_kept(generation_id=stored["generation"]):
        return None
    generation = generation_new_unkept(
        user=user,
        pool=pool_named(model=stored["pool"]),
        tier=stored["tier"],
        max_tokens=int(stored["max_tokens"]),
        generation_id=uuid.UUID(stored["generation"]),
    )
    return UnkeptTurn(generation, replayed=True)


def _messages_request(
    model: str,
    system_prompt: str,
    messages: Sequence[services.BranchTurn],
    max_tokens: int | None,
    params: dict[str, Any] | None,
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
) -> dict[str, Any]:
    """A `/v1` request as its idempotency fingerprint reads it."""
    return {
        "action": "messages",
        "model": model,
        "system_prompt": system_prompt,
        "messages": [list(message) for message in messages],
        "max_tokens": max_tokens,
        "params": params,
        "tools": tools,
        "tool_choice": tool_choice,
    }


def turn_from_messages(
    *,
    user: User,
    model: str,
    system_prompt: str,
    messages: Sequence[services.BranchTurn],
    max_tokens: int | None = None,
    params: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> Turn:
    """A new conversation from a client that sends the whole of it with every request (the
    OpenAI-compatible API), and its answer queued.

    `messages` are the user, assistant and tool turns, oldest first, ending with the user
    turn to answer or the results of the client's tool calls (see
    `services.conversation_write_new_branch`); `tools` and `tool_choice` the client's own tools,
    whose calls end the answer for the client to run. The turns become one linear branch
    under the `system_prompt`, in a conversation marked as coming from the API. The turn
    takes the same path as the web chat's: plan, input checks, reservation, scheduler. On a
    refusal the conversation is removed again, so a refused request leaves nothing behind.
    """
    # The conversation is written with the turn, in its transaction: a refusal before or in
    # it leaves nothing behind; a failure after it (recording a flag for review, or the
    # idempotency key's result) removes it.
    parts = _client_parts(system_prompt, messages)
    conversation = services.conversation_new(
        owner=user,
        model=model or None,
        system_prompt=system_prompt,
        source=Conversation.Source.API,
    )

    def write() -> services.Written:
        return services.conversation_write_new_branch(
            conversation=conversation,
            messages=messages,
            count_tokens=_token_counter(conversation.model),
        )

    try:
        turn = _queued_turn(
            user=user,
            conversation=conversation,
            write=write,
            content="\n\n".join(parts),
            parts=parts,
            idempotency_key=idempotency_key,
            request=_messages_request(
                model, system_prompt, messages, max_tokens, params, tools, tool_choice
            ),
            max_tokens=max_tokens,
            params=params,
            tools=tools,
            tool_choice=tool_choice,
        )
    except BaseException:
        if not conversation._state.adding:
            conversation_remove(conversation=conversation, keep_tombstone=False)
        raise
    return turn
