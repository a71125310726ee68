"""The gateway's HTTP app on port P: E2B's control plane (``X-API-KEY`` = forkpoint's
token) and the envd emulation (each sandbox's ``X-Access-Token``) side by side, and the
requests for other sandbox ports passed through to the guest (``port_router``)."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from forkpoint.errors import ForkpointError
from forkpoint.requests import describe_invalid

from .control import api_error, control_router
from .envd import envd_router
from .port_router import SandboxPortRouter
from .sandboxes import Sandboxes
from .template_routes import template_router, upload_router
from .volumes import volume_content_router, volume_router

__all__ = ["create_e2b_app"]


def create_e2b_app(sandboxes: Sandboxes, api_key: Callable[[], str]) -> FastAPI:
    """``api_key`` returns the key every control-plane call must send (read anew each
    time: ``forkpoint serve --port`` may have rotated the token file)."""

    async def require_key(request: Request) -> None:
        sent = request.headers.get("x-api-key", "")
        if not sent or not hmac.compare_digest(sent.encode(), api_key().encode()):
            raise _Unauthorized

    app = FastAPI(title="forkpoint E2B gateway", docs_url=None, redoc_url=None, openapi_url=None)
    # Templates first: their fixed paths (/templates/tags) before the control plane's
    # /templates/{id}.
    app.include_router(
        template_router(
            sandboxes.templates,
            api_key,
            sandboxes.config.envd_version,
            allowed=sandboxes.config.template_builds,
        ),  # fmt: skip
        dependencies=[Depends(require_key)],
    )
    app.include_router(control_router(sandboxes), dependencies=[Depends(require_key)])
    app.include_router(volume_router(sandboxes.runtime), dependencies=[Depends(require_key)])
    app.include_router(volume_content_router(sandboxes.runtime))
    app.include_router(upload_router(sandboxes.templates, api_key))
    app.include_router(envd_router(sandboxes))
    app.add_middleware(SandboxPortRouter, sandboxes=sandboxes)

    @app.exception_handler(_Unauthorized)
    async def unauthorized(_request: Request, _error: Exception) -> JSONResponse:
        body = {"code": 401, "message": "invalid or missing X-API-KEY (forkpoint's API token)"}
        return JSONResponse(body, status_code=401)

    @app.exception_handler(ForkpointError)
    async def forkpoint_error(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, ForkpointError)
        return api_error(error)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        message = describe_invalid(error.errors())
        return JSONResponse({"code": 400, "message": message}, status_code=400)

    return app


class _Unauthorized(Exception):
    pass
