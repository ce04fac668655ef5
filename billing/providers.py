"""Payment providers, chosen by dotted path in `settings.BILLING_PAYMENT_PROVIDER`.

A provider receives each invoice once it is issued and either collects it itself (a card
processor) or leaves it open until staff record a payment received another way.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .models import Invoice


class PaymentProvider(abc.ABC):
    """What billing needs from a payment service."""

    #: Whether staff may mark this provider's invoices paid by hand.
    accepts_manual_payments: bool = False

    @abc.abstractmethod
    def invoice_issue(self, *, invoice: Invoice) -> str:
        """Hand `invoice` to the provider; return the provider's reference for it."""


class OfflineProvider(PaymentProvider):
    """No payment service: invoices wait until staff record the payment (bank transfer,
    cheque) with the admin's "Mark paid" action."""

    accepts_manual_payments = True

    def invoice_issue(self, *, invoice: Invoice) -> str:
        return f"offline-{invoice.pk}"
