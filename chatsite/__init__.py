"""The chat service's Django project."""

from .celery import app as celery_app

# The service's release; plugins declare the range they work with against it.
__version__ = "0.1.0"

__all__ = ["__version__", "celery_app"]
