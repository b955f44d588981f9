"""The router database, one SQLite file: the ``Store`` facade every caller uses (each call a
``Deferred``, the SQL run off the reactor by a ``DBRunner``), the versioned migrations, and one
module of plain SQL per table family (samples, public IDs, links, settings, guardians, the decision
log, analytics rollups)."""

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
