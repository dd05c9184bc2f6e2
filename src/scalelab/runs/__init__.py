"""Typed published training runs: the schema (`schema`), the text rules (`rules`) and the importer."""
