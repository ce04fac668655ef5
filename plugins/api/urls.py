"""Routes of the plugins app under /api/v1/."""

from django.urls import path

from . import views

urlpatterns = [
    path(
        "conversations/<uuid:conversation_id>/tools",
        views.ConversationToolsView.as_view(),
        name="conversation-tools",
    ),
]
