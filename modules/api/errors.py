"""OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`, and the status codes we use.

400 malformed request, undecodable or unfetchable image, caller mistakes (`ValueError`) during
generation; 401 missing or wrong API key; 404 unknown route; 413 body or image too large;
422 a parameter of the wrong type or out of range; 500 the model or pipeline failed; 503 no model, or
the remote engine is down, too slow, or broke off the reply. Each answer is one line in the server
log (`log_refusal`, or `generation.generation_error` with the cause).
"""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from modules.logging_colors import logger

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error the client sees with `status` and OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.logged = False  # True once the server log says it (generation_error logs the errors it makes)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        log_refusal(request, error)
        return error.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == 404:
            message = f"Unknown route {request.method} {request.url.path}. Routes: GET /v1/models, " \
                      f"POST /v1/chat/completions, POST /v1/completions"
            return await api_error(request, APIError(404, message, code="unknown_url"))
        response = await api_error(request, APIError(error.status_code, str(error.detail)))
        response.headers.update(error.headers or {})  # a 405's Allow
        return response

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception(f"API request {request.method} {request.url.path} failed")
        return APIError(500, f"Internal error: {type(error).__name__}: {error}").response()


def log_refusal(request: Request, error: APIError) -> None:
    """One line in the server log for each error a client is answered with, so an operator sees what
    clients were told: a request refused before any generation (a malformed message, a picture that
    cannot be fetched or decoded, a wrong key, too large a body) leaves no other trace."""
    if error.logged:
        return
    log = logger.error if error.status >= 500 else logger.warning
    log(f"API request {request.method} {request.url.path} answered {error.status}: {error.message}")
    error.logged = True
