"""The console's pages and the offline API pages, over HTTP (the browser tests drive them)."""

import re

import pytest


def test_root_and_ui_redirect_to_the_console(api):
    client = api(models=False)
    for path in ("/", "/ui"):
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 307 and response.headers["location"] == "/ui/"
    page = client.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<title>MBN console</title>" in page.text


def test_console_assets_are_served_without_a_key_and_hold_no_secret(api):
    client = api(models=False, api_keys=["very-secret-key-0123456789"])
    page = client.get("/ui/")
    assert page.status_code == 200
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text)
    assert len(assets) >= 4
    for asset in assets:
        response = client.get(asset)
        assert response.status_code == 200, asset
        assert b"very-secret-key-0123456789" not in response.content
    assert client.get("/ui/config.json").json() == {"auth_required": True}
    # The API itself still wants the key.
    assert client.get("/models").status_code == 401


def test_config_says_when_no_key_is_needed(api):
    assert api(models=False).get("/ui/config.json").json() == {"auth_required": False}


@pytest.mark.parametrize(
    ("path", "assets"),
    [
        ("/docs", ["swagger-ui/swagger-ui-bundle.js", "swagger-ui/swagger-ui.css"]),
        ("/redoc", ["redoc/redoc.standalone.js"]),
    ],
)
def test_api_pages_use_packaged_assets(api, path, assets):
    client = api(models=False)
    page = client.get(path)
    assert page.status_code == 200
    assert "cdn." not in page.text and "googleapis" not in page.text
    for asset in assets:
        url = f"/static/vendor/{asset}"
        assert url in page.text
        assert client.get(url).status_code == 200


def test_static_paths_cannot_escape_the_package(api):
    client = api(models=False)
    for path in ("/static/../app.py", "/static/%2e%2e/app.py", "/static/console/../../app.py"):
        assert client.get(path).status_code == 404, path


def test_pages_stay_out_of_the_api_schema(api):
    paths = api(models=False).get("/openapi.json").json()["paths"]
    assert not {"/", "/ui", "/ui/", "/ui/config.json", "/docs", "/redoc"} & set(paths)


def test_console_assets_are_counted_under_their_mount(api):
    """They were counted as route="unmatched", beside scanners' 404s."""
    client = api(models=False)
    page = client.get("/ui/")
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text)
    for asset in assets:
        assert client.get(asset).status_code == 200
    assert client.get("/no-such-page").status_code == 404
    metrics = client.get("/metrics").text
    counted = re.findall(
        r'mbn_http_requests_total\{[^}]*route="([^"]*)"[^}]*status="(\d+)"', metrics
    )
    assert ("/static/{path}", "200") in counted, counted
    assert [status for route, status in counted if route == "unmatched"] == ["404"], counted
