"""Routes of conversations and messages under /api/v1/ (no trailing slashes)."""

from django.urls import path

from chatsite.threads import threaded_view

from . import attachments, events, memory, organize, portability, sharing, views

# The turn's endpoints run on the edge's pool of threads (`chatsite.threads`): sends that
# arrive at once overlap instead of queueing on the process's one sync thread.
urlpatterns = [
    path("events/stream", events.user_event_stream, name="user-event-stream"),
    path(
        "conversations",
        threaded_view(views.ConversationListView.as_view()),
        name="conversation-list",
    ),
    path(
        "conversations/<uuid:conversation_id>",
        views.ConversationDetailView.as_view(),
        name="conversation-detail",
    ),
    path(
        "conversations/<uuid:conversation_id>/messages",
        threaded_view(views.MessageListView.as_view()),
        name="message-list",
    ),
    path(
        "conversations/<uuid:conversation_id>/messages/<uuid:message_id>",
        views.MessageDetailView.as_view(),
        name="message-detail",
    ),
    path(
        "conversations/<uuid:conversation_id>/messages/<uuid:message_id>/edit",
        threaded_view(views.MessageEditView.as_view()),
        name="message-edit",
    ),
    path(
        "conversations/<uuid:conversation_id>/messages/<uuid:message_id>/regenerate",
        threaded_view(views.MessageRegenerateView.as_view()),
        name="message-regenerate",
    ),
    path(
        "conversations/<uuid:conversation_id>/branch",
        views.BranchSwitchView.as_view(),
        name="branch-switch",
    ),
    path(
        "conversations/<uuid:conversation_id>/messages/<uuid:message_id>/feedback",
        sharing.MessageFeedbackView.as_view(),
        name="message-feedback",
    ),
    path(
        "conversations/<uuid:conversation_id>/shares",
        sharing.ConversationShareView.as_view(),
        name="conversation-share",
    ),
    path("shares", sharing.ShareListView.as_view(), name="share-list"),
    path("shares/<uuid:share_id>/revoke", sharing.ShareRevokeView.as_view(), name="share-revoke"),
    path(
        "conversations/<uuid:conversation_id>/attachments",
        threaded_view(attachments.AttachmentListView.as_view()),
        name="attachment-list",
    ),
    path(
        "conversations/<uuid:conversation_id>/attachments/<uuid:attachment_id>",
        attachments.AttachmentDetailView.as_view(),
        name="attachment-detail",
    ),
    path(
        "conversations/<uuid:conversation_id>/attachments/<uuid:attachment_id>/content",
        attachments.AttachmentContentView.as_view(),
        name="attachment-content",
    ),
    path("folders", organize.FolderListView.as_view(), name="folder-list"),
    path("folders/<uuid:folder_id>", organize.FolderDetailView.as_view(), name="folder-detail"),
    path("search", organize.SearchView.as_view(), name="message-search"),
    # Export and import (#18).
    path(
        "conversations/<uuid:conversation_id>/export.json",
        portability.ConversationExportView.as_view(),
        {"kind": "json"},
        name="conversation-export-json",
    ),
    path(
        "conversations/<uuid:conversation_id>/export.md",
        portability.ConversationExportView.as_view(),
        {"kind": "markdown"},
        name="conversation-export-markdown",
    ),
    path("export", portability.AccountExportView.as_view(), name="account-export"),
    path("imports", portability.ImportListView.as_view(), name="import-list"),
    path("imports/<uuid:job_id>", portability.ImportDetailView.as_view(), name="import-detail"),
    path("personalization", memory.PersonalizationView.as_view(), name="personalization"),
    path("memory", memory.MemoryListView.as_view(), name="memory-list"),
    path("memory/<uuid:fact_id>", memory.MemoryFactView.as_view(), name="memory-detail"),
    path(
        "memory/<uuid:fact_id>/confirm", memory.MemoryConfirmView.as_view(), name="memory-confirm"
    ),
    path(
        "memory/<uuid:fact_id>/dismiss", memory.MemoryDismissView.as_view(), name="memory-dismiss"
    ),
]
