"""Shared test and benchmark support: database URLs, accounts, hook environments, and the claims,
jobs and reports they make (factories)."""
