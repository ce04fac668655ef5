"""Running an import job: what the Celery task does (conversations/portability/tasks.py).

1. The upload's pieces (`ImportChunk`, in Postgres, so any worker host can read them) are
   copied to a temporary file on this host: both passes, and a zip, read it from there.
2. First pass, outside any transaction: every conversation is read and checked, one at a time
   (`importers`), and counted. A fault fails the job before anything is written.
3. Second pass, in one transaction: every conversation is read again and written. The job
   ends `done` in the same transaction, so the import is all there or not at all; a worker
   that dies midway leaves nothing, and its task, run again, starts over.

Progress (conversations checked, then written) is a Redis counter the owner's page polls
(`selectors.import_job_progress`): the transaction's rows are invisible until it commits.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import IO, Any

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from chatsite.errors import ServiceError
from chatsite.redis import sync_redis

from .. import services
from ..errors import ErrorCode
from ..events import user_event_publish
from ..models import Conversation, Folder, ImportChunk, ImportJob, Message
from .formats import ImportFault, ParsedConversation
from .importers import read_file

logger = logging.getLogger(__name__)

PROGRESS_TTL_SECONDS = 24 * 3600
# How often, at most, the Redis counter is moved while conversations go by.
PROGRESS_EVERY_SECONDS = 0.2


def import_progress_key(job_id: Any) -> str:
    return f"{settings.INFERENCE_REDIS_PREFIX}:import:{job_id}:done"


class _Progress:
    """The job's Redis counter, moved at most every PROGRESS_EVERY_SECONDS."""

    def __init__(self, job_id: Any) -> None:
        self.key = import_progress_key(job_id)
        self.last = 0.0

    def report(self, done: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= PROGRESS_EVERY_SECONDS:
            self.last = now
            sync_redis().set(self.key, done, ex=PROGRESS_TTL_SECONDS)


def import_job_run(*, job_id: Any) -> ImportJob | None:
    """Check, then write, every conversation of the job's file (module docstring). A job
    already ended is left as it is (a task delivered twice); None if there is no such job.

    Faults of the file end the job `failed` with its error; faults of the database or Redis
    are raised for the task to retry, the job not ended.
    """
    job = ImportJob.objects.filter(pk=job_id).first()
    if job is None or job.status in ImportJob.FINAL_STATUSES:
        return job
    progress = _Progress(job.pk)
    try:
        _update(job, status=ImportJob.Status.VALIDATING)
        with _local_copy(job) as file:
            total, source = _check(file, progress)
            _update(job, status=ImportJob.Status.IMPORTING, total=total, format=source)
            progress.report(0, force=True)
            _write(job, file, progress)
    except ImportFault as fault:
        import_job_fail(job=job, fault=fault)
    except DatabaseError:
        raise
    except Exception:
        # A fault of ours, not of the file: the transaction rolled back, nothing was written.
        logger.exception("import %s failed", job.pk)
        import_job_fail(
            job=job,
            fault=ServiceError(
                ErrorCode.IMPORT_FAILED,
                "The import failed on our side; nothing was imported. Please try again.",
            ),
        )
    return job


def _update(job: ImportJob, **values: Any) -> None:
    for name, value in values.items():
        setattr(job, name, value)
    job.save(update_fields=list(values))


def import_job_fail(*, job: ImportJob, fault: ServiceError) -> None:
    """End the job `failed` with `fault` as its error, its pieces removed."""
    with transaction.atomic():
        _update(
            job,
            status=ImportJob.Status.FAILED,
            error={"code": fault.code, "message": fault.message, "detail": fault.detail},
            finished_at=timezone.now(),
        )
        ImportChunk.objects.filter(job=job).delete()


@contextlib.contextmanager
def _local_copy(job: ImportJob) -> Iterator[IO[bytes]]:
    """The upload as a temporary file of this host, read from its pieces one at a time."""
    with tempfile.TemporaryFile() as file:
        pieces = (
            ImportChunk.objects.filter(job=job).order_by("index").values_list("data", flat=True)
        )
        for data in pieces.iterator(chunk_size=1):
            file.write(data)
        file.flush()
        yield file


def _check(file: IO[bytes], progress: _Progress) -> tuple[int, str]:
    """The first pass: every conversation read and checked; their count and the file's format."""
    total = 0
    source = ""
    for found, _conversation in read_file(file):
        source = source or found.value
        total += 1
        progress.report(total)
    if total == 0:
        raise ImportFault(ErrorCode.IMPORT_NOTHING_TO_IMPORT, "The file holds no conversations.")
    return total, source


def _write(job: ImportJob, file: IO[bytes], progress: _Progress) -> None:
    """The second pass: every conversation written, and the job ended, in one transaction."""
    with transaction.atomic():
        job.refresh_from_db(from_queryset=ImportJob.objects.select_for_update())
        if job.status in ImportJob.FINAL_STATUSES:  # another delivery of the task finished it
            return
        folders = _FolderCache(job.owner)
        written = 0
        for _source, parsed in read_file(file):
            conversation_import(owner=job.owner, parsed=parsed, folders=folders)
            written += 1
            progress.report(written)
        _update(
            job,
            status=ImportJob.Status.DONE,
            imported=written,
            finished_at=timezone.now(),
        )
        ImportChunk.objects.filter(job=job).delete()
        # Open pages of the owner's show the new conversations in their sidebars.
        owner_id, event = job.owner_id, {"import_id": str(job.pk), "imported": written}
        transaction.on_commit(
            lambda: user_event_publish(user_id=owner_id, event="imported", data=event),
            robust=True,
        )
    progress.report(written, force=True)


class _FolderCache:
    """The owner's folders by name (case-insensitive), made as the import first names them.
    Past the cap on folders, a conversation is imported outside any."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.by_name: dict[str, Folder | None] = {
            folder.name.lower(): folder for folder in Folder.objects.filter(owner_id=owner.pk)
        }

    def get(self, name: str | None) -> Folder | None:
        if not name:
            return None
        key = " ".join(name.split()).lower()
        if key not in self.by_name:
            try:
                self.by_name[key] = services.folder_create(owner=self.owner, name=name)
            except ServiceError:  # too many folders, or a name the service refuses
                self.by_name[key] = None
        return self.by_name[key]


def conversation_import(
    *, owner: Any, parsed: ParsedConversation, folders: _FolderCache | None = None
) -> Conversation:
    """Write one imported conversation: its row, its root (the system prompt) and its tree in
    one statement, with its times, the branch that was on screen and each message's last
    viewed child. Call inside a transaction (the references are checked at commit)."""
    conversation = Conversation.objects.create(
        owner=owner,
        title=parsed.title,
        title_set_by_user=bool(parsed.title),
        model=parsed.model or settings.DEFAULT_MODEL,
        system_prompt=parsed.system_prompt,
        source=Conversation.Source.WEB,
        last_activity_at=parsed.last_activity_at,
        folder=folders.get(parsed.folder) if folders is not None else None,
        pinned=parsed.pinned and not parsed.archived,
        archived=parsed.archived,
    )
    root = Message(
        id=uuid.uuid4(),
        conversation=conversation,
        role=Message.Role.SYSTEM,
        content=parsed.system_prompt,
        status=Message.Status.COMPLETE,
        created_at=parsed.created_at,
    )
    by_key: dict[str | None, Message] = {None: root}
    children: dict[str | None, list[Message]] = defaultdict(list)
    for item in parsed.messages:
        message = Message(
            id=uuid.uuid4(),
            conversation=conversation,
            parent=by_key[item.parent],
            role=item.role,
            content=item.content,
            status=item.status,
            model=item.model,
            metadata=item.metadata,
            prompt_tokens=item.prompt_tokens,
            output_tokens=item.output_tokens,
            created_at=item.created_at or parsed.created_at,
        )
        by_key[item.key] = message
        children[item.parent].append(message)
    # Each message's last viewed child: as the file says, else its newest; then the branch on
    # screen, which wins over both.
    for key, kids in children.items():
        hint = parsed.current_children.get(key)
        by_key[key].current_child = by_key[hint] if hint is not None else kids[-1]
    leaf = by_key[parsed.current_leaf]
    node = leaf
    while node.parent is not None:
        node.parent.current_child = node
        node = node.parent
    messages = list(by_key.values())
    stamps = {message.pk: message.created_at for message in messages}
    Message.objects.bulk_create(messages, batch_size=1000)
    # `auto_now_add` stamped them all with now: put back the times the file gave.
    for message in messages:
        message.created_at = stamps[message.pk]
    Message.objects.bulk_update(messages, ["created_at"], batch_size=500)
    Conversation.objects.filter(pk=conversation.pk).update(
        current_leaf=leaf, created_at=parsed.created_at
    )
    conversation.current_leaf = leaf
    conversation.created_at = parsed.created_at
    return conversation


__all__ = ["conversation_import", "import_job_run", "import_progress_key"]
