"""Benchmarks that print figures; the CLI's ``spotwright bench`` runs them."""
