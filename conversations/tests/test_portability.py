"""Export and import (#18): a conversation as JSON and Markdown, all of a user's data as a
zip, and imports of the service's own JSON, its zip and ChatGPT's conversations.json.

The import's task is run here in the test's thread (`import_job_run`, what the Celery task
calls); test_celery_import.py runs it on a real worker.
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from accounts.models import ApiKey
from accounts.services import api_key_create
from chatsite.redis import sync_redis
from chatsite.testing import assert_error
from conversations import selectors
from conversations.attachments import attachment_upload
from conversations.events import user_events_key
from conversations.models import (
    Attachment,
    Conversation,
    Folder,
    ImportChunk,
    ImportJob,
    Message,
)
from conversations.portability import export, importing, tasks
from conversations.portability.export import safe_filename
from conversations.portability.importers import IterStream, read_json
from conversations.portability.importing import import_job_run
from conversations.portability.services import import_job_create
from conversations.search import message_search
from conversations.services import (
    branch_switch,
    conversation_create,
    conversation_organize,
    feedback_set,
    folder_create,
    message_edit,
    message_regenerate,
    message_send,
    share_create,
    share_revoke,
)
from conversations.share_tokens import share_token
from moderation.models import Sanction

from . import chatgpt_samples
from .factories import exchange, finish, sent

pytestmark = pytest.mark.django_db


def import_now(user: User, data: bytes, filename: str = "conversations.json") -> ImportJob:
    """Upload `data` as the API does, then run the job's task here."""
    job = import_job_create(owner=user, file=io.BytesIO(data), filename=filename, size=len(data))
    import_job_run(job_id=job.pk)
    job.refresh_from_db()
    return job


def tree(conversation: Conversation) -> dict[str, Any]:
    """The conversation as a user sees it, ids left out: every branch (children oldest
    first), the branch on screen, each message's last viewed child."""
    messages = list(Message.objects.filter(conversation=conversation).order_by("created_at", "id"))
    children: dict[Any, list[Message]] = {}
    for message in messages:
        children.setdefault(message.parent_id, []).append(message)

    def shape(message: Message) -> dict[str, Any]:
        kids = children.get(message.pk, [])
        current = next((k for k in kids if k.pk == message.current_child_id), None)
        return {
            "role": message.role,
            "content": message.content,
            "status": message.status,
            "current_child": current.content if current else None,
            "children": [shape(child) for child in kids],
        }

    (root,) = children[None]
    branch = selectors.active_branch(conversation=conversation)
    return {
        "title": conversation.title,
        "system_prompt": conversation.system_prompt,
        "model": conversation.model,
        "tree": shape(root),
        "on_screen": [(m.role, m.content) for m in branch],
    }


def branched(user: User) -> Conversation:
    """A conversation with an edited question and a regenerated answer."""
    conversation = conversation_create(
        owner=user, title="Bread", system_prompt="You are a baker.", model="chat-small"
    )
    question, answer = exchange(conversation, "How long do I knead dough?", answer="Ten minutes.")
    regenerated = finish(message_regenerate(message=answer).placeholder, "About ten minutes.")
    _, placeholder = sent(message_edit(message=question, content="How long does rye rise?"))
    finish(placeholder, "Two to four hours.")
    exchange(conversation, "And at 30 degrees?", answer="Faster: about two hours.")
    # Back on the first question, its regenerated answer on screen.
    branch_switch(message=regenerated)
    conversation.refresh_from_db()
    return conversation


# Export


def test_a_conversation_exports_as_json_with_its_whole_tree(
    api_client: APIClient, user: User
) -> None:
    conversation = branched(user)
    response = api_client.get(f"/api/v1/conversations/{conversation.pk}/export.json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"].startswith('attachment; filename="bread-')
    document = json.loads(response.content)
    assert (document["format"], document["version"]) == ("chatsite.conversation", 1)
    assert document["conversation"]["system_prompt"] == "You are a baker."
    assert document["conversation"]["current_leaf"] == str(conversation.current_leaf_id)
    stored = Message.objects.filter(conversation=conversation)
    assert {m["id"] for m in document["messages"]} == {str(m.pk) for m in stored}
    by_id = {m["id"]: m for m in document["messages"]}
    for message in stored:
        row = by_id[str(message.pk)]
        assert row["parent"] == (str(message.parent_id) if message.parent_id else None)
        assert row["current_child"] == (
            str(message.current_child_id) if message.current_child_id else None
        )
        assert (row["role"], row["content"], row["status"]) == (
            message.role,
            message.content,
            message.status,
        )


