"""Routes of the OpenAI-compatible API, mounted at `/v1/` (OpenAI's paths, no trailing slash)."""

from django.urls import path

from . import views

app_name = "openai_api"

urlpatterns = [
    path("models", views.model_list, name="models"),
    path("models/<str:model_id>", views.model_detail, name="model"),
    path("chat/completions", views.chat_completions, name="chat-completions"),
]
