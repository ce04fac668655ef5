"""Routes of conversations and messages under /api/v1/ (no trailing slashes)."""

from django.urls import path

from . import events, views

urlpatterns = [
    path("events/stream", events.user_event_stream, name="user-event-stream"),
    path("conversations", views.ConversationListView.as_view(), name="conversation-list"),
    path(
        "conversations/<uuid:conversation_id>",
        views.ConversationDetailView.as_view(),
        name="conversation-detail",
    ),
    path(
        "conversations/<uuid:conversation_id>/messages",
        views.MessageListView.as_view(),
        name="message-list",
    ),
    path(
        "conversations/<uuid:conversation_id>/messages/<uuid:message_id>",
        views.MessageDetailView.as_view(),
        name="message-detail",
    ),
    path(
        "conversations/<uuid:conversation_id>/messages/<uuid:message_id>/edit",
        views.MessageEditView.as_view(),
        name="message-edit",
    ),
    path(
        "conversations/<uuid:conversation_id>/messages/<uuid:message_id>/regenerate",
        views.MessageRegenerateView.as_view(),
        name="message-regenerate",
    ),
    path(
        "conversations/<uuid:conversation_id>/branch",
        views.BranchSwitchView.as_view(),
        name="branch-switch",
    ),
]