def test_markdown_export_is_the_branch_on_screen(api_client: APIClient, user: User) -> None:
    conversation = branched(user)
    response = api_client.get(f"/api/v1/conversations/{conversation.pk}/export.md")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"].endswith('.md"')
    text = response.content.decode()
    assert text.startswith("# Bread\n")
    assert "## System prompt\n\nYou are a baker." in text
    assert "## You\n\nHow long do I knead dough?" in text
    assert "About ten minutes." in text
    # Not on screen: the first answer and the edited branch.
    assert "Ten minutes." not in text
    assert "rye" not in text


def test_a_withheld_answer_is_exported_without_its_text(api_client: APIClient, user: User) -> None:
    conversation = conversation_create(owner=user, title="Held")
    _, answer = exchange(conversation, "Hello", answer="forbidden words")
    Message.objects.filter(pk=answer.pk).update(status=Message.Status.BLOCKED)
    as_json = api_client.get(f"/api/v1/conversations/{conversation.pk}/export.json")
    as_markdown = api_client.get(f"/api/v1/conversations/{conversation.pk}/export.md")
    assert b"forbidden words" not in as_json.content
    assert b"forbidden words" not in as_markdown.content
    assert b"withdrawn" in as_markdown.content


def test_another_users_conversation_is_not_exported(
    other_api_client: APIClient, user: User
) -> None:
    conversation = branched(user)
    for suffix in ("export.json", "export.md"):
        response = other_api_client.get(f"/api/v1/conversations/{conversation.pk}/{suffix}")
        assert_error(response, 404, "not_found")


def zip_of(client: APIClient) -> zipfile.ZipFile:
    response: Any = client.get("/api/v1/export")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    assert response["Content-Disposition"].startswith("attachment; ")
    return zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content)))


def test_the_account_zip_holds_everything_and_no_key(api_client: APIClient, user: User) -> None:
    conversation = branched(user)
    folder = folder_create(owner=user, name="Kitchen")
    conversation_organize(conversation=conversation, folder=folder, pinned=True)
    gone = conversation_create(owner=user, title="Gone")
    gone.deleted_at = gone.created_at
    gone.save(update_fields=["deleted_at"])
    key, raw_key = api_key_create(user=user, name="laptop", scope=ApiKey.Scope.CHAT)
    Sanction.objects.create(user=user, kind=Sanction.Kind.WARNING, reason="Be kind.")

    archive = zip_of(api_client)
    names = set(archive.namelist())
    assert {
        "README.txt",
        "account.json",
        "api_keys.json",
        "folders.json",
        "billing.json",
        "usage.jsonl",
        "moderation.json",
        f"conversations/{conversation.pk}.json",
        f"conversations/{conversation.pk}.md",
    } <= names
    assert not any(str(gone.pk) in name for name in names)
    assert json.loads(archive.read("account.json"))["username"] == user.username
    keys = json.loads(archive.read("api_keys.json"))
    assert {k["name"] for k in keys} == {"tests", "laptop"}
    assert {k["prefix"] for k in keys} >= {key.prefix}
    assert [f["name"] for f in json.loads(archive.read("folders.json"))] == ["Kitchen"]
    warnings = json.loads(archive.read("moderation.json"))
    assert [(w["kind"], w["reason"]) for w in warnings] == [("warning", "Be kind.")]
    document = json.loads(archive.read(f"conversations/{conversation.pk}.json"))
    assert document["conversation"]["folder"] == "Kitchen"
    assert document["conversation"]["pinned"] is True
    everything = b"".join(archive.read(name) for name in names)
    for secret in (raw_key, key.key_hash, raw_key[len(key.prefix) :]):
        assert secret.encode() not in everything


def with_file(conversation: Conversation, name: str, data: bytes) -> tuple[Message, Message]:
    """A turn whose question carries the file `data`, its answer finished."""
    attachment = attachment_upload(conversation=conversation, name=name, data=data)
    question, placeholder = sent(
        message_send(
            conversation=conversation, content="Read this.", attachment_ids=[attachment.pk]
        )
    )
    return question, finish(placeholder, f"Read {name}.")


def everything_of(user: User, marker: str) -> dict[str, Any]:
    """A conversation with a file on a question, a live and a revoked share, and feedback."""
    conversation = conversation_create(owner=user, title=f"Notes {marker}")
    question, answer = with_file(conversation, f"{marker}.txt", f"file of {marker}".encode())
    live = share_create(conversation=conversation)
    revoked = share_revoke(share=share_create(conversation=conversation))
    feedback = feedback_set(
        message=answer, user=user, rating="down", reason="incomplete", comment=f"said {marker}"
    )
    return {
        "conversation": conversation,
        "question": question,
        "answer": answer,
        "attachment": Attachment.objects.get(message=question),
        "live": live,
        "revoked": revoked,
        "feedback": feedback,
    }


