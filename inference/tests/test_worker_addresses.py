"""Worker URLs and the address policy: a worker on a loopback, private, link-local or metadata
address is refused when staff save it, when INFERENCE_WORKERS registers it, and when the
client connects (its host name resolved then), unless INFERENCE_WORKER_ALLOWED_NETWORKS
allows the address; so is a worker's KV events endpoint, when saved and when the scheduler
connects to it. Against a stand-in worker on 127.0.0.1."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from chatsite.errors import ServiceError
from chatsite.netpolicy import AddressRefused
from inference.client import FaultCode, OpenAICompatibleClient, WorkerFault, kv_events_address
from inference.models import ModelPool, Worker
from inference.scheduler import kv_events, prefix
from inference.services import workers_sync_from_settings

from .fake_worker import FakeWorker


def _worker(url: str) -> Worker:
    pool = ModelPool(name="p", served_model="p")
    return Worker(pool=pool, name="w-1", url=url)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://169.254.169.254/", "'169.254.169.254' is a cloud metadata address"),
        ("http://127.0.0.1:6379", "'127.0.0.1' is a loopback address"),
        ("http://10.0.0.5:8000", "'10.0.0.5' is a private address"),
        ("http://192.168.1.20:8000", "'192.168.1.20' is a private address"),
        ("http://[fe80::1]:8000", "'fe80::1' is a link-local address"),
        ("http://localhost:8101", "'localhost' resolves to"),
    ],
)
def test_a_worker_on_a_non_public_address_is_refused(settings: Any, url: str, says: str) -> None:
    settings.INFERENCE_WORKER_ALLOWED_NETWORKS = []

    with pytest.raises(ValidationError) as refused:
        _worker(url).clean()

    [message] = refused.value.message_dict["url"]
    assert says in message
    assert "INFERENCE_WORKER_ALLOWED_NETWORKS" in message


def test_a_private_worker_network_is_allowed_only_where_the_setting_says(settings: Any) -> None:
    settings.INFERENCE_WORKER_ALLOWED_NETWORKS = ["10.0.0.0/8"]

    _worker("http://10.0.0.5:8000").clean()
    for url in ("http://192.168.1.20:8000", "http://169.254.169.254/", "http://127.0.0.1:6379"):
        with pytest.raises(ValidationError):
            _worker(url).clean()


@pytest.mark.django_db
def test_admin_shows_the_refusal_on_the_url_field(admin_client: Client, settings: Any) -> None:
    settings.INFERENCE_WORKER_ALLOWED_NETWORKS = []
    pool = ModelPool.objects.create(name="p", served_model="p")
    form = {
        "pool": pool.pk,
        "name": "w-1",
        "url": "http://169.254.169.254/",
        "state": "down",
        "max_concurrency": 256,
        "kv_events_endpoint": "",
        "kv_events_replay_endpoint": "",
    }

    refused = admin_client.post("/admin/inference/worker/add/", form)
    settings.INFERENCE_WORKER_ALLOWED_NETWORKS = ["169.254.169.254/32"]
    allowed = admin_client.post("/admin/inference/worker/add/", form)

    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert list(errors) == ["url"]
    assert "a cloud metadata address" in errors["url"][0]
    assert allowed.status_code == 302, "an allowed network is staff's decision"
    assert Worker.objects.get().url == "http://169.254.169.254/"


@pytest.mark.django_db
def test_inference_workers_entries_are_held_to_the_policy(settings: Any) -> None:
    settings.INFERENCE_WORKER_ALLOWED_NETWORKS = []
    settings.INFERENCE_WORKERS = ["small=http://169.254.169.254:8000"]

    with pytest.raises(ServiceError) as refused:
        workers_sync_from_settings()

    assert refused.value.code == "bad_worker_setting"
    assert "cloud metadata" in refused.value.message
    assert not Worker.objects.exists()
    settings.INFERENCE_WORKER_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.INFERENCE_WORKERS = ["small=http://127.0.0.1:8101"]
    [worker] = workers_sync_from_settings()
    assert worker.url == "http://127.0.0.1:8101"


def _resolve(monkeypatch: pytest.MonkeyPatch, host: str, address: str) -> None:
    """`host` resolves to `address` (as a DNS answer changed after staff saved the URL)."""
    real = socket.getaddrinfo

    def getaddrinfo(name: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if name != host:
            return real(name, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "rebound.example"])
async def test_the_client_refuses_a_worker_address_when_it_connects(
    fake_workers: Any, settings: Any, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    _resolve(monkeypatch, "rebound.example", "127.0.0.1")
    worker: FakeWorker = fake_workers()
    url = worker.url.replace("127.0.0.1", host)
    client = OpenAICompatibleClient()
    try:
        assert (await client.health(url)).running == 0, "allowed, the worker is reached"
        settings.INFERENCE_WORKER_ALLOWED_NETWORKS = []
        await client.aclose()

        with pytest.raises(WorkerFault) as health:
            await client.health(url)
        with pytest.raises(WorkerFault) as chat:
            async for _ in client.stream_chat(
                base_url=url,
                model="fake",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=8,
                priority=0,
            ):
                pass
    finally:
        await client.aclose()

    for fault in (health.value, chat.value):
        assert fault.code == FaultCode.WORKER_UNREACHABLE
        assert "'127.0.0.1' is a loopback address" in fault.message
        assert "INFERENCE_WORKER_ALLOWED_NETWORKS" in fault.message
    assert worker.requests == [], "no request reached the worker"


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [
        ("tcp://169.254.169.254:5557", "'169.254.169.254' is a cloud metadata address"),
        ("tcp://127.0.0.1:6379", "'127.0.0.1' is a loopback address"),
        ("tcp://10.0.0.5:5557", "'10.0.0.5' is a private address"),
        ("ipc:///tmp/kv-events", "Only a ZeroMQ address tcp://host:port"),
        ("http://93.184.216.34:5557", "Only a ZeroMQ address tcp://host:port"),
        ("tcp://93.184.216.34", "Only a ZeroMQ address tcp://host:port"),
        ("tcp://93.184.216.34:99999", "Only a ZeroMQ address tcp://host:port"),
    ],
)
def test_kv_events_endpoints_are_held_to_the_policy_when_saved(
    settings: Any, endpoint: str, says: str
) -> None:
    settings.INFERENCE_WORKER_ALLOWED_NETWORKS = []
    worker = _worker("http://93.184.216.34:8000")
    worker.kv_events_endpoint = endpoint
    worker.kv_events_replay_endpoint = endpoint

    with pytest.raises(ValidationError) as refused:
        worker.clean()

    errors = refused.value.message_dict
    assert sorted(errors) == ["kv_events_endpoint", "kv_events_replay_endpoint"]
    assert says in errors["kv_events_endpoint"][0]
    settings.INFERENCE_WORKER_ALLOWED_NETWORKS = ["0.0.0.0/0"]
    if says.startswith("Only"):
        with pytest.raises(ValidationError):
            worker.clean()
    else:
        worker.clean()


@pytest.mark.parametrize("host", ["127.0.0.1", "rebound.example"])
async def test_the_kv_events_subscriber_refuses_an_address_when_it_connects(
    settings: Any, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    _resolve(monkeypatch, "rebound.example", "127.0.0.1")
    settings.INFERENCE_WORKER_ALLOWED_NETWORKS = []
    index = prefix.RedisIndex(None)  # never reached: the connection is refused first
    applier = kv_events.KVEventsApplier(index, 1, capacity=10)
    subscriber = kv_events.KVEventsSubscriber(applier, endpoint=f"tcp://{host}:5557")

    with pytest.raises(AddressRefused, match="a loopback address"):
        await subscriber.run()

    settings.INFERENCE_WORKER_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    assert await kv_events_address(f"tcp://{host}:5557") == "tcp://127.0.0.1:5557"
