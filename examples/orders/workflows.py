"""The order's fulfilment: reserve its stock, wait for the payment, ship it.

``geneva-drive worker --app examples.orders.workflows`` imports this module: the workflow class
and its hero's class (``ShopOrder``) are what the worker may run.
"""

from __future__ import annotations

from datetime import timedelta

from examples.orders.models import ShopOrder, Stock
from geneva_drive import Workflow, step

PAYMENT_TIMEOUT = timedelta(hours=1)


class OrderFulfillment(Workflow):
    @step
    def reserve_stock(self) -> None:
        order: ShopOrder = self.hero
        # Row-locked (on PostgreSQL and MariaDB; SQLite's worker transaction holds the write
        # lock): two orders for the last widget cannot both take it.
        stock = self.session.get(Stock, order.sku, with_for_update=True)
        if stock is None or stock.available < order.quantity:
            order.status = "out_of_stock"
            self.cancel()  # stops here, keeping the step's writes; the workflow ends canceled
            return
        stock.available -= order.quantity
        order.status = "awaiting_payment"

    # Parks until the payment webhook signals; an order not paid within the hour gives its
    # stock back and is canceled.
    @step(wait_for="payment_captured", timeout=PAYMENT_TIMEOUT, on_timeout="release_stock")
    def capture_payment(self) -> None:
        order: ShopOrder = self.hero
        payment = self.received_signal
        assert payment is not None  # a wait_for= step runs only with the signal that woke it
        order.paid_cents = payment.payload["amount_cents"]
        order.status = "paid"

    @step
    def ship(self) -> None:
        order: ShopOrder = self.hero
        order.status = "shipped"  # a real service books the parcel here
        self.finish()

    @step
    def release_stock(self) -> None:  # reached only when the payment timed out
        order: ShopOrder = self.hero
        stock = self.session.get_one(Stock, order.sku, with_for_update=True)
        stock.available += order.quantity
        order.status = "canceled"
        self.cancel()
