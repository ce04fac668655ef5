"""ASGI entry point, served by the edge (`python -m chatsite.edge`, uvicorn).

HTTP (pages, the JSON API, SSE streams) goes to Django; Channels' router leaves room
for other protocols without another process.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

# Django must be set up before anything imports models.
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

application = ProtocolTypeRouter({"http": django_asgi_app})

from chatsite.edge import tune_gc, warm_up  # noqa: E402

# What an edge process's first message would load, loaded as the process starts (see
# `EDGE_WARM_UP`); before `tune_gc`, so it is frozen with the rest.
warm_up()

# Loaded once per edge process: from here on its garbage is collected as an edge can afford.
tune_gc()
