"""Accounts: sign-up, log-in and per-user API keys."""
