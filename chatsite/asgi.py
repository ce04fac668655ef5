"""ASGI entry point, served by the edge (`python -m chatsite.edge`, uvicorn).

HTTP (pages, the JSON API, SSE streams) goes to Django; Channels' router leaves room
for other protocols without another process.
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

# Django must be set up before anything imports models (as `get_asgi_application` does).
django.setup(set_prefix=False)

from chatsite import tracing  # noqa: E402
from chatsite.threads import EdgeHandler  # noqa: E402

# Spans of the turns this edge accepts, if an OTLP endpoint is configured.
tracing.configure("chatsite-edge")

# Django's handler, with each request's thread-sensitive code on a reused thread.
django_asgi_app = EdgeHandler()

from channels.routing import ProtocolTypeRouter  # noqa: E402

application = ProtocolTypeRouter({"http": django_asgi_app})

from chatsite.edge import tune_gc, warm_up  # noqa: E402

# What an edge process's first message would load, loaded as the process starts (see
# `EDGE_WARM_UP`); before `tune_gc`, so it is frozen with the rest.
warm_up()

# Loaded once per edge process: from here on its garbage is collected as an edge can afford.
tune_gc()
