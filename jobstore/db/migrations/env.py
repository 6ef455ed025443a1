"""Alembic environment: the URL comes from the caller (jobstore.db.engine.upgrade), never
from a file."""

from alembic import context

from jobstore.db.engine import make_engine
from jobstore.db.schema import metadata

config = context.config
url = config.attributes["database_url"]
engine = make_engine(url, create=True)
with engine.connect() as connection:
    if connection.dialect.name == "sqlite":
        # a batch migration makes a table again: the rows of others that refer to it must not
        # stop it (SQLite takes this only outside a transaction, so before the first statement)
        dbapi = connection.connection.dbapi_connection
        assert dbapi is not None
        dbapi.cursor().execute("PRAGMA foreign_keys = OFF")
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
