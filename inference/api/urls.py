from django.urls import path

from . import stream, views

urlpatterns = [
    path(
        "generations/<uuid:generation_id>",
        views.GenerationDetailView.as_view(),
        name="generation-detail",
    ),
    path(
        "generations/<uuid:generation_id>/stream",
        stream.generation_stream,
        name="generation-stream",
    ),
    path(
        "generations/<uuid:generation_id>/cancel",
        views.GenerationCancelView.as_view(),
        name="generation-cancel",
    ),
]