def test_the_account_zip_holds_shares_feedback_and_files_of_the_owner_only(
    api_client: APIClient, user: User
) -> None:
    mine = everything_of(user, "mine")
    theirs = everything_of(User.objects.create_user("other"), "theirs")

    archive = zip_of(api_client)

    shares = {share["id"]: share for share in json.loads(archive.read("shares.json"))}
    assert set(shares) == {str(mine["live"].pk), str(mine["revoked"].pk)}
    live, revoked = shares[str(mine["live"].pk)], shares[str(mine["revoked"].pk)]
    token = share_token(share_id=mine["live"].pk)
    assert live["link"] == f"http://testserver/s/{token}"
    assert (live["title"], live["conversation_id"]) == ("Notes mine", str(mine["conversation"].pk))
    assert live["revoked_at"] is None and live["created_at"]
    assert [m["content"] for m in live["messages"]] == ["Read this.", "Read mine.txt."]
    assert revoked["link"] is None and revoked["revoked_at"] is not None
    assert revoked["messages"] == live["messages"]
    revoked_token = share_token(share_id=mine["revoked"].pk)

    [feedback] = json.loads(archive.read("feedback.json"))
    assert feedback == {
        "id": str(mine["feedback"].pk),
        "message_id": str(mine["answer"].pk),
        "conversation_id": str(mine["conversation"].pk),
        "rating": "down",
        "reason": "incomplete",
        "comment": "said mine",
        "created_at": mine["feedback"].created_at.isoformat(),
        "updated_at": mine["feedback"].updated_at.isoformat(),
    }

    attachment = mine["attachment"]
    [meta] = json.loads(archive.read("attachments.json"))
    path = f"attachments/{mine['conversation'].pk}/{attachment.pk}-mine.txt"
    assert meta == {
        "id": str(attachment.pk),
        "filename": "mine.txt",
        "kind": "text",
        "content_type": "text/plain; charset=utf-8",
        "size": len(b"file of mine"),
        "sha256": hashlib.sha256(b"file of mine").hexdigest(),
        "conversation_id": str(mine["conversation"].pk),
        "message_id": str(mine["question"].pk),
        "created_at": attachment.created_at.isoformat(),
        "path": path,
    }
    assert archive.read(path) == b"file of mine"
    document = json.loads(archive.read(f"conversations/{mine['conversation'].pk}.json"))
    carried = {m["id"]: m["attachments"] for m in document["messages"]}
    assert [a["id"] for a in carried[str(mine["question"].pk)]] == [str(attachment.pk)]
    assert carried[str(mine["answer"].pk)] == []

    names = archive.namelist()
    everything = b"".join(archive.read(name) for name in names) + "".join(names).encode()
    assert revoked_token.encode() not in everything
    for value in (
        theirs["conversation"].pk,
        theirs["attachment"].pk,
        theirs["live"].pk,
        theirs["revoked"].pk,
        theirs["feedback"].pk,
        theirs["answer"].pk,
        share_token(share_id=theirs["live"].pk),
        "theirs",
    ):
        assert str(value).encode() not in everything


def test_the_files_of_a_conversation_in_the_trash_are_not_exported(
    api_client: APIClient, user: User
) -> None:
    gone = everything_of(user, "gone")
    gone["conversation"].deleted_at = gone["conversation"].created_at
    gone["conversation"].save(update_fields=["deleted_at"])

    archive = zip_of(api_client)

    for name in ("shares.json", "feedback.json", "attachments.json"):
        assert json.loads(archive.read(name)) == []
    assert not any(name.startswith("attachments/") for name in archive.namelist())


@pytest.mark.parametrize(
    "hostile",
    ["../../etc/passwd", "a/b\\c", "..", "bell\x07new\nline\x00.txt", "C:\\x\u202e.txt", ""],
)
def test_a_hostile_filename_is_one_harmless_path_component(hostile: str) -> None:
    name = safe_filename(hostile)
    assert name and "/" not in name and "\\" not in name and ":" not in name
    assert ".." not in name and not name.startswith(".")
    assert all(c.isprintable() for c in name)


