"""Settings for the chat service, read from the environment.

Every knob a deployment turns is an environment variable; README.md lists them.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

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

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "chatsite.middleware.RateLimitHeadersMiddleware",
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
if DATABASE_URL:
    # Persistent connections leak under ASGI (each request's sync code may run on a new
    # thread, and a thread keeps its connection): close them after each request by default.
    DATABASES = {
        "default": dj_database_url.parse(
            DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0), conn_health_checks=True
        )
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "db.sqlite3"),
        }
    }

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": os.environ.get("CACHE_KEY_PREFIX", "chatsite"),
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
}

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

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.APIKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
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
DEFAULT_MODEL = os.environ.get("DEFAULT_MODEL", "smollm2-135m")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}

# Inference plane. Workers named here are registered at scheduler start; staff add more in
# admin. Format: "pool=url[,pool=url...]"; the pool's served model name is the pool name.
INFERENCE_WORKERS = env_list("INFERENCE_WORKERS", [])
INFERENCE_CLIENT = os.environ.get("INFERENCE_CLIENT", "inference.client.OpenAICompatibleClient")
INFERENCE_REDIS_PREFIX = os.environ.get("INFERENCE_REDIS_PREFIX", "cs")
# Plan tiers and the vLLM priority each gets (lower runs first), best tier first.
INFERENCE_TIER_PRIORITY = {"pro": 0, "plus": 5, "free": 10}
DEFAULT_TIER = os.environ.get("DEFAULT_TIER", "free")
SCHEDULER_MAX_QUEUE_SECONDS = env_int("SCHEDULER_MAX_QUEUE_SECONDS", 20)
# A worker that sends no token for this long is treated as hung.
SCHEDULER_STALL_SECONDS = env_int("SCHEDULER_STALL_SECONDS", 30)
SCHEDULER_COALESCE_MS = env_int("SCHEDULER_COALESCE_MS", 50)
SCHEDULER_HEALTH_INTERVAL_MS = env_int("SCHEDULER_HEALTH_INTERVAL_MS", 1000)
# How a generation picks its worker: "affinity" (the worker holding the conversation's
# prefix, unless it is much busier), "least_loaded", or "round_robin" (for comparison).
SCHEDULER_PLACEMENT = os.environ.get("SCHEDULER_PLACEMENT", "affinity")
# Affinity yields to least-loaded when the sticky worker carries this many more requests.
SCHEDULER_AFFINITY_SLACK = env_int("SCHEDULER_AFFINITY_SLACK", 4)
SCHEDULER_AFFINITY_TTL_SECONDS = env_int("SCHEDULER_AFFINITY_TTL_SECONDS", 3600)
# Above this KV-cache use (percent) a worker takes no new generation.
SCHEDULER_KV_CACHE_HIGH_PERCENT = env_int("SCHEDULER_KV_CACHE_HIGH_PERCENT", 90)
SCHEDULER_MAX_WAITING_PER_WORKER = env_int("SCHEDULER_MAX_WAITING_PER_WORKER", 2)
GENERATION_STREAM_TTL_SECONDS = env_int("GENERATION_STREAM_TTL_SECONDS", 3600)
# Server-Sent Events: heartbeat comments while idle, client retry delay, and how long a
# generation whose watchers all left after its first token waits for one to come back.
STREAM_HEARTBEAT_SECONDS = env_int("STREAM_HEARTBEAT_SECONDS", 15)
STREAM_RETRY_MS = env_int("STREAM_RETRY_MS", 3000)
STREAM_GRACE_SECONDS = env_int("STREAM_GRACE_SECONDS", 30)
GENERATION_MAX_ATTEMPTS = env_int("GENERATION_MAX_ATTEMPTS", 2)
# Where `prepare_model` puts the served model; the web tier reads only its tokenizer.json.
MODEL_DIR = Path(os.environ.get("MODEL_DIR", DATA_DIR / "models" / "smollm2-135m-instruct"))
WORKER_PYTHON = os.environ.get("WORKER_PYTHON", str(BASE_DIR / ".venv-worker" / "bin" / "python"))

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
}
RATELIMIT_USE_CACHE = "default"
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
