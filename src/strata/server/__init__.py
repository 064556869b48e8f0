"""`strata serve`: an OpenAI-compatible HTTP server over strata's generation sessions (docs/server.md)."""

from strata.server.app import Server

__all__ = ["Server"]