def test_hostile_filenames_land_as_safe_names_inside_the_zip(
    api_client: APIClient, user: User
) -> None:
    conversation = conversation_create(owner=user, title="Hostile")
    hostile = ["../../etc/passwd", "a/b\\c", "bell\x07new\nline\x1b.txt"]
    files = {}
    for index, name in enumerate(hostile):
        attachment = attachment_upload(
            conversation=conversation, name=f"f{index}.txt", data=f"body {index}".encode()
        )
        # Uploads clean their names; a row written another way (an older upload, the shell)
        # may hold anything.
        Attachment.objects.filter(pk=attachment.pk).update(name=name)
        files[attachment.pk] = f"body {index}".encode()

    archive = zip_of(api_client)

    stored = [name for name in archive.namelist() if name.startswith("attachments/")]
    assert len(stored) == len(hostile)
    for name in stored:
        top, folder, leaf = name.split("/")
        assert (top, folder) == ("attachments", str(conversation.pk))
        assert ".." not in name and "\\" not in name
        assert all(c.isprintable() for c in name)
        assert archive.read(name) == files[uuid.UUID(leaf[:36])]
    metadata = json.loads(archive.read("attachments.json"))
    assert sorted(m["filename"] for m in metadata) == sorted(hostile)
    assert {m["path"] for m in metadata} == set(stored)


def account_zip_queries(client: APIClient, user: User, conversations: int) -> int:
    """The queries of the whole account export of `user` once they have `conversations`
    conversations, each of three turns, two of whose questions carry a file, one share and
    one feedback."""
    while Conversation.objects.filter(owner=user).count() < conversations:
        conversation = conversation_create(owner=user, title="Busy")
        with_file(conversation, "one.txt", b"one")
        _, answer = with_file(conversation, "two.md", b"# two")
        exchange(conversation, "And then?")
        share_create(conversation=conversation)
        feedback_set(message=answer, user=user, rating="up")
    zip_of(client)  # once first, so that what is cached (the key, the plan) is
    with CaptureQueriesContext(connection) as queries:
        zip_of(client)
    return len(queries)


def test_the_account_zip_costs_a_few_queries_per_conversation_and_none_per_message(
    api_client: APIClient, user: User
) -> None:
    few = account_zip_queries(api_client, user, 2)
    many = account_zip_queries(api_client, user, 6)

    # Each conversation: its JSON (the conversation, its messages, its files' metadata) and its
    # Markdown (the conversation, its branch). Files, shares and feedback are read in batches.
    assert many - few <= 4 * 5


def test_files_read_in_small_batches_all_land_whole(
    api_client: APIClient, user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "ATTACHMENT_BATCH_BYTES", 10)
    bodies = {}
    for index in range(2):
        conversation = conversation_create(owner=user, title=f"Batch {index}")
        for name in ("a.txt", "b.txt"):
            data = f"{name} of {index}, longer than a batch".encode()
            attachment = attachment_upload(conversation=conversation, name=name, data=data)
            bodies[f"attachments/{conversation.pk}/{attachment.pk}-{name}"] = data

    archive = zip_of(api_client)

    assert {name: archive.read(name) for name in bodies} == bodies
    metadata = json.loads(archive.read("attachments.json"))
    assert {m["path"]: m["message_id"] for m in metadata} == dict.fromkeys(bodies)


def test_a_conversations_json_lists_each_messages_files(api_client: APIClient, user: User) -> None:
    conversation = conversation_create(owner=user, title="Files")
    question, answer = with_file(conversation, "notes.md", b"# Notes")

    document = api_client.get(f"/api/v1/conversations/{conversation.pk}/export.json").json()

    attachment = Attachment.objects.get(message=question)
    carried = {m["id"]: m["attachments"] for m in document["messages"]}
    assert carried[str(question.pk)] == [
        {
            "id": str(attachment.pk),
            "filename": "notes.md",
            "kind": "markdown",
            "content_type": "text/markdown; charset=utf-8",
            "size": 7,
        }
    ]
    assert carried[str(answer.pk)] == []


def test_an_import_brings_the_messages_back_without_their_files(
    api_client: APIClient, user: User
) -> None:
    conversation = conversation_create(owner=user, title="Files")
    with_file(conversation, "notes.md", b"# Notes")
    exported = api_client.get(f"/api/v1/conversations/{conversation.pk}/export.json").content

    job = import_now(user, exported, "files.json")

    assert job.status == "done"
    copy = Conversation.objects.exclude(pk=conversation.pk).get(owner=user)
    question = Message.objects.get(conversation=copy, role="user")
    assert question.content == "Read this."
    assert Attachment.METADATA_KEY not in question.metadata
    assert not Attachment.objects.filter(conversation=copy).exists()


def test_the_account_zip_needs_a_full_key(user: User) -> None:
    _, raw_key = api_key_create(user=user, name="chat", scope=ApiKey.Scope.CHAT)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    assert_error(client.get("/api/v1/export"), 403, "insufficient_scope")


def test_the_account_zip_needs_a_login() -> None:
    assert_error(APIClient().get("/api/v1/export"), 401, "not_authenticated")


# Import: the service's own format


