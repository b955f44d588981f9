"""The WebUI's files at /ui/, the redirects to it, and the guard in front of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from treq.testing import StubTreq

from routerd.api.dispatch import Dispatch
from routerd.api.site import GuardResource
from routerd.api.webui import WebUI, webui_dir
from routerd.cluster.auth import AuthPolicy

KEY = "admin-key-0123456789"


def ui_root(tmp_path: Path) -> Path:
    (tmp_path / "js").mkdir()
    (tmp_path / "index.html").write_text("<!doctype html><title>routerd</title>")
    (tmp_path / "js" / "app.js").write_text("export const ok = 1;")
    return tmp_path


def client(root: Path | None, cidrs: tuple[str, ...] = ("127.0.0.0/8",)) -> StubTreq:
    policy = AuthPolicy.build((), (KEY,), "cluster-token", cidrs)
    return StubTreq(GuardResource(Dispatch([WebUI(root)]), policy, 1024))


def fetch(http: StubTreq, path: str, **kwargs: Any) -> tuple[int, Any, bytes]:
    out: list[Any] = []
    http.get("http://127.0.0.1" + path, allow_redirects=False, **kwargs).addCallback(
        lambda r: out.append(r) or r.content()).addCallback(out.append)
    http.flush()
    response, body = out
    return int(response.code), response.headers, body


def test_the_files_are_served_without_a_key_even_when_admin_keys_are_configured(tmp_path: Path) -> None:
    http = client(ui_root(tmp_path))
    code, headers, body = fetch(http, "/ui/")
    assert code == 200 and b"<title>routerd</title>" in body
    code, headers, body = fetch(http, "/ui/js/app.js")
    assert code == 200 and body == b"export const ok = 1;"
    assert b"javascript" in headers.getRawHeaders(b"content-type")[0]


def test_a_json_module_is_served_as_json_so_a_page_can_import_it(tmp_path: Path) -> None:
    """The Lending page imports its words table as a JSON module; a browser refuses one whose type
    is not JSON (it was application/octet-stream)."""
    root = ui_root(tmp_path)
    (root / "js" / "words.json").write_text('{"outcomes": {}}')
    code, headers, body = fetch(client(root), "/ui/js/words.json")
    assert code == 200 and body == b'{"outcomes": {}}'
    assert headers.getRawHeaders(b"content-type") == [b"application/json"]


def test_a_browser_asking_for_the_root_is_sent_to_the_ui_and_an_api_client_gets_404(tmp_path: Path) -> None:
    http = client(ui_root(tmp_path))
    code, headers, _ = fetch(http, "/", headers={"accept": "text/html,application/xhtml+xml"})
    assert code == 302 and headers.getRawHeaders(b"location") == [b"/ui/"]
    code, headers, _ = fetch(http, "/ui")
    assert code == 302 and headers.getRawHeaders(b"location") == [b"/ui/"]
    code, _, body = fetch(http, "/", headers={"accept": "application/json"})
    assert code == 404 and b"not_found" in body


def test_missing_files_and_escapes_answer_404(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("secret")
    (tmp_path / "ui").mkdir()
    http = client(ui_root(tmp_path / "ui"))
    assert fetch(http, "/ui/nope.js")[0] == 404
    for escape in ("/ui/../secret.txt", "/ui/%2e%2e/secret.txt", "/ui/..%2fsecret.txt",
                   "/ui/js/../../secret.txt"):
        code, _, body = fetch(http, escape)
        assert code == 404 and b"secret" != body, escape
    code, _, body = fetch(client(None), "/ui/")
    assert code == 404 and b"not installed" in body


def test_the_files_are_refused_outside_the_allowed_networks(tmp_path: Path) -> None:
    code, _, body = fetch(client(ui_root(tmp_path), cidrs=("10.0.0.0/8",)), "/ui/")
    assert code == 403 and b"not allowed" in body


def test_the_folder_is_found_in_a_checkout_or_where_pip_installed_it(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    ui_root((checkout / "webui").mkdir(parents=True) or checkout / "webui")
    assert webui_dir(package_root=checkout, prefix=str(tmp_path / "none")) == checkout / "webui"
    installed = tmp_path / "prefix" / "share" / "routerd" / "webui"
    installed.mkdir(parents=True)
    ui_root(installed)
    assert webui_dir(package_root=tmp_path / "elsewhere", prefix=str(tmp_path / "prefix")) == installed
    assert webui_dir(package_root=tmp_path / "elsewhere", prefix=str(tmp_path / "none")) is None
    # this checkout ships one
    assert webui_dir() is not None


def test_a_file_name_the_os_refuses_is_a_404_envelope_not_a_500(tmp_path: Path) -> None:
    """Found by the schemathesis run: a NUL byte or an over-long name made ``Path.resolve`` raise
    (ValueError / OSError ENAMETOOLONG), and a newline (``%0A``) made werkzeug's branch rule raise
    NotFound after the dispatcher had matched its prefix; each was answered 500."""
    http = client(ui_root(tmp_path))
    for path in ("/ui/a%00b", "/ui/" + "x" * 300, "/ui/js/" + "y" * 5000, "/ui/a%0Ab", "/ui/%0A"):
        code, headers, body = fetch(http, path)
        assert code == 404, (path, body)
        assert b'"type": "not_found"' in body


def test_a_doubled_slash_is_an_unknown_path_not_a_redirect_or_a_500(tmp_path: Path) -> None:
    """Issue 20: werkzeug's merge_slashes redirect was answered 500 with a traceback, no key needed."""
    http = client(ui_root(tmp_path))
    for path in ("/ui//x", "/ui//etc/passwd", "/ui//index.html"):
        status, _, body = fetch(http, path)
        assert status == 404 and b'"code": "not_found"' in body, path
