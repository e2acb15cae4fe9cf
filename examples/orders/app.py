"""The order service: ``POST /orders``, ``GET /orders/{id}``, the payment provider's webhook,
and the geneva-drive dashboard at ``/ops``.

    ORDERS_OPS_TOKEN=change-me uvicorn --factory examples.orders.app:create_app

The database is ``$GENEVA_DRIVE_DATABASE_URL`` (the worker's variable too), else ``orders.db``
here. The handlers are ``async def``, each with one ``AsyncSession`` per request (a
dependency), and call geneva-drive's async verbs (``acreate``, ``asignal``, ``afor_hero``) in
that session's transaction. The session's engine is the same database's URL with its async
driver (the ``async`` extra). The workflow's steps stay sync: the worker runs them, on its own
sync engine.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy import URL, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session

import geneva_drive
from examples.orders import ops
from examples.orders.models import Base, ShopOrder, Stock, stock_shelves
from examples.orders.workflows import OrderFulfillment
from geneva_drive import WorkflowNotOngoing
from geneva_drive.admin import afor_hero

DATABASE_URL_ENV = "GENEVA_DRIVE_DATABASE_URL"
DEFAULT_DATABASE_URL = "sqlite:///orders.db"
OPS_TOKEN_ENV = "ORDERS_OPS_TOKEN"

# Each database's async driver, as the `async` extra installs them (psycopg's async mode comes
# with the `postgres` extra): the handlers reach the worker's database through these.
ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+psycopg",
    "mariadb": "mariadb+aiomysql",
    "mysql": "mysql+aiomysql",
}


def async_url(url: URL) -> URL:
    """``url``'s database (same file, host, user, password, query) through its async driver."""
    backend = url.get_backend_name()
    if backend not in ASYNC_DRIVERS:
        raise ValueError(
            f"{DATABASE_URL_ENV}={url.render_as_string()}: the order service has no async "
            f"driver for {backend!r}; use a database of {sorted(ASYNC_DRIVERS)}"
        )
    return url.set(drivername=ASYNC_DRIVERS[backend])


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    """One session per request; a handler that writes commits it, anything else rolls back."""
    sessions: async_sessionmaker[AsyncSession] = request.app.state.sessions
    async with sessions() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session)]


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
async def create_order(new: NewOrder, session: SessionDep) -> dict[str, Any]:
    if await session.get(Stock, new.sku) is None:
        raise HTTPException(422, f"no product with sku {new.sku!r}; order one of the stock's")
    order = ShopOrder(sku=new.sku, quantity=new.quantity)
    session.add(order)
    workflow = await OrderFulfillment.acreate(session, hero=order)  # flushes the new order
    # One commit for both: an order never exists without its workflow, nor a workflow without
    # its order. The worker can claim the first step only from here on.
    await session.commit()
    return _view(order, workflow)


@router.get("/orders/{order_id}")
async def show_order(order_id: int, session: SessionDep) -> dict[str, Any]:
    order = await _order(session, order_id)
    return _view(order, await _fulfillment(session, order))


@router.post("/webhooks/payments")
async def payment_webhook(event: PaymentEvent, session: SessionDep) -> dict[str, Any]:
    order = await _order(session, event.data.order_id)
    workflow = await _fulfillment(session, order)
    try:
        # The event id is the idempotency key: a redelivery returns the first delivery's signal,
        # flagged duplicate, and wakes nothing — also after the order has shipped.
        signal = await workflow.asignal(
            "payment_captured",
            payload={"amount_cents": event.data.amount_cents},
            idempotency_key=event.id,
        )
    except WorkflowNotOngoing:
        raise HTTPException(
            409,
            f"order {order.id} is {order.status} and takes no payment; refund event {event.id}",
        ) from None
    await session.commit()  # the woken step runs once this commits
    return {"order_id": order.id, "duplicate": signal.duplicate_delivery}


async def _order(session: AsyncSession, order_id: int) -> ShopOrder:
    order = await session.get(ShopOrder, order_id)
    if order is None:
        raise HTTPException(404, f"no order {order_id}")
    return order


async def _fulfillment(session: AsyncSession, order: ShopOrder) -> OrderFulfillment:
    """The order's workflow, ongoing or ended (one per order: ``acreate`` refuses a second)."""
    workflows = await afor_hero(session, order)
    (workflow,) = [wf for wf in workflows if isinstance(wf, OrderFulfillment)]
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
    """The app on ``engine``'s database, where geneva-drive is already configured
    (``create_app`` does it; tests use the pytest plugin's engine and configuration).

    ``engine`` (sync) serves the dashboard; the handlers get an async engine on the same
    database, opened when the server starts and disposed when it stops — on the server's event
    loop, to which an async driver's connections belong.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async_engine = geneva_drive.create_async_engine(async_url(engine.url))
        # expire_on_commit=False: a handler reads the order after its commit, and reloading it
        # would be a lazy load, which async code can only do through an await.
        app.state.sessions = async_sessionmaker(
            _immediate_transactions(async_engine), expire_on_commit=False
        )
        try:
            yield
        finally:
            await async_engine.dispose()

    app = FastAPI(title="Orders", lifespan=lifespan)
    app.include_router(router)
    app.mount("/ops", ops.dashboard(engine, token=ops_token))
    return app


def _immediate_transactions(engine: AsyncEngine) -> AsyncEngine:
    """On SQLite the handlers' transactions begin with the write lock: they read (the order, its
    workflow) before they write, and a deferred transaction overtaken by another commit in
    between would fail with "database is locked". Elsewhere this is the engine itself.
    ``immediate_transactions`` takes a sync engine: here, the async engine's own."""
    return AsyncEngine(geneva_drive.immediate_transactions(engine.sync_engine))


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
