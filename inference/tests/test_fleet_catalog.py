"""The scheduler's health loop reads the fleet from the process's catalog: no statement while
nothing changed; a worker or pool saved, a state changed by any replica, a drain by staff,
each read again at the next check."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inference import services
from inference.models import ModelPool, Worker
from inference.scheduler.capacity import fleet_rows

# The fleet read closes stale connections first, as a long-lived replica must.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker() -> Worker:
    pool = ModelPool.objects.create(name="fleet-pool", served_model="m")
    return Worker.objects.create(pool=pool, name="w1", url="http://127.0.0.1:9", state="down")


def states(worker: Worker) -> dict[str, str]:
    """The fleet's workers of `worker`'s pool, by name, with their state."""
    return {view.name: view.state for view in fleet_rows().workers if view.pool == worker.pool.name}


def statements_of_a_read() -> int:
    with CaptureQueriesContext(connection) as queries:
        fleet_rows()
    return len(queries.captured_queries)


def test_the_fleet_is_read_once_until_something_changes(worker: Worker) -> None:
    assert states(worker) == {"w1": "down"}
    assert statements_of_a_read() == 0

    services.worker_set_state(worker_id=worker.pk, state=Worker.State.HEALTHY)
    assert states(worker) == {"w1": "healthy"}
    assert statements_of_a_read() == 0
    # A state that does not change changes nothing.
    services.worker_set_state(worker_id=worker.pk, state=Worker.State.HEALTHY)
    assert statements_of_a_read() == 0

    services.workers_drain(workers=Worker.objects.filter(pk=worker.pk))
    assert states(worker) == {"w1": "draining"}
    Worker.objects.create(pool=worker.pool, name="w2", url="http://127.0.0.1:10")
    assert states(worker) == {"w1": "draining", "w2": "down"}
    worker.pool.is_active = False
    worker.pool.save(update_fields=["is_active"])  # as staff do in admin
    assert states(worker) == {}


def test_each_read_hands_out_views_of_its_own(worker: Worker) -> None:
    first = fleet_rows().workers[0]
    first.state = "mutated by a health check"
    assert fleet_rows().workers[0].state == "down"
