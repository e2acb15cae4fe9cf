"""A FastAPI order service whose orders are fulfilled by a geneva-drive workflow.

From the repository root (see examples/README.md):

    ORDERS_OPS_TOKEN=change-me uvicorn --factory examples.orders.app:create_app
    geneva-drive worker --database-url sqlite:///orders.db --app examples.orders.workflows
"""