def test_an_exported_conversation_imports_as_the_same_tree(
    api_client: APIClient, user: User
) -> None:
    conversation = branched(user)
    exported = api_client.get(f"/api/v1/conversations/{conversation.pk}/export.json").content

    job = import_now(user, exported, "bread.json")

    assert (job.status, job.format, job.total, job.imported) == ("done", "chatsite", 1, 1)
    copy = Conversation.objects.exclude(pk=conversation.pk).get(owner=user)
    assert tree(copy) == tree(conversation)
    assert copy.created_at == conversation.created_at
    assert (
        not Message.objects.filter(conversation=copy)
        .filter(pk__in=Message.objects.filter(conversation=conversation).values("pk"))
        .exists()
    )
    assert not ImportChunk.objects.exists()


def test_the_zip_of_an_account_imports_back(api_client: APIClient, user: User) -> None:
    conversation = branched(user)
    conversation_organize(
        conversation=conversation, folder=folder_create(owner=user, name="Kitchen")
    )
    response: Any = api_client.get("/api/v1/export")
    data = b"".join(response.streaming_content)
    importer = User.objects.create_user("importer")

    job = import_now(importer, data, "export.zip")

    assert (job.status, job.format, job.imported) == ("done", "chatsite_zip", 1)
    copy = Conversation.objects.get(owner=importer)
    assert tree(copy) == tree(conversation)
    assert copy.folder is not None and copy.folder.name == "Kitchen"
    assert copy.folder.owner == importer


def test_chatgpts_export_zip_is_read_for_its_conversations_json(user: User) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("chat.html", "<html>ChatGPT's own page</html>")
        archive.writestr("conversations.json", json.dumps(chatgpt_samples.export_list()))
        archive.writestr("user.json", json.dumps({"id": "user-x"}))

    job = import_now(user, buffer.getvalue(), "chatgpt-export.zip")

    assert (job.status, job.format, job.imported) == ("done", "chatgpt", 2)
    assert Conversation.objects.filter(owner=user, title="Sourdough starter").exists()


def test_an_answer_in_progress_is_imported_as_stopped(api_client: APIClient, user: User) -> None:
    conversation = conversation_create(owner=user, title="Unfinished")
    exchange(conversation, "First", answer="One.")
    _, placeholder = sent(message_send(conversation=conversation, content="Second"))
    exported = api_client.get(f"/api/v1/conversations/{conversation.pk}/export.json").content
    assert placeholder.status == Message.Status.QUEUED

    import_now(user, exported)

    copy = Conversation.objects.exclude(pk=conversation.pk).get(owner=user)
    leaf = copy.current_leaf
    assert leaf is not None
    assert (leaf.role, leaf.status) == ("assistant", "cancelled")


# Import: ChatGPT


def test_a_chatgpt_export_becomes_trees_with_their_branches(user: User) -> None:
    data = json.dumps(chatgpt_samples.export_list()).encode()

    job = import_now(user, data)

    assert (job.status, job.format, job.total, job.imported) == ("done", "chatgpt", 2, 2)
    sourdough = Conversation.objects.get(owner=user, title="Sourdough starter")
    shape = tree(sourdough)
    root = shape["tree"]
    assert (root["role"], root["content"]) == ("system", "")
    # The hidden system message and custom instructions are gone; the edited question and
    # the original hang under the root: two branches.
    assert [c["content"] for c in root["children"]] == [
        "How often should I feed a sourdough starter?",
        "How much rye flour goes into a sourdough starter?",
    ]
    first, edited = root["children"]
    # The regenerated answer: two assistant children.
    assert [c["content"] for c in first["children"]] == [
        "Feed it **once a day** at room temperature.",
        "Daily, or weekly if it lives in the fridge.",
    ]
    assert shape["on_screen"] == [
        ("system", ""),
        ("user", "How much rye flour goes into a sourdough starter?"),
        ("assistant", "Equal weights of rye flour and water."),
        (
            "user",
            "[image asset pointer not imported]\n\n"
            "Here is my starter. And what is 25% of 480 grams?",
        ),
        # The tool round: the call as code; the tool's own result skipped.
        ("assistant", "```python\n480 * 0.25\n```"),
        ("assistant", "25% of 480 g is **120 g** of rye flour."),
    ]
    assert root["current_child"] == edited["content"]
    assert sourdough.title_set_by_user
    # Times kept: the conversation's and each message's, in order.
    assert sourdough.created_at.timestamp() == chatgpt_samples.T0 + 1000
    answer = Message.objects.get(conversation=sourdough, content__startswith="Equal weights")
    assert answer.created_at.timestamp() == chatgpt_samples.T0 + 1000 + 50
    assert answer.model == "gpt-4o"


