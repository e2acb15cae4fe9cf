"""The order service: ``POST /orders``, ``GET /orders/{id}``, the payment provider's webhook,
and the geneva-drive dashboard at ``/ops``.

    ORDERS_OPS_TOKEN=change-me uvicorn --factory examples.orders.app:create_app

The database is ``$GENEVA_DRIVE_DATABASE_URL`` (the worker's variable too), else ``orders.db``
here. The handlers are sync, each with one session per request: FastAPI runs them in its
thread pool. When geneva-drive's async API lands, switching is small — ``get_session`` yields
an ``AsyncSession``, the handlers become ``async def`` and ``await`` the session and the
workflow's ``create``/``signal``; the routes, models, workflow and dashboard stay as they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

import geneva_drive
from examples.orders import ops
from examples.orders.models import Base, ShopOrder, Stock, stock_shelves
from examples.orders.workflows import OrderFulfillment
from geneva_drive import WorkflowNotOngoing
from geneva_drive.admin import for_hero

DATABASE_URL_ENV = "GENEVA_DRIVE_DATABASE_URL"
DEFAULT_DATABASE_URL = "sqlite:///orders.db"
OPS_TOKEN_ENV = "ORDERS_OPS_TOKEN"


# The one place that knows the API is sync: with geneva-drive's async API this yields an
# AsyncSession, and the handlers below become `async def`, awaiting commit/create/signal.
def get_session(request: Request) -> Iterator[Session]:
    """One session per request; a handler that writes commits it, anything else rolls back."""
    sessions: sessionmaker[Session] = request.app.state.sessions
    with sessions() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


class NewOrder(BaseModel):
    sku: str = Field(min_length=1, max_length=50)
    quantity: int = Field(gt=0)


class PaymentData(BaseModel):
    order_id: int
    amount_cents: int = Field(ge=0)


class PaymentEvent(BaseModel):
    """The provider's event, as it posts it (and posts it again when it did not see our 200)."""

    id: str = Field(min_length=1, max_length=255)  # the provider's event id
    type: Literal["payment.captured"]
    data: PaymentData


router = APIRouter()


@router.post("/orders", status_code=201)
def create_order(new: NewOrder, session: SessionDep) -> dict[str, Any]:
    if session.get(Stock, new.sku) is None:
        raise HTTPException(422, f"no product with sku {new.sku!r}; order one of the stock's")
    order = ShopOrder(sku=new.sku, quantity=new.quantity)
    session.add(order)
    session.flush()  # the order's id, which the workflow refers to
    workflow = OrderFulfillment.create(session, hero=order)
    # One commit for both: an order never exists without its workflow, nor a workflow without
    # its order. The worker can claim the first step only from here on.
    session.commit()
    return _view(order, workflow)


@router.get("/orders/{order_id}")
def show_order(order_id: int, session: SessionDep) -> dict[str, Any]:
    order = _order(session, order_id)
    return _view(order, _fulfillment(session, order))


@router.post("/webhooks/payments")
def payment_webhook(event: PaymentEvent, session: SessionDep) -> dict[str, Any]:
    order = _order(session, event.data.order_id)
    workflow = _fulfillment(session, order)
    try:
        # The event id is the idempotency key: a redelivery returns the first delivery's signal,
        # flagged duplicate, and wakes nothing — also after the order has shipped.
        signal = workflow.signal(
            "payment_captured",
            payload={"amount_cents": event.data.amount_cents},
            idempotency_key=event.id,
        )
    except WorkflowNotOngoing:
        raise HTTPException(
            409,
            f"order {order.id} is {order.status} and takes no payment; refund event {event.id}",
        ) from None
    session.commit()  # the woken step runs once this commits
    return {"order_id": order.id, "duplicate": signal.duplicate_delivery}


def _order(session: Session, order_id: int) -> ShopOrder:
    order = session.get(ShopOrder, order_id)
    if order is None:
        raise HTTPException(404, f"no order {order_id}")
    return order


def _fulfillment(session: Session, order: ShopOrder) -> OrderFulfillment:
    """The order's workflow, ongoing or ended (one per order: ``create`` refuses a second)."""
    (workflow,) = [wf for wf in for_hero(session, order) if isinstance(wf, OrderFulfillment)]
    return workflow


def _view(order: ShopOrder, workflow: OrderFulfillment) -> dict[str, Any]:
    return {
        "id": order.id,
        "sku": order.sku,
        "quantity": order.quantity,
        "status": order.status,
        "paid_cents": order.paid_cents,
        "workflow_id": workflow.id,
        "workflow_state": workflow.state,
    }


def build_app(engine: Engine, *, ops_token: str) -> FastAPI:
    """The app on ``engine``, where geneva-drive is already configured (``create_app`` does it;
    tests use the pytest plugin's engine and configuration)."""
    app = FastAPI(title="Orders")
    # On SQLite the handlers' transactions begin with the write lock: they read (the order, its
    # workflow) before they write, and a deferred transaction overtaken by another commit in
    # between would fail with "database is locked". Elsewhere this is the engine itself.
    app.state.sessions = sessionmaker(geneva_drive.immediate_transactions(engine))
    app.include_router(router)
    app.mount("/ops", ops.dashboard(engine, token=ops_token))
    return app


def create_app() -> FastAPI:
    """The app as ``uvicorn --factory`` starts it, set up from the environment."""
    token = os.environ.get(OPS_TOKEN_ENV, "")
    if not token:
        raise SystemExit(
            f"{OPS_TOKEN_ENV} is not set: the /ops dashboard needs a token; start with "
            f"{OPS_TOKEN_ENV}=<a secret> uvicorn --factory examples.orders.app:create_app"
        )
    engine = geneva_drive.create_engine(os.environ.get(DATABASE_URL_ENV, DEFAULT_DATABASE_URL))
    # A real service runs its migrations and `geneva-drive migrate` before it starts; the
    # example creates what is missing so that one command is enough.
    geneva_drive.install(engine)
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        stock_shelves(session)
    geneva_drive.configure(engine=engine)
    return build_app(engine, ops_token=token)
