"""Alembic migrations of the store's schema, run by the store itself when it opens a database."""