def test_a_branch_of_an_imported_conversation_can_be_switched_to(user: User) -> None:
    import_now(user, json.dumps([chatgpt_samples.sourdough()]).encode())
    conversation = Conversation.objects.get(owner=user)
    first = Message.objects.get(conversation=conversation, content__startswith="How often")
    branch_switch(message=first)
    conversation.refresh_from_db()
    on_screen = [m.content for m in selectors.active_branch(conversation=conversation)]
    # The newest answer under it, as ChatGPT lists its children.
    assert on_screen[1:] == [
        "How often should I feed a sourdough starter?",
        "Daily, or weekly if it lives in the fridge.",
    ]


def test_imported_conversations_are_in_the_sidebar_and_the_search(user: User) -> None:
    import_now(user, json.dumps(chatgpt_samples.export_list()).encode())
    sidebar = selectors.conversation_sidebar(user=user)
    assert [c.title for c in sidebar.conversations] == ["Sourdough starter", "Capybara facts"]
    hits = message_search(user=user, query="capybaras swimmers").hits
    assert [hit.conversation_title for hit in hits] == ["Capybara facts"]
    assert message_search(user=user, query="rye").hits


def test_the_importer_reads_a_stream_as_it_goes() -> None:
    produced = 0

    def pieces() -> Iterator[bytes]:
        nonlocal produced
        for piece in chatgpt_samples.many(5000):
            produced += 1
            yield piece

    conversations = read_json(IterStream(pieces()))
    _, first = next(conversations)
    assert first.title == "Chat 0"
    # One conversation read; the other 4999 (10000 pieces) not yet made.
    assert produced < 100
    assert sum(1 for _ in conversations) == 4999
    assert produced == 2 * 5000 + 1


# Malformed files: a clear error, nothing written


def ours(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "format": "chatsite.conversation",
        "version": 1,
        "conversation": {"title": "T", "model": "m", "system_prompt": "", "current_leaf": "u"},
        "messages": [
            {"id": "r", "parent": None, "role": "system", "content": ""},
            {"id": "u", "parent": "r", "role": "user", "content": "Hi"},
        ],
    }
    document.update(changes)
    return document


CYCLE = {
    "title": "Loop",
    "current_node": "a",
    "mapping": {
        "root": {"id": "root", "message": None, "parent": None, "children": []},
        "a": {"id": "a", "message": None, "parent": "b", "children": ["b"]},
        "b": {"id": "b", "message": None, "parent": "a", "children": ["a"]},
    },
}


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b'[{"title": "cut short", "mapping": {', "import_invalid_json"),
        (b'[{"title": "x", "mapping": {}} "no comma"]', "import_invalid_json"),
        (b"[1, 2]", "import_wrong_shape"),
        (b'{"hello": "world"}', "import_unknown_format"),
        (b"[]", "import_nothing_to_import"),
        (json.dumps([chatgpt_samples.sourdough(), CYCLE]).encode(), "import_cycle"),
        (
            json.dumps(
                [{"mapping": {"a": {"parent": "nowhere", "children": [], "message": None}}}]
            ).encode(),
            "import_wrong_shape",
        ),
        (
            json.dumps(
                [{"mapping": {"a": {"parent": None, "children": [], "message": {"x": 1}}}}]
            ).encode(),
            "import_wrong_shape",
        ),
        (json.dumps(ours(version=2)).encode(), "import_unsupported_version"),
        (json.dumps(ours(format="other.app")).encode(), "import_unknown_format"),
        (
            json.dumps(
                ours(messages=[{"id": "u", "parent": None, "role": "user", "content": "Hi"}])
            ).encode(),
            "import_wrong_shape",
        ),
        (b"PK\x03\x04 this is no zip at all", "import_invalid_zip"),
    ],
)
def test_a_malformed_file_fails_with_its_error_and_writes_nothing(
    api_client: APIClient, user: User, data: bytes, code: str
) -> None:
    job = import_now(user, data)

    assert job.status == "failed"
    assert job.error is not None and job.error["code"] == code
    assert not Conversation.objects.exists()
    assert not Message.objects.exists()
    assert not Folder.objects.exists()
    assert not ImportChunk.objects.exists()
    body = api_client.get(f"/api/v1/imports/{job.pk}").json()
    assert body["status"] == "failed"
    assert set(body["error"]) == {"code", "message", "detail"}
    assert body["error"]["code"] == code


def test_json_cut_short_after_good_conversations_names_the_broken_one(user: User) -> None:
    data = json.dumps(chatgpt_samples.export_list()).encode()
    job = import_now(user, data[: len(data) - 40])
    assert job.error is not None
    assert job.error["code"] == "import_invalid_json"
    assert job.error["detail"]["conversation"] == 1
    assert not Conversation.objects.exists()


