"""routerd.store: the router database (one SQLite file, versioned migrations, off-reactor SQL)."""

from routerd.lanes import Lane
from routerd.store.links import LinkRow, SameNodeLinkError
from routerd.store.migrations import MIGRATIONS, Migration, MigrationError, SchemaTooNewError, migrate
from routerd.store.runner import DBRunner, StoreClosedError, SyncRunner, ThreadRunner
from routerd.store.samples import LoadSample, RequestSample
from routerd.store.store import DB_FILENAME, Store, db_path

__all__ = [
    "DB_FILENAME",
    "MIGRATIONS",
    "DBRunner",
    "Lane",
    "LinkRow",
    "LoadSample",
    "Migration",
    "MigrationError",
    "RequestSample",
    "SameNodeLinkError",
    "SchemaTooNewError",
    "Store",
    "StoreClosedError",
    "SyncRunner",
    "ThreadRunner",
    "db_path",
    "migrate",
]
