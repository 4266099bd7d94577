"""Storage: one SQLite file per object, one writer per object, upstream's schema and SQL."""