def test_a_fault_in_the_last_conversation_leaves_the_first_unwritten(user: User) -> None:
    conversations = [*chatgpt_samples.export_list(), {"title": "broken", "mapping": []}]
    job = import_now(user, json.dumps(conversations).encode())
    assert job.error is not None
    assert (job.error["code"], job.error["detail"]) == ("import_wrong_shape", {"conversation": 2})
    assert not Conversation.objects.exists()


@pytest.mark.parametrize(
    ("data", "code"),
    [(b"", "import_empty"), (b"   \n", "import_empty"), (b"hello", "import_unknown_format")],
)
def test_a_file_that_is_not_json_or_zip_is_refused_at_upload(
    api_client: APIClient, data: bytes, code: str
) -> None:
    upload = io.BytesIO(data)
    upload.name = "conversations.json"
    response = api_client.post("/api/v1/imports", {"file": upload}, format="multipart")
    assert_error(response, 400, code)
    assert not ImportJob.objects.exists()


def test_an_upload_without_a_file_is_refused(api_client: APIClient) -> None:
    assert_error(api_client.post("/api/v1/imports", {}, format="multipart"), 400, "import_no_file")


def test_a_file_over_the_cap_is_refused(api_client: APIClient, settings: Any) -> None:
    settings.IMPORT_MAX_BYTES = 1000
    upload = io.BytesIO(json.dumps(chatgpt_samples.export_list()).encode())
    upload.name = "conversations.json"
    response = api_client.post("/api/v1/imports", {"file": upload}, format="multipart")
    error = assert_error(response, 413, "import_too_large")
    assert error["detail"]["max_bytes"] == 1000
    assert not ImportJob.objects.exists()
    assert not ImportChunk.objects.exists()


def test_a_body_far_over_the_cap_is_refused_before_it_is_read(
    api_client: APIClient, settings: Any
) -> None:
    response = api_client.post(
        "/api/v1/imports",
        b"x",
        content_type="application/octet-stream",
        CONTENT_LENGTH=str(settings.API_BODY_LIMITS_BY_PATH["/api/v1/imports"] + 1),
    )
    assert_error(response, 413, "request_too_large")


def test_a_zip_bomb_is_refused(user: User, settings: Any) -> None:
    settings.IMPORT_ZIP_MAX_UNCOMPRESSED_BYTES = 10_000
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("conversations/x.json", b" " * 50_000 + json.dumps(ours()).encode())
    job = import_now(user, buffer.getvalue(), "x.zip")
    assert job.error is not None and job.error["code"] == "import_too_large"
    assert not Conversation.objects.exists()


# The API


