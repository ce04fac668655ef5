"""Routes of billing under /api/v1/."""

from django.urls import path

from . import views

urlpatterns = [
    path("billing/usage", views.UsageView.as_view(), name="billing-usage"),
    path("billing/statements", views.StatementListView.as_view(), name="billing-statements"),
]
