"""WSGI entry point, for tools that want one; production serves ASGI through the edge
(`python -m chatsite.edge`, uvicorn)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

application = get_wsgi_application()