def test_an_upload_is_kept_in_pieces_and_answered_with_its_job(
    api_client: APIClient, user: User, settings: Any
) -> None:
    settings.IMPORT_CHUNK_BYTES = 256
    data = json.dumps(chatgpt_samples.export_list()).encode()
    upload = io.BytesIO(data)
    upload.name = "conversations.json"
    response = api_client.post("/api/v1/imports", {"file": upload}, format="multipart")
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["status"], body["filename"], body["size_bytes"]) == (
        "queued",
        "conversations.json",
        len(data),
    )
    job = ImportJob.objects.get(pk=body["id"])
    pieces = list(job.chunks.order_by("index").values_list("data", flat=True))
    assert len(pieces) == -(-len(data) // 256)
    assert b"".join(bytes(p) for p in pieces) == data

    import_job_run(job_id=job.pk)
    done = api_client.get(f"/api/v1/imports/{job.pk}").json()
    assert (done["status"], done["total"], done["done"], done["imported"]) == ("done", 2, 2, 2)
    assert done["error"] is None
    listed = api_client.get("/api/v1/imports").json()["results"]
    assert [j["id"] for j in listed] == [str(job.pk)]


def test_another_users_import_is_not_found(
    api_client: APIClient, other_api_client: APIClient, user: User
) -> None:
    job = import_now(user, json.dumps(chatgpt_samples.export_list()).encode())
    assert_error(other_api_client.get(f"/api/v1/imports/{job.pk}"), 404, "not_found")
    assert other_api_client.get("/api/v1/imports").json()["results"] == []


def test_a_job_run_twice_imports_once(user: User) -> None:
    job = import_now(user, json.dumps(chatgpt_samples.export_list()).encode())
    import_job_run(job_id=job.pk)
    assert Conversation.objects.filter(owner=user).count() == 2


def test_session_uploads_need_csrf(session_client: APIClient) -> None:
    upload = io.BytesIO(b"[]")
    upload.name = "conversations.json"
    refused = session_client.post("/api/v1/imports", {"file": upload}, format="multipart")
    assert refused.status_code == 403
    assert not ImportJob.objects.exists()


def test_open_pages_hear_that_an_import_finished(
    user: User, django_capture_on_commit_callbacks: Any
) -> None:
    data = json.dumps(chatgpt_samples.export_list()).encode()
    job = import_job_create(owner=user, file=io.BytesIO(data), filename="c.json", size=len(data))
    with django_capture_on_commit_callbacks(execute=True):
        import_job_run(job_id=job.pk)
    entries: Any = sync_redis().xrange(user_events_key(user.pk))
    events = [(fields["event"], json.loads(fields["data"])) for _, fields in entries]
    assert events == [("imported", {"import_id": str(job.pk), "imported": 2})]


def test_a_job_the_broker_refuses_fails_at_once(
    user: User, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(tasks.run_import, "delay", refuse)
    data = json.dumps(chatgpt_samples.export_list()).encode()
    with django_capture_on_commit_callbacks(execute=True):
        job = import_job_create(
            owner=user, file=io.BytesIO(data), filename="c.json", size=len(data)
        )
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.error is not None and job.error["code"] == "import_failed"
    assert not ImportChunk.objects.exists()


def test_a_conversation_archived_in_chatgpt_is_archived_here(user: User) -> None:
    archived = chatgpt_samples.small("Old", "Old question", "Old answer.")
    archived["is_archived"] = True
    import_now(user, json.dumps([archived, chatgpt_samples.sourdough()]).encode())
    assert [c.title for c in selectors.conversation_sidebar(user=user).conversations] == [
        "Sourdough starter"
    ]
    archive = selectors.conversation_sidebar(user=user, archived=True).conversations
    assert [c.title for c in archive] == ["Old"]


def test_a_voice_message_keeps_its_transcription(user: User) -> None:
    conversation = chatgpt_samples.small("Voice", "placeholder", "Sure.")
    conversation["mapping"]["u"]["message"]["content"] = {
        "content_type": "multimodal_text",
        "parts": [
            {"content_type": "audio_transcription", "text": "What time is it in Lima?"},
            {"content_type": "audio_asset_pointer", "asset_pointer": "sediment://x"},
        ],
    }
    import_now(user, json.dumps([conversation]).encode())
    question = Message.objects.get(role="user")
    assert question.content == "What time is it in Lima?\n\n[audio asset pointer not imported]"


def test_one_import_at_a_time_per_user(api_client: APIClient, user: User) -> None:
    def upload() -> Any:
        data = io.BytesIO(json.dumps(chatgpt_samples.export_list()).encode())
        data.name = "conversations.json"
        return api_client.post("/api/v1/imports", {"file": data}, format="multipart")

    first = upload()
    assert first.status_code == 202
    assert_error(upload(), 409, "import_in_progress")
    import_job_run(job_id=first.json()["id"])
    assert upload().status_code == 202
    assert ImportJob.objects.filter(owner=user).count() == 2


def test_staff_see_imports_and_their_errors_read_only(admin_client: Any, user: User) -> None:
    job = import_now(user, b"[1]", "mine.json")
    listing = admin_client.get("/admin/conversations/importjob/")
    assert listing.status_code == 200
    assert b"mine.json" in listing.content
    page = admin_client.get(f"/admin/conversations/importjob/{job.pk}/change/")
    assert page.status_code == 200
    assert b"import_wrong_shape" in page.content
    assert b'name="_save"' not in page.content
    assert admin_client.get("/admin/conversations/importjob/add/").status_code == 403


def test_listing_imports_costs_the_same_however_many(
    api_client: APIClient, user: User, django_assert_max_num_queries: Any
) -> None:
    for _ in range(5):
        ImportJob.objects.create(owner=user, filename="c.json", size_bytes=10, status="done")
    with django_assert_max_num_queries(5):  # the key, its last use, the plan, the jobs
        listed = api_client.get("/api/v1/imports")
    assert len(listed.json()["results"]) == 5


def test_a_crash_while_writing_rolls_every_conversation_back(
    user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[Conversation] = []
    real = importing.conversation_import

    def crash_on_the_second(**kwargs: Any) -> Conversation:
        if written:
            raise RuntimeError("the disk is full")
        written.append(real(**kwargs))
        return written[-1]

    monkeypatch.setattr(importing, "conversation_import", crash_on_the_second)
    job = import_now(user, json.dumps(chatgpt_samples.export_list()).encode())

    assert len(written) == 1  # one was written, then rolled back with the rest
    assert job.status == "failed"
    assert job.error is not None and job.error["code"] == "import_failed"
    assert not Conversation.objects.exists()
    assert not Message.objects.exists()
