"""Shared test and benchmark support: database URLs, accounts, hook environments."""
