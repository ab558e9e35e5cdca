"""The web console (/ui) and the API pages (/docs, /redoc), served from the package.

Every asset ships in ``service/static`` (the console's own files and the vendored Plotly,
Swagger UI and ReDoc bundles, see docs/THIRD_PARTY.md), so the pages work on a machine with no
internet. The pages and assets hold no secrets and need no key: the console asks for one and
sends it with each API call, which the API checks as for any other client.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
STATIC_URL = "/static"
CONSOLE_URL = "/ui/"

router = APIRouter(include_in_schema=False)


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse(CONSOLE_URL)


@router.get("/ui")
def console_redirect() -> RedirectResponse:
    return RedirectResponse(CONSOLE_URL)


@router.get(CONSOLE_URL)
def console() -> FileResponse:
    # One page; the hash part of the URL picks the view (#/models, #/jobs, #/map/<id>).
    return FileResponse(STATIC_DIR / "console" / "index.html", media_type="text/html")


@router.get("/ui/config.json")
def console_config(request: Request) -> dict[str, bool]:
    """What the console needs before it may call the API: whether to ask for a key.

    (Not a secret: without a key the API answers 401 anyway.)
    """
    return {"auth_required": request.app.state.api_keys.enabled}


def install_console(app: FastAPI) -> None:
    """Mount the static files and add the console and API pages to ``app``.

    ``app`` must be built with ``docs_url=None, redoc_url=None``: these replace FastAPI's
    pages, whose assets come from a CDN.
    """
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="static")
    app.include_router(router)
    title = app.title
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - API",
            swagger_js_url=f"{STATIC_URL}/vendor/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{STATIC_URL}/vendor/swagger-ui/swagger-ui.css",
            swagger_favicon_url=f"{STATIC_URL}/console/favicon.svg",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title} - API reference",
            redoc_js_url=f"{STATIC_URL}/vendor/redoc/redoc.standalone.js",
            redoc_favicon_url=f"{STATIC_URL}/console/favicon.svg",
            with_google_fonts=False,
        )
