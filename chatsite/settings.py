"""Settings for the chat service, read from the environment.

Every knob a deployment turns is an environment variable; README.md lists them.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import dj_database_url
import django_stubs_ext
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from chatsite.logs import logging_config

# Lets admin and serializer classes be subscripted for the type checker.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from exc


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from exc
    if value != value or value in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name} must be a finite number, got {raw!r}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    # Only for local development: a fixed key would make sessions forgeable in production.
    SECRET_KEY = "insecure-development-key-do-not-use-in-production"  # noqa: S105

# Encrypts plugin and MCP server secrets at rest (plugins/crypto.py): any strings, each hashed
# into a Fernet key, comma-separated; the first encrypts, every one decrypts, so a new key goes
# first and the old one stays behind it until the secrets are saved again. Its own key, not
# SECRET_KEY's: rotating SECRET_KEY (sessions, signed links) must not lose the secrets, and a
# leaked SECRET_KEY must not open them. Required unless DEBUG, as SECRET_KEY is: every process
# reads settings first, so none starts without it.
PLUGINS_ENCRYPTION_KEY = os.environ.get("PLUGINS_ENCRYPTION_KEY", "")
if not any(part.strip() for part in PLUGINS_ENCRYPTION_KEY.split(",")):
    if not DEBUG:
        raise ImproperlyConfigured(
            "PLUGINS_ENCRYPTION_KEY must be set when DEBUG is off (it encrypts plugin and MCP "
            "server secrets; e.g. python -c 'import secrets; print(secrets.token_urlsafe(50))')"
        )
    # Only for local development, as the SECRET_KEY above.
    PLUGINS_ENCRYPTION_KEY = "insecure-development-plugins-key"

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# Where prepared models and other generated files live.
DATA_DIR = Path(os.environ.get("CHATSITE_DATA_DIR", BASE_DIR / "var"))

INSTALLED_APPS = [
    # Daphne first so that `runserver` serves ASGI too.
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "csp",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "django_celery_beat",
    "accounts",
    "conversations",
    "inference",
    "moderation",
    "billing",
    "plugins",
]

# Django's own middleware, as subclasses that run their hooks on the event loop under ASGI
# instead of hopping to a thread for each (chatsite/middleware.py): the same behaviour.
# The largest request body the APIs (/api/, /v1/) read: a larger one is refused with 413
# before it is parsed, in the API's own error shape.
API_MAX_BODY_BYTES = env_int("API_MAX_BODY_BYTES", 2 * 1024 * 1024)

MIDDLEWARE = [
    "chatsite.middleware.request_id_middleware",
    "chatsite.middleware.SecurityMiddleware",
    "chatsite.middleware.CSPMiddleware",
    "chatsite.middleware.body_limit_middleware",
    "chatsite.middleware.StoreOutageMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "chatsite.middleware.SessionMiddleware",
    "chatsite.middleware.CommonMiddleware",
    "chatsite.middleware.CsrfViewMiddleware",
    "chatsite.middleware.AuthenticationMiddleware",
    "chatsite.middleware.MessageMiddleware",
    "chatsite.middleware.XFrameOptionsMiddleware",
    "billing.middleware.RateLimitHeadersMiddleware",
]

ROOT_URLCONF = "chatsite.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

ASGI_APPLICATION = "chatsite.asgi.application"
WSGI_APPLICATION = "chatsite.wsgi.application"

DATABASE_URL = os.environ.get("DATABASE_URL", "")
# Connections come from a pool in each process (psycopg's, through Django): a request, a
# scheduler step or a task borrows one and gives it back when Django closes it, so nobody
# pays for a new Postgres session (a backend process, authentication, set-up) per request.
# The pool opens connections only as threads ask for them (an edge's or the scheduler's sync
# code runs on one thread); the cap is for processes with many threads, each of which holds
# its connection until Django closes it. DB_POOL_MAX_SIZE=0 turns the pool off (Celery's
# prefork children, which must not inherit their parent's pool, run so). Persistent
# per-thread connections stay off: they leak under ASGI, where sync code runs on whichever
# thread is free.
DB_POOL_MAX_SIZE = env_int("DB_POOL_MAX_SIZE", 32)
if DATABASE_URL:
    DATABASES = {
        "default": dj_database_url.parse(DATABASE_URL, conn_max_age=0, conn_health_checks=True)
    }
    if DB_POOL_MAX_SIZE:
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": DB_POOL_MAX_SIZE,
            # A borrower that waits longer than this gets an error, not an endless queue.
            "timeout": 10,
        }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "db.sqlite3"),
        }
    }

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# REDIS_URL names any node of a Redis Cluster (chatsite/redis.py; README, "Redis Cluster").
# Django's cache and Celery do not speak Cluster: they need a plain Redis of their own.
REDIS_CLUSTER = env_bool("REDIS_CLUSTER", False)
CACHE_REDIS_URL = os.environ.get("CACHE_REDIS_URL", REDIS_URL)
if REDIS_CLUSTER and not (
    os.environ.get("CACHE_REDIS_URL")
    and os.environ.get("CELERY_BROKER_URL")
    and os.environ.get("CELERY_RESULT_BACKEND")
):
    raise ImproperlyConfigured(
        "REDIS_CLUSTER=1 needs CACHE_REDIS_URL, CELERY_BROKER_URL and CELERY_RESULT_BACKEND "
        "naming a Redis that is not a cluster"
    )

# Values are stored as JSON, never pickled: whoever can write to Redis could otherwise run
# code in every process that reads the cache. A value JSON cannot hold is refused when set.
# VERSION 2: the keys of the pickling cache (version 1) are never read back as JSON.
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": CACHE_REDIS_URL,
        "KEY_PREFIX": os.environ.get("CACHE_KEY_PREFIX", "chatsite"),
        "VERSION": 2,
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.DefaultClient",
            "SERIALIZER": "chatsite.cache.JSONSerializer",
            # The cache holds only what can be read again (moderation's thresholds, rule
            # versions, rate-limit counters): while Redis is away it misses, logged, rather
            # than failing the answer or request that asked (a failover, a restart).
            "IGNORE_EXCEPTIONS": True,
        },
    }
}
DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS = True

CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "accounts:login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # the web chat reads it to send X-CSRFToken
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

# HTTPS. Django sends Strict-Transport-Security only in answers to HTTPS requests, so plain-HTTP
# `make run` never gets it; a deployment over HTTPS does, for a year, unless DEBUG. Subdomains
# and the preload list are opt-in: a browser keeps them for as long as max-age, and preload
# for longer.
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# Behind a proxy that ends TLS: the META key of its header saying the client used HTTPS (e.g.
# HTTP_X_FORWARDED_PROTO, for X-Forwarded-Proto: https). Only set it when the proxy always
# sets or strips that header: otherwise a client could claim HTTPS.
_proxy_ssl_header = os.environ.get("SECURE_PROXY_SSL_HEADER", "").strip()
if _proxy_ssl_header and not _proxy_ssl_header.startswith("HTTP_"):
    raise ImproperlyConfigured(
        "SECURE_PROXY_SSL_HEADER names a request.META key, e.g. HTTP_X_FORWARDED_PROTO for "
        f"X-Forwarded-Proto; got {_proxy_ssl_header!r}"
    )
SECURE_PROXY_SSL_HEADER = (_proxy_ssl_header, "https") if _proxy_ssl_header else None
# Off by default: a proxy in front usually redirects already, and make run is plain HTTP.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# Django's defaults, stated because a page of this site relies on them.
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# Content-Security-Policy on every answer (django-csp, chatsite.middleware.CSPMiddleware): the
# pages load scripts, styles and data only from this origin and run no inline script or style
# (templates/ and static/js/ have none: scripts are files, config is JSON in json_script, and
# script sets styles through element.style only). img-src allows data: for the empty favicon
# and Swagger UI's stylesheet's icons. Django's admin (5.2) needs no exception: its scripts are
# files and its one inline <style> (a change list without any actions bar, which no admin here
# has) is cosmetic; django-celery-beat's periodic task form had an inline script, now a file
# (templates/admin/djcelery/). The API docs page gets its CSS from a file
# (templates/api_docs.html) and its script from its own URL (SpectacularSwaggerSplitView).
# DRF's browsable API (an /api/ URL opened in a browser) keeps its scripts; a few of its
# style="" floats and its Pygments <style> are not applied.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "frame-ancestors": [NONE],
        "form-action": [SELF],
    }
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.APIKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Signed in, and by an API key whose scope covers the view (accounts/authentication.py).
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "accounts.authentication.ApiKeyScopePermission",
    ],
    # DRF's JSON parser, refusing what Python's json takes and JSON does not (chatsite/jsonbody).
    "DEFAULT_PARSER_CLASSES": [
        "chatsite.api.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "chatsite.api.exceptions.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Chatsite API",
    "DESCRIPTION": "Conversations, messages and generations of the chat service.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI's assets from our own static files: no CDN is needed to read the docs.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Each PATCH here validates the whole body it documents (none is a partial update): its
    # request keeps the serializer's required fields, not a `Patched*` copy without them.
    "COMPONENT_SPLIT_PATCH": False,
    "ENUM_NAME_OVERRIDES": {
        "MessageStatusEnum": "conversations.models.Message.Status",
        "GenerationStatusEnum": "inference.models.Generation.Status",
    },
}

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", REDIS_URL)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Idle, a worker asks a Redis broker for work (BRPOP) again after this many seconds (kombu's
# default: 1); a task sent meanwhile is taken at once either way.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "polling_interval": env_float("CELERY_BROKER_POLL_SECONDS", 5.0),
}
# Beat reads the periodic tasks' last change from the database this often at most (the
# database scheduler's default: 5 s), so staff's edits apply within it; a task runs when due.
CELERY_BEAT_MAX_LOOP_INTERVAL = env_int("CELERY_BEAT_MAX_LOOP_SECONDS", 30)
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = "UTC"
# Periodic tasks; django_celery_beat copies these into the database, where staff edit them.
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "sweep-stale-generations": {
        "task": "inference.tasks.sweep_stale_generations",
        "schedule": 60.0,
    },
}

# Product limits.
MESSAGE_MAX_CHARS = env_int("MESSAGE_MAX_CHARS", 32_000)
SYSTEM_PROMPT_MAX_CHARS = env_int("SYSTEM_PROMPT_MAX_CHARS", 16_000)
TITLE_MAX_CHARS = 200
FOLDERS_MAX_PER_USER = env_int("FOLDERS_MAX_PER_USER", 100)
# Attachments (conversations/attachments.py): text, Markdown and PDF files on a user message.
# An upload larger than ATTACHMENT_MAX_BYTES is refused (413), as is one that would take the
# conversation's files past ATTACHMENTS_MAX_BYTES_PER_CONVERSATION; a message carries at most
# ATTACHMENTS_MAX_PER_MESSAGE. Their text takes at most ATTACHMENTS_CONTEXT_SHARE of the room the
# system prompt and the new message leave in the context; past that the chunks most like the
# message are retrieved. A file of at most ATTACHMENT_SYNC_EMBED_CHUNKS chunks is embedded as it
# is uploaded, a larger one by a Celery task.
ATTACHMENT_MAX_BYTES = env_int("ATTACHMENT_MAX_BYTES", 10 * 1024 * 1024)
ATTACHMENTS_MAX_PER_MESSAGE = env_int("ATTACHMENTS_MAX_PER_MESSAGE", 5)
ATTACHMENTS_MAX_BYTES_PER_CONVERSATION = env_int(
    "ATTACHMENTS_MAX_BYTES_PER_CONVERSATION", 50 * 1024 * 1024
)
ATTACHMENTS_CONTEXT_SHARE = env_float("ATTACHMENTS_CONTEXT_SHARE", 0.5)
ATTACHMENT_CHUNK_CHARS = env_int("ATTACHMENT_CHUNK_CHARS", 1000)
ATTACHMENT_SYNC_EMBED_CHUNKS = env_int("ATTACHMENT_SYNC_EMBED_CHUNKS", 32)
# Custom instructions and memory (conversations/memory.py): the instructions' length, facts
# kept per user, a fact's length, suggestions pending at once and asked per turn. MEMORY_MODEL
# is the pool that suggests facts (empty: the conversation's own); MEMORY_SUGGESTIONS=0 turns
# suggestions off for everyone.
INSTRUCTIONS_MAX_CHARS = env_int("INSTRUCTIONS_MAX_CHARS", 1500)
MEMORY_MAX_FACTS = env_int("MEMORY_MAX_FACTS", 50)
MEMORY_FACT_MAX_CHARS = env_int("MEMORY_FACT_MAX_CHARS", 300)
MEMORY_MAX_SUGGESTIONS = env_int("MEMORY_MAX_SUGGESTIONS", 20)
MEMORY_SUGGESTIONS_PER_TURN = env_int("MEMORY_SUGGESTIONS_PER_TURN", 3)
MEMORY_SUGGESTIONS = env_bool("MEMORY_SUGGESTIONS", True)
MEMORY_MODEL = os.environ.get("MEMORY_MODEL", "")
MEMORY_MAX_TOKENS = env_int("MEMORY_MAX_TOKENS", 96)
DEFAULT_MODEL = os.environ.get("DEFAULT_MODEL", "smollm2-135m")
# The `auto` model (conversations/auto_model.py): each answer by the small or the large pool,
# as AUTO_MODEL_CHOOSER judges the task (by default: code, a prompt of LONG_PROMPT_TOKENS or
# more and the LARGE_TIERS get the large pool). An empty AUTO_MODEL offers no `auto`.
AUTO_MODEL = os.environ.get("AUTO_MODEL", "auto")
AUTO_MODEL_SMALL = os.environ.get("AUTO_MODEL_SMALL", DEFAULT_MODEL)
AUTO_MODEL_LARGE = os.environ.get("AUTO_MODEL_LARGE", DEFAULT_MODEL)
AUTO_MODEL_LONG_PROMPT_TOKENS = env_int("AUTO_MODEL_LONG_PROMPT_TOKENS", 2000)
AUTO_MODEL_LARGE_TIERS = env_list("AUTO_MODEL_LARGE_TIERS", ["pro"])
AUTO_MODEL_CHOOSER = os.environ.get("AUTO_MODEL_CHOOSER", "conversations.auto_model.RuleChooser")

# `text` lines for people, or `json`: one JSON object a line for a log collector. Either way
# each record carries the request id and generation id it belongs to (chatsite/logs.py).
LOG_FORMAT = os.environ.get("LOG_FORMAT") or "text"
LOGGING = logging_config(LOG_FORMAT, os.environ.get("LOG_LEVEL", "INFO"))

# What an edge process loads as it starts instead of during its first user's message: the
# tokenizer that counts a context (0.25 s of CPU measured here) and the input classifiers'
# models (scikit-learn: 2.5 s). Each a function without arguments; no database in them.
EDGE_WARM_UP = env_list(
    "EDGE_WARM_UP",
    [
        "inference.tokens.warm_default_tokenizer",
        "moderation.engine.warm_input",
        "inference.edge_relay.warm",
    ],
)

# Where the edge runs the sync work of a turn (`chatsite.threads`: `/v1` chat requests and the
# conversation API's create, send, edit and regenerate): True, in a pool of threads, each with
# its own connection from the pool, so that sends arriving at once overlap their waits on
# Postgres and Redis; False, on the one thread Django gives a process's sync code, one after
# the other. The suite's in-process clients set it False: their test transaction is seen only
# on the calling thread (its live edge runs as production does).
EDGE_SYNC_THREADS = env_bool("EDGE_SYNC_THREADS", True)

# Who may read `/metrics` on the edge's public port (chatsite/ops.py): these networks (CIDRs),
# by default loopback and the private ranges a Prometheus inside the cluster scrapes from;
# anyone else gets 404. A wrong CIDR stops every process at start.
METRICS_ALLOWED_NETWORKS = env_list(
    "METRICS_ALLOWED_NETWORKS",
    ["127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"],
)
for _network in METRICS_ALLOWED_NETWORKS:
    try:
        ipaddress.ip_network(_network, strict=False)
    except ValueError as _exc:
        raise ImproperlyConfigured(f"METRICS_ALLOWED_NETWORKS: {_exc}") from _exc
# The scheduler's /metrics, /healthz and /readyz (inference/scheduler/ops.py) listen on this
# port; 0 turns them off. `run_scheduler --metrics-port` overrides it.
SCHEDULER_METRICS_PORT = env_int("SCHEDULER_METRICS_PORT", 9100)

# Inference plane. Workers named here are registered at scheduler start; staff add more in
# admin. Format: "pool=url[,pool=url...]"; the pool's served model name is the pool name.
INFERENCE_WORKERS = env_list("INFERENCE_WORKERS", [])
# Networks (CIDRs) workers may be reached on besides public addresses (chatsite/netpolicy.py):
# loopback, private, link-local and metadata addresses are refused when staff save a worker
# and on every connection unless listed here, e.g. "10.0.0.0/8" for a private worker network.
INFERENCE_WORKER_ALLOWED_NETWORKS = env_list("INFERENCE_WORKER_ALLOWED_NETWORKS", [])
INFERENCE_CLIENT = os.environ.get("INFERENCE_CLIENT", "inference.client.OpenAICompatibleClient")
# A `/v1` answer of a key that keeps nothing, without tools, is read from the worker by the
# edge that took it (inference/relay.py): the scheduler admits, places and finishes it, and
# no token passes through it or Redis. Off: every answer streams through the scheduler. The
# edge must then reach the workers as the scheduler does (the same allowed networks).
INFERENCE_DIRECT_RELAY = env_bool("INFERENCE_DIRECT_RELAY", True)
# Subscribers to what the inference plane reports (`inference.hooks`), called in this order.
INFERENCE_HOOKS = env_list(
    "INFERENCE_HOOKS",
    [
        "conversations.finish.ConversationHooks",
        "plugins.inference_hooks.SearchIndexHooks",
        "billing.inference_hooks.BillingHooks",
        "moderation.inference_hooks.ModerationHooks",
    ],
)
# The tools a conversation's model is offered: a callable(user=, conversation=) -> specs.
CONVERSATION_TOOLS_PROVIDER = os.environ.get(
    "CONVERSATION_TOOLS_PROVIDER", "plugins.selectors.tools_for_conversation"
)
INFERENCE_REDIS_PREFIX = os.environ.get("INFERENCE_REDIS_PREFIX", "cs")
# Plan tiers and the vLLM priority each gets (lower runs first), best tier first.
INFERENCE_TIER_PRIORITY = {"pro": 0, "plus": 5, "free": 10}
DEFAULT_TIER = os.environ.get("DEFAULT_TIER", "free")
SCHEDULER_MAX_QUEUE_SECONDS = env_int("SCHEDULER_MAX_QUEUE_SECONDS", 20)
# The overload policy: answers of these tiers that waited this long in a pool whose fallback
# (a smaller pool, `ModelPool.fallback`) has workers go to the fallback's queue instead; the
# answer says so. 0 turns the fallback off.
SCHEDULER_FALLBACK_AFTER_SECONDS = env_float("SCHEDULER_FALLBACK_AFTER_SECONDS", 5.0)
SCHEDULER_FALLBACK_TIERS = env_list("SCHEDULER_FALLBACK_TIERS", ["free"])
# Then new conversations of those tiers are refused (429, try again in 30 s) while this many of
# their answers wait in the pool's queue; conversations already under way go on. 0: never.
SCHEDULER_PRESSURE_QUEUED = env_int("SCHEDULER_PRESSURE_QUEUED", 32)
# A worker that sends no token for this long, once an answer has begun, is treated as hung.
SCHEDULER_STALL_SECONDS = env_int("SCHEDULER_STALL_SECONDS", 30)
# Before its first token an answer may wait in vLLM's own queue behind a full batch (the
# worker answers its health checks meanwhile); it is given up after this long.
SCHEDULER_FIRST_TOKEN_SECONDS = env_int("SCHEDULER_FIRST_TOKEN_SECONDS", 300)
# Tokens that arrive within this long of the stream's last event go out together (the first
# of a quiet stream at once): each event costs the scheduler, Redis and the edge about as much
# as a token did. At 100 ms rather than 50, a /v1 answer cost 23-24% less CPU at 1 and 8
# streams (the mean of two paired overhead runs; in those and a third at 120 ms, each of the
# six comparisons was lower), first tokens unchanged.
SCHEDULER_COALESCE_MS = env_int("SCHEDULER_COALESCE_MS", 100)
# Each replica asks every worker's /health this often while it has work (an answer running
# here, new work announced in the last idle interval, a worker down), and every
# SCHEDULER_IDLE_HEALTH_INTERVAL_MS while it has none; new work brings the next pass forward.
# A pass reads /metrics too (vLLM's counts: running, waiting, its cache) while work waits for
# room, at most an idle interval after the last reading, after an idle spell and for a worker
# without one; rendering /metrics costs a vLLM server milliseconds of CPU, /health next to none.
SCHEDULER_HEALTH_INTERVAL_MS = env_int("SCHEDULER_HEALTH_INTERVAL_MS", 1000)
SCHEDULER_IDLE_HEALTH_INTERVAL_MS = env_int("SCHEDULER_IDLE_HEALTH_INTERVAL_MS", 5000)
# How a generation (and a background completion) picks its worker: "predicted_ttft" (the
# soonest first token, by the prompt tokens each worker's KV cache lacks, its backlog and its
# streams), "affinity" (the worker of the conversation's last turn, unless it is much busier),
# "least_loaded", "round_robin" (for comparison), or the dotted path to a policy class
# (inference/scheduler/placement.py). Anything else stops every process at start.
SCHEDULER_PLACEMENT = os.environ.get("SCHEDULER_PLACEMENT", "predicted_ttft")
# predicted_ttft's model of a worker until its own first tokens are fitted (`TTFTFit`): a
# first token takes BASE + MS_PER_TOKEN per prompt token to read first + MS_PER_STREAM per
# answer decoding there; each of those answers loses INTERFERENCE times the new prompt's
# reading time, and each request there still waiting for its first token CROWDING times it
# (benchmarks/fleet_sim.py: 1.0 lowered TTFT p99 on 64 and 256 workers past capacity, against
# 0). PLACEMENT_RATE_SECONDS: how fast a worker's rate of placements forgets (a time constant),
# which sends a new prompt to the least lately used among the workers with the smallest caches.
# The defaults are a vLLM CPU worker's: 150 ms to a first token alone, and the
# middle of the fits the scheduler made on benchmarks/router_race.py's trace (1.2-2.3 ms per
# token, 2-60 ms per stream).
SCHEDULER_TTFT_BASE_MS = env_float("SCHEDULER_TTFT_BASE_MS", 150.0)
SCHEDULER_TTFT_MS_PER_TOKEN = env_float("SCHEDULER_TTFT_MS_PER_TOKEN", 1.5)
SCHEDULER_TTFT_MS_PER_STREAM = env_float("SCHEDULER_TTFT_MS_PER_STREAM", 15.0)
SCHEDULER_TTFT_INTERFERENCE = env_float("SCHEDULER_TTFT_INTERFERENCE", 0.1)
SCHEDULER_TTFT_CROWDING = env_float("SCHEDULER_TTFT_CROWDING", 1.0)
SCHEDULER_PLACEMENT_RATE_SECONDS = env_float("SCHEDULER_PLACEMENT_RATE_SECONDS", 5.0)
# A conversation's first turn leaves a home whose rate of placements is past SPILL times the
# pool's mean, for the smallest cache: a popular shared prompt gets a second worker (0: never).
# benchmarks/fleet_sim.py, seed 15, 1.2 of capacity: TTFT p99 on 256 workers 1.9 s against
# 2.7 s without it, for 0.01 of prefix hit rate; on 64 workers 1.2 gave 2.0 s, 1.5 2.3 s, 2.0
# 2.5 s and none 2.5 s.
SCHEDULER_SPILL = env_float("SCHEDULER_SPILL", 1.2)
# A request stays with its home (the worker holding most of its prompt, or the conversation's
# last one) unless another predicts a first token sooner by more than this share and this many
# ms. Tuned on the race's trace with another seed: 0.2/50 hit 0.830 of prompt tokens, 1.0/200
# 0.844, 2.0/400 0.837, never leaving 0.838 (an unlimited cache: 0.87).
SCHEDULER_HYSTERESIS = env_float("SCHEDULER_HYSTERESIS", 1.0)
SCHEDULER_HYSTERESIS_MS = env_float("SCHEDULER_HYSTERESIS_MS", 200.0)
# What runs the tools a model calls, and what checks answers while they stream (dotted paths).
INFERENCE_TOOL_RUNNER = os.environ.get("INFERENCE_TOOL_RUNNER", "plugins.runner.PluginToolRunner")
INFERENCE_OUTPUT_GUARD = os.environ.get(
    "INFERENCE_OUTPUT_GUARD", "moderation.output.StreamingOutputGuard"
)
# Affinity yields to least-loaded when the sticky worker carries this many more requests.
SCHEDULER_AFFINITY_SLACK = env_int("SCHEDULER_AFFINITY_SLACK", 4)
SCHEDULER_AFFINITY_TTL_SECONDS = env_int("SCHEDULER_AFFINITY_TTL_SECONDS", 3600)
# A worker's leases may hold this many times the tokens its KV cache has room for, each
# counted as its prompt plus its max_tokens (most answers end well before max_tokens; vLLM
# pre-empts and resumes if the cache runs out). 0 leaves only max_concurrency.
SCHEDULER_KV_OVERCOMMIT = env_float("SCHEDULER_KV_OVERCOMMIT", 1.0)
# The share of a worker's room (its max_concurrency and its KV budget) that a tier's answers
# may fill, counting every lease on it. The free tier stops short, so the room above is kept
# for paid answers; pro may go past the budget on purpose: vLLM's priority scheduling serves
# its prompt first and pre-empts free answers if the cache runs out. A tier not named: 1.0.
SCHEDULER_TIER_SHARE = {
    "pro": env_float("SCHEDULER_TIER_SHARE_PRO", 1.25),
    "plus": env_float("SCHEDULER_TIER_SHARE_PLUS", 1.0),
    "free": env_float("SCHEDULER_TIER_SHARE_FREE", 0.75),
}
GENERATION_STREAM_TTL_SECONDS = env_int("GENERATION_STREAM_TTL_SECONDS", 3600)
# Server-Sent Events: heartbeat comments while idle, client retry delay, and how long a
# generation whose watchers all left after its first token waits for one to come back.
STREAM_HEARTBEAT_SECONDS = env_int("STREAM_HEARTBEAT_SECONDS", 15)
STREAM_RETRY_MS = env_int("STREAM_RETRY_MS", 3000)
STREAM_GRACE_SECONDS = env_int("STREAM_GRACE_SECONDS", 30)
# The same wait for one whose watchers all left before its first token (queued, or on a
# worker), or whose page said it is going away (closed or reloaded): long enough for a
# network blip or a reload to re-attach, short enough not to hold a place in line for nobody.
STREAM_FIRST_TOKEN_GRACE_SECONDS = env_float("STREAM_FIRST_TOKEN_GRACE_SECONDS", 5.0)
# A browser reloading a page asks for the new one before the old one's beacon: a beacon this
# soon after a page of the web chat was served to its user comes from a reload, and leaves
# the answer the short grace instead of stopping it at once.
STREAM_RELOAD_SECONDS = env_float("STREAM_RELOAD_SECONDS", 10.0)
GENERATION_MAX_ATTEMPTS = env_int("GENERATION_MAX_ATTEMPTS", 2)
# A scheduler replica that has not beaten its heartbeat for this long is dead: a live one
# adopts its answers and restarts them on a worker (inference/scheduler/adoption.py).
SCHEDULER_REPLICA_TTL_SECONDS = env_float("SCHEDULER_REPLICA_TTL_SECONDS", 5.0)
# A Redis outage shorter than this (a failover) fails no answer: the scheduler holds up to
# SCHEDULER_REDIS_OUTAGE_EVENTS stream events and appends them, in order, when it is back.
SCHEDULER_REDIS_OUTAGE_SECONDS = env_float("SCHEDULER_REDIS_OUTAGE_SECONDS", 30.0)
SCHEDULER_REDIS_OUTAGE_EVENTS = env_int("SCHEDULER_REDIS_OUTAGE_EVENTS", 100_000)
# Where `prepare_model` puts the served model; the web tier reads only its tokenizer.json.
MODEL_DIR = Path(os.environ.get("MODEL_DIR", DATA_DIR / "models" / "smollm2-135m-instruct"))
WORKER_PYTHON = os.environ.get("WORKER_PYTHON", str(BASE_DIR / ".venv-worker" / "bin" / "python"))
# Token counts kept per process for the messages a /v1 request sends again with every turn.
TOKEN_COUNT_MEMO_ENTRIES = env_int("TOKEN_COUNT_MEMO_ENTRIES", 4096)
# Token ids kept per process (scheduler, emulated workers) for the long pieces of prompts a
# conversation sends again with every turn: 4 bytes a token, 2,048 pieces.
TOKEN_PIECE_MEMO_ENTRIES = env_int("TOKEN_PIECE_MEMO_ENTRIES", 2048)

# Billing: plans, quotas, the usage ledger and statements (billing/).
BILLING_REDIS_PREFIX = os.environ.get("BILLING_REDIS_PREFIX", f"{INFERENCE_REDIS_PREFIX}:bill")
BILLING_CURRENCY = os.environ.get("BILLING_CURRENCY", "USD")
BILLING_MINOR_DIGITS = env_int("BILLING_MINOR_DIGITS", 2)
BILLING_PAYMENT_PROVIDER = os.environ.get(
    "BILLING_PAYMENT_PROVIDER", "billing.providers.OfflineProvider"
)
# A concurrency slot whose holder died lapses after this; the reconciler renews the slots of
# generations still in flight, so it only bounds how long a leaked slot blocks a user.
BILLING_SLOT_TTL_SECONDS = env_int("BILLING_SLOT_TTL_SECONDS", 600)
BILLING_RESERVATION_TTL_SECONDS = env_int("BILLING_RESERVATION_TTL_SECONDS", 24 * 3600)
# Retry-After of a refusal for too many answers in progress (when one ends is unknown).
BILLING_CONCURRENCY_RETRY_SECONDS = env_int("BILLING_CONCURRENCY_RETRY_SECONDS", 2)
# The reconciler leaves alone what is younger than this (a transaction may still commit).
BILLING_RECONCILE_GRACE_SECONDS = env_int("BILLING_RECONCILE_GRACE_SECONDS", 120)
BILLING_RECONCILE_LOOKBACK_DAYS = env_int("BILLING_RECONCILE_LOOKBACK_DAYS", 7)
# A month is closed into statements this long after it ends (late usage events land first).
BILLING_STATEMENT_DELAY_SECONDS = env_int("BILLING_STATEMENT_DELAY_SECONDS", 3600)
BILLING_IDEMPOTENCY_TTL_SECONDS = env_int("BILLING_IDEMPOTENCY_TTL_SECONDS", 24 * 3600)
BILLING_IDEMPOTENCY_PENDING_SECONDS = env_int("BILLING_IDEMPOTENCY_PENDING_SECONDS", 60)
# Answers under these paths carry the x-ratelimit-* headers of the caller's plan.
BILLING_RATELIMIT_HEADER_PATHS = env_list("BILLING_RATELIMIT_HEADER_PATHS", ["/api/", "/v1/"])
# Request-level abuse limits per client IP (django-ratelimit, on the Redis cache).
BILLING_ABUSE_RATES = {
    "login": os.environ.get("RATE_LIMIT_LOGIN", "10/m"),
    "signup": os.environ.get("RATE_LIMIT_SIGNUP", "5/h"),
    "api_key_create": os.environ.get("RATE_LIMIT_API_KEY_CREATE", "20/h"),
    "message_post": os.environ.get("RATE_LIMIT_MESSAGE_POST", "60/m"),
    # Each share link copies a branch: a bound on how fast one address can pile them up.
    "share_create": os.environ.get("RATE_LIMIT_SHARE_CREATE", "60/h"),
}
RATELIMIT_USE_CACHE = "default"
# While Redis is away (a failover, seconds) the abuse counters cannot count: requests go on
# to the steps that need Redis themselves (quotas, the queue), which answer 503, rather than
# everyone being told they tried too often.
RATELIMIT_FAIL_OPEN = True
# Behind a proxy, the META key holding the client address (e.g. HTTP_X_REAL_IP).
RATELIMIT_IP_META_KEY = os.environ.get("RATELIMIT_IP_META_KEY") or None
CELERY_BEAT_SCHEDULE["billing-reconcile-usage"] = {
    "task": "billing.tasks.reconcile_usage",
    "schedule": 60.0,
}
CELERY_BEAT_SCHEDULE["billing-close-statements"] = {
    "task": "billing.tasks.close_statements",
    "schedule": 3600.0,
}

# Plugins (plugins/): tools from the built-in modules below and from packages that register
# the entry point group `chatsite.plugins`; staff enable them per plan in admin.
PLUGINS_BUILTIN = env_list(
    "PLUGINS_BUILTIN",
    [
        "plugins.builtin.calculator:plugin",
        "plugins.builtin.clock:plugin",
        "plugins.builtin.url_fetch:plugin",
        "plugins.builtin.conversation_search:plugin",
    ],
)
# PLUGINS_ENCRYPTION_KEY, which encrypts their secrets, is read at the top of this file.
# A tool call running longer is abandoned with `timeout`; a result longer is `too_large`.
PLUGINS_TOOL_TIMEOUT_SECONDS = env_int("PLUGINS_TOOL_TIMEOUT_SECONDS", 10)
PLUGINS_RESULT_MAX_CHARS = env_int("PLUGINS_RESULT_MAX_CHARS", 16000)
# Tool calls running at once in one process (hung ones included); beyond, `unavailable`.
PLUGINS_MAX_RUNNING = env_int("PLUGINS_MAX_RUNNING", 32)
# Whether a conversation offers its plan's tools until the user switches them off. Off by
# default: tool schemas cost prompt tokens on every turn, and a small model calls tools it
# need not; the user switches the tools they want on in the chat's Tools menu.
PLUGINS_TOOLS_ON_BY_DEFAULT = env_bool("PLUGINS_TOOLS_ON_BY_DEFAULT", False)

# Background work of conversations (conversations/tasks.py): titles, rolling summaries and
# history retention. The scheduler below seeds CELERY_BEAT_SCHEDULE into the database once;
# from then on staff edit the periodic tasks in admin and a restart never overwrites them.
CELERY_BEAT_SCHEDULER = "chatsite.beat.SeedOnceDatabaseScheduler"
CELERY_BEAT_SCHEDULE["conversations-purge-expired"] = {
    "task": "conversations.tasks.purge_expired_conversations",
    "schedule": 3600.0,
}
# Titles and summaries are asked of a pool's workers directly, at this vLLM priority (lower
# runs first; above every tier's, so users' answers go first), within this many seconds.
BACKGROUND_LLM_PRIORITY = env_int("BACKGROUND_LLM_PRIORITY", 20)
BACKGROUND_LLM_TIMEOUT_SECONDS = env_int("BACKGROUND_LLM_TIMEOUT_SECONDS", 60)
# The pool that writes titles and summaries; empty: the conversation's own pool.
TITLE_MODEL = os.environ.get("TITLE_MODEL", "")
SUMMARY_MODEL = os.environ.get("SUMMARY_MODEL", "")
TITLE_MAX_TOKENS = env_int("TITLE_MAX_TOKENS", 24)
AUTO_TITLE_MAX_CHARS = env_int("AUTO_TITLE_MAX_CHARS", 60)
SUMMARY_MAX_TOKENS = env_int("SUMMARY_MAX_TOKENS", 256)
# Right after a (re-)summary, the turns kept verbatim fill at most this share of the context
# budget; the rest is room for new turns, so the next summary waits until they overflow it
# again and the prompt's prefix (system, first message, summary) stays cached meanwhile.
SUMMARY_TAIL_PERCENT = env_int("SUMMARY_TAIL_PERCENT", 50)
# Per-user event stream (titles, deletions) for open pages: entries kept, and for how long.
USER_EVENTS_MAXLEN = env_int("USER_EVENTS_MAXLEN", 200)
USER_EVENTS_TTL_SECONDS = env_int("USER_EVENTS_TTL_SECONDS", 24 * 3600)
# Conversations purged per plan per run of the retention task (the rest wait for the next).
RETENTION_PURGE_BATCH = env_int("RETENTION_PURGE_BATCH", 500)

# Shipped plugins (plugins/builtin/). url_fetch never reaches loopback, private, link-local or
# metadata addresses; the only way past its guard is this list of exact "address:port" pairs
# (empty by default; the tests name their own local server here).
PLUGINS_URL_FETCH_ALLOWED_ADDRESSES = env_list("PLUGINS_URL_FETCH_ALLOWED_ADDRESSES", [])
# MCP servers are held to the same address policy (chatsite/netpolicy.py), when staff save one
# and on every connection; these networks (CIDRs) are allowed besides public addresses.
PLUGINS_MCP_ALLOWED_NETWORKS = env_list("PLUGINS_MCP_ALLOWED_NETWORKS", [])
# conversation_search: messages of the caller embedded at query time when not yet indexed,
# and the most recent indexed messages a query compares against.
PLUGINS_SEARCH_LAZY_INDEX_LIMIT = env_int("PLUGINS_SEARCH_LAZY_INDEX_LIMIT", 64)
PLUGINS_SEARCH_MAX_CANDIDATES = env_int("PLUGINS_SEARCH_MAX_CANDIDATES", 20000)

# The tool loop (inference/scheduler/): tool rounds one answer may make; past the cap the
# model is asked once more with tool_choice "none" and must answer from what it has.
TOOL_LOOP_MAX_ROUNDS = env_int("TOOL_LOOP_MAX_ROUNDS", 4)

CELERY_IMPORTS: list[str] = []

# Moderation (moderation/): classifiers chained by dotted path (a category's score is the
# highest any of them gives), per-category thresholds (staff override them in admin), the
# rolling window on streamed answers, and the strikes policy.
MODERATION_BACKENDS = env_list(
    "MODERATION_BACKENDS", ["moderation.classifiers.local.LocalClassifier"]
)
MODERATION_INPUT_ENABLED = env_bool("MODERATION_INPUT_ENABLED", True)
MODERATION_OUTPUT_ENABLED = env_bool("MODERATION_OUTPUT_ENABLED", True)
# A backend that fails (unreachable, garbage): closed refuses the text (503
# moderation_unavailable on input, a withheld answer on output); open lets it through on the
# other backends' word. Either way the failure is logged.
MODERATION_FAIL_CLOSED = env_bool("MODERATION_FAIL_CLOSED", False)
# {category: {"block": score or None, "review": score or None}}; "default" for the rest.
# Casual swearing is not blocked; profanity aimed at someone scores as harassment.
MODERATION_THRESHOLDS: dict[str, dict[str, float | None]] = {
    "default": {"block": 0.8, "review": 0.5},
    "profanity": {"block": None, "review": None},
    "harassment": {"block": 0.8, "review": 0.7},
}
MODERATION_BUILTIN_RULES = env_bool("MODERATION_BUILTIN_RULES", True)
# Extra rules: [{"category": "S2", "kind": "term" | "regex", "pattern": "...", "score": 1.0}].
MODERATION_RULES: list[dict[str, object]] = []
# Streamed answers are checked on a window of about this many tokens (4 characters each),
# overlapping the previous window by this many, and once more whole at the end.
MODERATION_WINDOW_TOKENS = env_int("MODERATION_WINDOW_TOKENS", 200)
MODERATION_WINDOW_OVERLAP_TOKENS = env_int("MODERATION_WINDOW_OVERLAP_TOKENS", 50)
# Scores kept per process for texts that come back (a /v1 conversation's earlier messages and
# system prompt, checked again with every turn): entries of ~0.3 KB, keyed by a digest.
MODERATION_MEMO_ENTRIES = env_int("MODERATION_MEMO_ENTRIES", 4096)
MODERATION_RETRACT_NOTICE = os.environ.get(
    "MODERATION_RETRACT_NOTICE", "This answer was withdrawn because it broke the content policy."
)
# Strikes: this many confirmed flags within the window suspend the account automatically.
MODERATION_STRIKES_COUNT = env_int("MODERATION_STRIKES_COUNT", 3)
MODERATION_STRIKES_WINDOW_DAYS = env_int("MODERATION_STRIKES_WINDOW_DAYS", 30)
MODERATION_STRIKES_SUSPEND_HOURS = env_int("MODERATION_STRIKES_SUSPEND_HOURS", 24)
# Suspension lengths offered to staff in the review queue.
MODERATION_SUSPEND_HOURS_CHOICES = [24, 24 * 7, 24 * 30]
# Llama Guard backend: a model pool of our own (vLLM workers registered in admin).
MODERATION_LLAMA_GUARD_POOL = os.environ.get("MODERATION_LLAMA_GUARD_POOL", "llama-guard")
MODERATION_LLAMA_GUARD_TIMEOUT_SECONDS = env_int("MODERATION_LLAMA_GUARD_TIMEOUT_SECONDS", 10)
# OpenAI-format moderation API backend.
MODERATION_OPENAI_URL = os.environ.get("MODERATION_OPENAI_URL", "https://api.openai.com/v1")
MODERATION_OPENAI_API_KEY = os.environ.get("MODERATION_OPENAI_API_KEY", "")
MODERATION_OPENAI_MODEL = os.environ.get("MODERATION_OPENAI_MODEL", "omni-moderation-latest")
MODERATION_OPENAI_TIMEOUT_SECONDS = env_int("MODERATION_OPENAI_TIMEOUT_SECONDS", 10)

# Export and import (#18, conversations/portability/). The largest file an import takes (a
# larger one is refused with 413 `import_too_large`); the pieces the upload is kept in, in
# Postgres, for the Celery worker that imports it, wherever it runs; the uncompressed size a
# zip's conversations may reach (a zip bomb is refused). The upload endpoint's body limit
# follows IMPORT_MAX_BYTES (`API_BODY_LIMITS_BY_PATH`, read by chatsite.middleware).
IMPORT_MAX_BYTES = env_int("IMPORT_MAX_BYTES", 200 * 1024 * 1024)
IMPORT_CHUNK_BYTES = env_int("IMPORT_CHUNK_BYTES", 1024 * 1024)
IMPORT_ZIP_MAX_UNCOMPRESSED_BYTES = env_int(
    "IMPORT_ZIP_MAX_UNCOMPRESSED_BYTES", 2 * IMPORT_MAX_BYTES
)
# Routes that take files, by a regular expression of the whole path: a file of up to its
# setting's size and its multipart form's framing.
API_BODY_LIMITS_BY_PATH = {
    "/api/v1/imports": IMPORT_MAX_BYTES + 1024 * 1024,
    "/api/v1/conversations/[0-9a-fA-F-]{36}/attachments": ATTACHMENT_MAX_BYTES + 64 * 1024,
}
CELERY_IMPORTS.append("conversations.portability.tasks")
CELERY_IMPORTS.append("conversations.attachment_tasks")
