"""Attachments: upload and its refusals, text and PDF extraction, ownership, sending with a
message, deletion with the conversation, and their text in the model's context."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings
from rest_framework.test import APIClient

from chatsite.redis import sync_redis
from chatsite.testing import assert_error
from conversations import attachment_context, attachment_tasks
from conversations.attachment_context import AttachmentContext, attachments_on_branch
from conversations.attachments import attachment_upload
from conversations.context import assemble_context, count_tokens
from conversations.models import Attachment, Conversation, Message
from conversations.removal import conversation_remove
from conversations.selectors import active_branch
from conversations.services import message_send
from inference import queue
from inference.models import ModelPool
from inference.tokens import pool_tokenizer

from .attachment_files import PNG_BYTES, encrypted_pdf, pdf_with_text, pdf_without_text
from .factories import ConversationFactory, sent

pytestmark = pytest.mark.django_db

API = "/api/v1/conversations"


@pytest.fixture
def conversation(user: Any) -> Conversation:
    return ConversationFactory.create(owner=user)


def upload(
    client: APIClient, conversation: Conversation, name: str, data: bytes, **extra: Any
) -> Any:
    return client.post(
        f"{API}/{conversation.pk}/attachments",
        {"file": SimpleUploadedFile(name, data)},
        format="multipart",
        **extra,
    )


def send(
    client: APIClient, conversation: Conversation, content: str, ids: list[str], **extra: Any
) -> Any:
    return client.post(
        f"{API}/{conversation.pk}/messages",
        {"content": content, "attachment_ids": ids},
        format="json",
        **extra,
    )


def job_messages(generation_id: Any) -> list[dict[str, Any]]:
    raw = sync_redis().hget(queue.job_key(generation_id), "messages")
    assert raw is not None, "the generation was not queued"
    return list(json.loads(str(raw)))


def answer_all(conversation: Conversation) -> None:
    """Stand in for the inference plane: every queued answer completes."""
    Message.objects.filter(conversation=conversation, role="assistant").update(
        status="complete", content="Noted."
    )


# Upload and extraction


def test_a_text_file_uploads_with_its_text_chunks_and_vectors(
    api_client: APIClient, conversation: Conversation
) -> None:
    response = upload(api_client, conversation, "notes.txt", "Café au lait.\n".encode())

    assert response.status_code == 201
    body = response.json()
    assert (body["name"], body["kind"], body["size"], body["message_id"]) == (
        "notes.txt",
        "text",
        15,
        None,
    )
    assert body["url"] == f"{API}/{conversation.pk}/attachments/{body['id']}/content"
    attachment = Attachment.objects.get(pk=body["id"])
    assert attachment.text == "Café au lait.\n"
    assert bytes(attachment.data) == "Café au lait.\n".encode()
    assert attachment.chunks == [[0, 14]]
    assert attachment.embeddings is not None and len(attachment.embeddings) == 384 * 4


def test_markdown_is_told_by_its_name_and_read_as_text(
    api_client: APIClient, conversation: Conversation
) -> None:
    body = upload(api_client, conversation, "README.md", b"# Title\n\nSome *text*.").json()
    assert body["kind"] == "markdown"
    assert Attachment.objects.get(pk=body["id"]).text == "# Title\n\nSome *text*."


def test_a_pdf_has_its_text_extracted(api_client: APIClient, conversation: Conversation) -> None:
    pdf = pdf_with_text("Quarterly report (draft)", "Revenue grew by nine percent.")

    body = upload(api_client, conversation, "report.pdf", pdf).json()

    assert body["kind"] == "pdf"
    text = Attachment.objects.get(pk=body["id"]).text
    assert "Quarterly report (draft)" in text
    assert "Revenue grew by nine percent." in text


def test_the_type_is_judged_by_content_not_by_the_name(
    api_client: APIClient, conversation: Conversation
) -> None:
    # An image called .txt is refused; text called .pdf is text; a PDF called .txt is a PDF.
    assert_error(
        upload(api_client, conversation, "notes.txt", PNG_BYTES), 415, "unsupported_attachment"
    )
    assert upload(api_client, conversation, "fake.pdf", b"plain words").json()["kind"] == "text"
    pdf = pdf_with_text("Hidden PDF")
    assert upload(api_client, conversation, "plain.txt", pdf).json()["kind"] == "pdf"


def test_text_that_quotes_a_pdf_header_is_text_and_junk_before_a_pdf_is_allowed(
    api_client: APIClient, conversation: Conversation
) -> None:
    quoting = b"# PDF notes\n\nA PDF file starts with %PDF-1.7 and ends with %%EOF.\n"
    assert upload(api_client, conversation, "notes.md", quoting).json()["kind"] == "markdown"
    prefixed = b"\xff\xfe junk\n" + pdf_with_text("After the junk")
    body = upload(api_client, conversation, "odd.pdf", prefixed).json()
    assert body["kind"] == "pdf"
    assert Attachment.objects.get(pk=body["id"]).text == "After the junk"


@pytest.mark.parametrize(
    "data",
    [b"caf\xe9 latin-1", b"text with a \x00 NUL"],
    ids=["not-utf8", "nul-byte"],
)
def test_text_that_is_not_clean_utf8_is_refused(
    api_client: APIClient, conversation: Conversation, data: bytes
) -> None:
    body = assert_error(
        upload(api_client, conversation, "x.txt", data), 415, "unsupported_attachment"
    )
    assert "neither UTF-8 text nor a PDF" in body["message"]
    assert not Attachment.objects.exists()


@pytest.mark.parametrize(
    ("name", "data", "code"),
    [
        ("broken.pdf", b"%PDF-1.4\nthis is no pdf at all", "unreadable_pdf"),
        ("scan.pdf", pdf_without_text(), "no_text_in_attachment"),
        ("locked.pdf", encrypted_pdf(), "encrypted_pdf"),
        ("empty.txt", b"", "no_text_in_attachment"),
        ("blank.md", b"  \n\n ", "no_text_in_attachment"),
    ],
)
def test_a_file_with_no_text_to_read_is_a_422(
    api_client: APIClient, conversation: Conversation, name: str, data: bytes, code: str
) -> None:
    assert_error(upload(api_client, conversation, name, data), 422, code)
    assert not Attachment.objects.exists()


@override_settings(ATTACHMENT_MAX_BYTES=1000)
def test_a_file_over_the_size_limit_is_a_413(
    api_client: APIClient, conversation: Conversation
) -> None:
    body = assert_error(
        upload(api_client, conversation, "big.txt", b"a" * 1001), 413, "attachment_too_large"
    )
    assert body["detail"] == {"max_bytes": 1000, "bytes": 1001}
    assert upload(api_client, conversation, "ok.txt", b"a" * 1000).status_code == 201


@override_settings(ATTACHMENT_MAX_BYTES=1000)
def test_an_upload_far_over_the_limit_is_refused_before_it_is_read(
    api_client: APIClient, conversation: Conversation
) -> None:
    # Past the API's body limit too: the middleware answers, in the same shape.
    response = upload(api_client, conversation, "huge.txt", b"a" * (3 * 1024 * 1024))
    assert response.status_code == 413
    assert response.json()["error"]["code"] in {"attachment_too_large", "request_too_large"}


def test_an_upload_may_be_larger_than_other_api_bodies(
    api_client: APIClient, conversation: Conversation, settings: Any
) -> None:
    data = b"word " * (settings.API_MAX_BODY_BYTES // 5 + 100_000)
    assert len(data) > settings.API_MAX_BODY_BYTES

    response = upload(api_client, conversation, "long.txt", data)

    assert response.status_code == 201, response.content
    assert response.json()["size"] == len(data)
    # Any other request that large is still refused before it is read.
    too_large = api_client.post(
        f"{API}/{conversation.pk}/messages", data, content_type="application/json"
    )
    assert_error(too_large, 413, "request_too_large")


@override_settings(ATTACHMENTS_MAX_BYTES_PER_CONVERSATION=2500)
def test_the_files_of_a_conversation_have_a_total_cap(
    api_client: APIClient, conversation: Conversation
) -> None:
    assert upload(api_client, conversation, "a.txt", b"a" * 1500).status_code == 201
    assert_error(
        upload(api_client, conversation, "b.txt", b"b" * 1001), 413, "attachments_too_large"
    )
    assert upload(api_client, conversation, "c.txt", b"c" * 1000).status_code == 201


def test_an_upload_without_a_file_is_a_400(
    api_client: APIClient, conversation: Conversation
) -> None:
    response = api_client.post(f"{API}/{conversation.pk}/attachments", {}, format="multipart")
    assert_error(response, 400, "no_file")


def test_a_name_is_kept_without_folders_or_control_characters(
    conversation: Conversation,
) -> None:
    attachment = attachment_upload(
        conversation=conversation, name="../../etc/pa\x1bss\nwd.txt", data=b"hello"
    )
    assert attachment.name == "passwd.txt"


@override_settings(ATTACHMENT_SYNC_EMBED_CHUNKS=1, ATTACHMENT_CHUNK_CHARS=100)
def test_a_large_file_is_embedded_by_a_task_after_commit(
    conversation: Conversation, django_capture_on_commit_callbacks: Any, monkeypatch: Any
) -> None:
    queued: list[str] = []
    monkeypatch.setattr(attachment_tasks.embed_attachment, "delay", queued.append)
    text = " ".join(f"Sentence number {i} of a long file." for i in range(40))

    with django_capture_on_commit_callbacks(execute=True):
        attachment = attachment_upload(
            conversation=conversation, name="long.txt", data=text.encode()
        )

    assert attachment.embeddings is None
    assert queued == [str(attachment.pk)]
    assert attachment_tasks.embed_attachment(str(attachment.pk)) is True
    vectors = Attachment.objects.get(pk=attachment.pk).embeddings
    assert vectors is not None and len(vectors) == len(attachment.chunks) * 384 * 4
    assert attachment_tasks.embed_attachment(str(attachment.pk)) is False  # done already


# Ownership and CSRF


def test_another_users_conversation_and_files_are_404(
    api_client: APIClient, other_api_client: APIClient, conversation: Conversation
) -> None:
    mine = upload(api_client, conversation, "mine.txt", b"secret").json()
    url = f"{API}/{conversation.pk}/attachments/{mine['id']}"

    assert_error(upload(other_api_client, conversation, "x.txt", b"hi"), 404, "not_found")
    assert_error(other_api_client.get(url), 404, "not_found")
    assert_error(other_api_client.get(f"{url}/content"), 404, "not_found")
    assert_error(other_api_client.delete(url), 404, "not_found")
    assert Attachment.objects.filter(pk=mine["id"]).exists()


def test_a_file_of_another_users_conversation_cannot_be_sent(
    api_client: APIClient, user: Any, other_user: Any, other_api_client: APIClient
) -> None:
    theirs = ConversationFactory.create(owner=other_user)
    their_file = upload(other_api_client, theirs, "theirs.txt", b"their secret").json()
    mine = ConversationFactory.create(owner=user)

    response = send(api_client, mine, "Read this", [their_file["id"]])

    assert_error(response, 404, "unknown_attachment")
    assert Attachment.objects.get(pk=their_file["id"]).message_id is None
    assert not Message.objects.filter(conversation=mine, role="user").exists()


def test_the_owner_downloads_the_file_as_uploaded(
    api_client: APIClient, conversation: Conversation
) -> None:
    pdf = pdf_with_text("Download me")
    body = upload(api_client, conversation, "rapport é.pdf", pdf).json()

    response = api_client.get(body["url"])

    assert response.status_code == 200
    assert response.content == pdf
    assert response["Content-Type"] == "application/pdf"
    assert response["Content-Disposition"].startswith("attachment;")
    assert "filename*=UTF-8''rapport%20%C3%A9.pdf" in response["Content-Disposition"]
    assert response["X-Content-Type-Options"] == "nosniff"


def test_session_uploads_and_discards_need_csrf(
    session_client: APIClient, conversation: Conversation
) -> None:
    assert upload(session_client, conversation, "a.txt", b"hello").status_code == 403
    assert not Attachment.objects.exists()
    session_client.get("/")
    token = str(session_client.cookies["csrftoken"].value)
    body = upload(session_client, conversation, "a.txt", b"hello", HTTP_X_CSRFTOKEN=token).json()
    url = f"{API}/{conversation.pk}/attachments/{body['id']}"
    assert session_client.delete(url).status_code == 403
    assert session_client.delete(url, HTTP_X_CSRFTOKEN=token).status_code == 204
    assert not Attachment.objects.exists()


# Sending


def test_a_sent_message_carries_its_files(
    api_client: APIClient, conversation: Conversation
) -> None:
    first = upload(api_client, conversation, "a.txt", b"alpha").json()
    second = upload(api_client, conversation, "b.pdf", pdf_with_text("beta")).json()

    response = send(api_client, conversation, "Compare these", [first["id"], second["id"]])

    assert response.status_code == 201
    sent_message = response.json()["user_message"]
    assert [(a["name"], a["kind"]) for a in sent_message["attachments"]] == [
        ("a.txt", "text"),
        ("b.pdf", "pdf"),
    ]
    detail = api_client.get(f"{API}/{conversation.pk}").json()
    user_turn = next(m for m in detail["messages"] if m["role"] == "user")
    assert [a["id"] for a in user_turn["attachments"]] == [first["id"], second["id"]]
    assert {a["message_id"] for a in user_turn["attachments"]} == {sent_message["id"]}
    # Sent: it stays with its message, and cannot be sent again.
    url = f"{API}/{conversation.pk}/attachments/{first['id']}"
    assert_error(api_client.delete(url), 409, "attachment_already_sent")
    answer_all(conversation)
    assert_error(send(api_client, conversation, "Again", [first["id"]]), 404, "unknown_attachment")


def test_the_files_keep_the_order_the_send_names_them_in(
    api_client: APIClient, conversation: Conversation, django_capture_on_commit_callbacks: Any
) -> None:
    first = upload(api_client, conversation, "first.txt", b"Uploaded first.").json()
    second = upload(api_client, conversation, "second.txt", b"Uploaded second.").json()

    with django_capture_on_commit_callbacks(execute=True):
        response = send(api_client, conversation, "Both", [second["id"], first["id"]])

    names = ["second.txt", "first.txt"]
    assert [a["name"] for a in response.json()["user_message"]["attachments"]] == names
    detail = api_client.get(f"{API}/{conversation.pk}").json()
    user_turn = next(m for m in detail["messages"] if m["role"] == "user")
    assert [a["name"] for a in user_turn["attachments"]] == names
    files = job_messages(response.json()["generation"]["id"])[1]["content"]
    assert files.index("Uploaded second.") < files.index("Uploaded first.")


@override_settings(ATTACHMENTS_MAX_PER_MESSAGE=2)
def test_too_many_files_on_one_message_is_a_413(
    api_client: APIClient, conversation: Conversation
) -> None:
    ids = [upload(api_client, conversation, f"{i}.txt", b"x").json()["id"] for i in range(3)]

    body = assert_error(send(api_client, conversation, "All", ids), 413, "too_many_attachments")

    assert body["detail"] == {"max_attachments": 2, "attachments": 3}
    assert not Attachment.objects.filter(message__isnull=False).exists()
    assert not Message.objects.filter(conversation=conversation, role="user").exists()


def test_a_bad_attachment_id_is_a_400(api_client: APIClient, conversation: Conversation) -> None:
    response = send(api_client, conversation, "Hi", ["nope"])
    error = assert_error(response, 400, "invalid")
    assert error["detail"] == {"attachment_ids": {"0": ["Must be a valid UUID."]}}


def test_an_edit_carries_the_files_of_the_message_it_replaces(
    api_client: APIClient, conversation: Conversation, django_capture_on_commit_callbacks: Any
) -> None:
    attachment = upload(api_client, conversation, "a.txt", b"The code word is heron.").json()
    first = send(api_client, conversation, "Read this", [attachment["id"]]).json()
    answer_all(conversation)

    with django_capture_on_commit_callbacks(execute=True):
        response = api_client.post(
            f"{API}/{conversation.pk}/messages/{first['user_message']['id']}/edit",
            {"content": "Read this again"},
            format="json",
        )

    edited = response.json()["user_message"]
    assert [a["name"] for a in edited["attachments"]] == ["a.txt"]
    assert edited["attachments"][0]["id"] != attachment["id"]
    messages = job_messages(response.json()["generation"]["id"])
    assert "The code word is heron." in messages[1]["content"]
    # The old branch keeps its own file.
    assert Attachment.objects.get(pk=attachment["id"]).message_id is not None
    assert Attachment.objects.filter(conversation=conversation).count() == 2


# Deletion with the conversation


def test_deleting_the_conversation_deletes_its_files_sent_or_not(
    api_client: APIClient, conversation: Conversation
) -> None:
    sent_file = upload(api_client, conversation, "sent.txt", b"sent").json()
    upload(api_client, conversation, "pending.txt", b"pending")
    send(api_client, conversation, "Here", [sent_file["id"]])
    assert Attachment.objects.filter(conversation=conversation).count() == 2

    assert api_client.delete(f"{API}/{conversation.pk}").status_code == 204

    assert not Attachment.objects.exists()
    assert_error(api_client.get(sent_file["url"]), 404, "not_found")


def test_dropping_an_unkept_conversation_drops_its_files(conversation: Conversation) -> None:
    attachment = attachment_upload(conversation=conversation, name="a.txt", data=b"alpha")
    message_send(conversation=conversation, content="Hi", attachment_ids=[attachment.pk])

    conversation_remove(conversation=conversation, keep_tombstone=False)

    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Attachment.objects.exists()


# The model's context


def test_a_small_file_enters_the_context_verbatim_after_the_system_prompt(
    api_client: APIClient, conversation: Conversation, django_capture_on_commit_callbacks: Any
) -> None:
    pdf = pdf_with_text("The launch code is 4471.")
    attachment = upload(api_client, conversation, "codes.pdf", pdf).json()

    with django_capture_on_commit_callbacks(execute=True):
        response = send(api_client, conversation, "What is the launch code?", [attachment["id"]])

    messages = job_messages(response.json()["generation"]["id"])
    assert [m["role"] for m in messages] == ["system", "system", "user"]
    assert messages[0]["content"] == conversation.system_prompt
    assert messages[1]["content"] == (
        "The user attached these files:\n\n--- codes.pdf ---\nThe launch code is 4471."
    )
    assert messages[2]["content"] == "What is the launch code?"
    # Counted in the prompt's tokens (and so reserved and billed).
    generation_id = response.json()["generation"]["id"]
    tokenizer = pool_tokenizer(ModelPool.objects.get(name=conversation.model))
    counted = sum(count_tokens(tokenizer, m["content"]) + 5 for m in messages) + 3
    prompt_tokens = sync_redis().hget(queue.job_key(generation_id), "prompt_tokens")
    assert prompt_tokens is not None
    # Tools the model is offered count too; the files' text is part of the count.
    assert int(prompt_tokens) >= counted


def test_the_files_stay_in_the_context_of_later_turns(
    api_client: APIClient, conversation: Conversation, django_capture_on_commit_callbacks: Any
) -> None:
    attachment = upload(api_client, conversation, "a.txt", b"The password is swordfish.").json()
    send(api_client, conversation, "Remember this", [attachment["id"]])
    answer_all(conversation)

    with django_capture_on_commit_callbacks(execute=True):
        response = send(api_client, conversation, "What was the password?", [])

    messages = job_messages(response.json()["generation"]["id"])
    assert [m["role"] for m in messages] == ["system", "system", "user", "assistant", "user"]
    assert "The password is swordfish." in messages[1]["content"]


TOPICS = {
    "volcano": "Volcanoes erupt molten lava and ash when magma rises through the crust.",
    "baking": "Sourdough bread needs a starter, flour, water, salt and a long rise.",
    "football": "The striker scored a goal in the final minute of the football match.",
    "astronomy": "Jupiter is the largest planet and has dozens of moons orbiting it.",
    "finance": "Compound interest makes savings grow faster the longer they are invested.",
}


def long_document() -> str:
    """Sections on unrelated topics, each a paragraph of its own repeated sentence."""
    return "\n\n".join(
        f"Section {name}. " + " ".join([sentence] * 6) for name, sentence in TOPICS.items()
    )


@override_settings(ATTACHMENT_CHUNK_CHARS=500)
def test_a_file_too_big_for_the_room_gives_the_chunks_most_like_the_question(
    conversation: Conversation,
) -> None:
    attachment = attachment_upload(
        conversation=conversation, name="topics.txt", data=long_document().encode()
    )
    assert len(attachment.chunks) == len(TOPICS)
    sent(
        message_send(
            conversation=conversation,
            content="How does sourdough bread rise?",
            attachment_ids=[attachment.pk],
        )
    )
    branch = active_branch(conversation=conversation)[:-1]
    tokenizer = pool_tokenizer(ModelPool.objects.get(name=conversation.model))
    whole = count_tokens(tokenizer, long_document())
    files = attachment_context.attachment_context(branch=branch)
    assert files is not None

    # Room for about two of the five sections.
    text = files.text_within(tokenizer=tokenizer, tokens=int(whole * 0.45))

    assert files.retrieved
    assert text is not None
    assert count_tokens(tokenizer, text) <= int(whole * 0.45)
    assert "Sourdough bread needs a starter" in text
    assert "Volcanoes erupt" not in text and "striker scored" not in text
    assert "[…]" in text


@override_settings(ATTACHMENT_CHUNK_CHARS=500)
def test_retrieved_chunks_keep_the_documents_order(conversation: Conversation) -> None:
    attachment = attachment_upload(
        conversation=conversation, name="topics.txt", data=long_document().encode()
    )
    message_send(
        conversation=conversation,
        content="Planets and moons, and also volcano eruptions with lava",
        attachment_ids=[attachment.pk],
    )
    branch = active_branch(conversation=conversation)[:-1]
    tokenizer = pool_tokenizer(ModelPool.objects.get(name=conversation.model))
    whole = count_tokens(tokenizer, long_document())
    files = AttachmentContext(
        attachments=attachments_on_branch(branch=branch), question=branch[-1].content
    )

    text = files.text_within(tokenizer=tokenizer, tokens=int(whole * 0.5))

    assert text is not None
    assert "Volcanoes erupt" in text and "Jupiter is the largest" in text
    assert text.index("Volcanoes erupt") < text.index("Jupiter is the largest")


@override_settings(ATTACHMENT_CHUNK_CHARS=500, ATTACHMENTS_CONTEXT_SHARE=0.5)
def test_the_context_gives_the_files_their_share_and_keeps_the_budget(
    conversation: Conversation,
) -> None:
    attachment = attachment_upload(
        conversation=conversation, name="topics.txt", data=long_document().encode()
    )
    message_send(
        conversation=conversation,
        content="Tell me about compound interest on savings",
        attachment_ids=[attachment.pk],
    )
    branch = active_branch(conversation=conversation)[:-1]
    tokenizer = pool_tokenizer(ModelPool.objects.get(name=conversation.model))
    budget = 300

    context = assemble_context(
        branch=branch,
        tokenizer=tokenizer,
        budget_tokens=budget,
        attachments=attachment_context.attachment_context(branch=branch),
    )

    assert context.prompt_tokens <= budget
    files = context.messages[1]["content"]
    assert "Compound interest makes savings grow" in files
    assert "Volcanoes erupt" not in files
    assert context.messages[-1]["content"] == "Tell me about compound interest on savings"


@override_settings(ATTACHMENT_CHUNK_CHARS=500)
def test_a_missing_vector_is_computed_when_a_message_needs_it(
    conversation: Conversation,
) -> None:
    attachment = attachment_upload(
        conversation=conversation, name="topics.txt", data=long_document().encode()
    )
    Attachment.objects.filter(pk=attachment.pk).update(embeddings=None)
    message_send(conversation=conversation, content="Jupiter moons", attachment_ids=[attachment.pk])
    branch = active_branch(conversation=conversation)[:-1]
    tokenizer = pool_tokenizer(ModelPool.objects.get(name=conversation.model))
    files = attachment_context.attachment_context(branch=branch)
    assert files is not None

    text = files.text_within(tokenizer=tokenizer, tokens=150)

    assert text is not None and "Jupiter" in text
    attachment.refresh_from_db()
    assert attachment.embeddings is not None


def test_the_schema_describes_the_attachment_endpoints(api_client: APIClient) -> None:
    paths = api_client.get("/api/schema/", {"format": "json"}).json()["paths"]

    base = "/api/v1/conversations/{conversation_id}/attachments"
    assert {"post"} <= set(paths[base])
    assert {"get", "delete"} <= set(paths[base + "/{attachment_id}"])
    assert {"get"} <= set(paths[base + "/{attachment_id}/content"])
    upload_body = paths[base]["post"]["requestBody"]["content"]
    assert set(upload_body) == {"multipart/form-data"}
    assert {"201", "413", "415", "422"} <= set(paths[base]["post"]["responses"])
    send = paths["/api/v1/conversations/{conversation_id}/messages"]["post"]
    schema_ref = send["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert schema_ref.endswith("/MessageCreate")
