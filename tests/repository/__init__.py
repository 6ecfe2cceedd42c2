"""Checks of the repository: layout, declared imports, versions, reader metrics."""
