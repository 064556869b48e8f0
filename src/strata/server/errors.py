"""The one error a request handler raises for what the client got wrong (or, with a 5xx status, what the server
could not do), carried to the client as OpenAI's error object."""

from __future__ import annotations

from typing import Any


class BadRequest(Exception):
    """A client error: HTTP `status`, the OpenAI error's message, param and code."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
