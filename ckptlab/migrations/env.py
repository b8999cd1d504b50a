"""Alembic environment: runs against the connection handed over by ``ckptlab.db.migrate``,
or against ``CKPTLAB_DATABASE_URL`` when run as ``alembic`` from the command line."""

from alembic import context

from ckptlab.db.models import Base

config = context.config
connection = config.attributes.get("connection")

if connection is None:  # plain `alembic upgrade head`
    from ckptlab.db.database import make_engine
    from ckptlab.settings import get_settings

    engine = make_engine(get_settings().resolved_database_url)
    with engine.begin() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
        context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
