"""normalise_url / is_under: one spelling per node URL (reference §1.6, §3.4 item 5, scenario 13)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routerd import urls
from routerd.urls import AllowList, URLError, is_under, normalise_url, split_target


@pytest.mark.parametrize("given_url, expected", [
    ("HTTP://SLAVE:80/", "http://slave"),
    ("http://slave", "http://slave"),
    ("  http://slave/  ", "http://slave"),
    ("https://Node.Example:443/", "https://node.example"),
    ("https://node:8443", "https://node:8443"),
    ("http://node:443", "http://node:443"),
    ("http://node:8080/Router/", "http://node:8080/Router"),
    ("http://node/a//", "http://node/a"),
    ("http://node/x?token=1#frag", "http://node/x"),
    ("http://10.0.0.5:8080/", "http://10.0.0.5:8080"),
    ("http://[::1]:8080/", "http://[::1]:8080"),
    ("http://[0:0:0:0:0:0:0:1]/", "http://[::1]"),
    ("http://node:/", "http://node"),
])
def test_normalised_form(given_url: str, expected: str) -> None:
    assert normalise_url(given_url) == expected


def test_scheme_host_and_default_port_spellings_are_one_url() -> None:
    assert normalise_url("HTTP://SLAVE:80/") == normalise_url("http://slave")


@pytest.mark.parametrize("bad, words", [
    ("", "empty"),
    ("   ", "empty"),
    ("ftp://node", "http or https"),
    ("node:8080", "http or https"),
    ("//node", "http or https"),
    ("http://", "no host"),
    ("http:///path", "no host"),
    ("http://user:pw@node", "user information"),
    ("http://user@node", "user information"),
    ("http://node:99999", "invalid port"),
    ("http://node:abc", "invalid port"),
    ("http://no de", "whitespace"),
    ("http://node\\x", "backslash"),
    ("http://bad..host", "invalid host"),
    ("http://-bad", "invalid host"),
    ("http://[::1", "IPv6"),
    ("http://[zz::1]/", "IPv6"),
])
def test_invalid_urls_raise_with_a_reason(bad: str, words: str) -> None:
    with pytest.raises(URLError) as caught:
        normalise_url(bad)
    assert words in caught.value.reason


def test_non_string_is_refused() -> None:
    with pytest.raises(URLError):
        normalise_url(None)  # type: ignore[arg-type]


def test_split_target_keeps_path_and_query() -> None:
    parts = split_target("HTTPS://Node:443/a/b/?x=1#f")
    assert (parts.origin, parts.path, parts.query, parts.base) == (
        "https://node", "/a/b/", "x=1", "https://node/a/b")


@pytest.mark.parametrize("base, target, under", [
    ("http://node", "http://node/router/v1/node/models", True),
    ("http://node", "HTTP://NODE:80/x?y=1", True),
    ("http://node/base", "http://node/base", True),
    ("http://node/base", "http://node/base/x", True),
    ("http://node/base", "http://node/basement", False),
    ("http://node/base", "http://node/", False),
    ("http://node", "https://node/x", False),
    ("http://node", "http://node:8080/x", False),
    ("http://node", "http://other/x", False),
    ("http://node/base", "http://node/base/../admin", False),
    ("http://node/base", "http://node/base/%2E%2E/admin", False),
    ("http://node", "http://user@node/x", False),
    ("not a url", "http://node/x", False),
])
def test_is_under(base: str, target: str, under: bool) -> None:
    assert is_under(base, target) is under


@given(host=st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True),
       port=st.one_of(st.none(), st.integers(1, 65535)),
       path=st.from_regex(r"(/[a-z0-9]{1,8}){0,3}/?", fullmatch=True),
       upper=st.booleans())
def test_normalising_is_idempotent_and_case_blind(host: str, port: int | None, path: str,
                                                  upper: bool) -> None:
    netloc = host.upper() if upper else host
    url = f"{'HTTP' if upper else 'http'}://{netloc}{'' if port is None else f':{port}'}{path}"
    once = normalise_url(url)
    assert normalise_url(once) == once
    assert once == normalise_url(url.lower())
    assert not once.endswith("/")
    assert is_under(once, url)


# -- the allow-list at scale (issue 24: a master allows every slave and checks every call) ------------


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every URL ``urls.split_target`` parses from now on, in order."""
    calls: list[str] = []
    real = urls.split_target

    def counting(url: str) -> urls.TargetParts:
        calls.append(url)
        return real(url)

    monkeypatch.setattr(urls, "split_target", counting)
    return calls


def test_permits_parses_the_target_once_however_many_bases_are_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It used to parse every base and the target again per base: 400 parses a call with 200
    slaves allowed, 80,000 a health-poll cycle."""
    allowed = AllowList(f"http://127.0.0.1:{9000 + n}" for n in range(200))
    calls = _count_parses(monkeypatch)
    assert allowed.permits("http://127.0.0.1:9150/router/v1/node/models")
    assert not allowed.permits("http://127.0.0.1:9250/router/v1/node/models")
    assert len(calls) == 2


def test_permits_remembers_a_target_and_forgets_when_the_bases_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A master forwards to the same URLs over and over (issue 24): the same target is parsed once
    while the bases stand, and a change of the bases (a slave added or removed) is seen at once."""
    allowed = AllowList(["http://127.0.0.1:9001"])
    calls = _count_parses(monkeypatch)
    target = "http://127.0.0.1:9002/router/v1/node/inference/v1/chat/completions"
    assert not allowed.permits(target)
    assert not allowed.permits(target)
    assert len(calls) == 1
    allowed.add("http://127.0.0.1:9002")
    assert allowed.permits(target) and allowed.permits(target)
    allowed.remove("http://127.0.0.1:9002")
    assert not allowed.permits(target)
    assert len(calls) == 1 + 2 + 2  # add and remove parse their URL; the target once after each


def test_permits_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(urls, "PERMITS_MEMO", 4)
    allowed = AllowList(["http://node"])
    for n in range(10):
        assert allowed.permits(f"http://node/p?n={n}")
        assert len(allowed._permits) <= 4


_BASES = st.sampled_from(["http://node", "http://node/base", "HTTP://NODE:80/base/", "http://node:8080",
                          "https://node/a/b", "http://other/x", "http://[::1]:81/p", "not a url"])
_TARGETS = st.builds(
    lambda origin, path, query: origin + path + query,
    st.sampled_from(["http://node", "HTTP://Node:80", "https://node", "http://node:8080", "http://other",
                     "http://[::1]:81", "http://user@node", "ftp://node"]),
    st.sampled_from(["", "/", "/base", "/base/", "/basement", "/base/x", "/base/../admin", "/a/b/c",
                     "/x", "/p/q", "/base/%2e%2e/x", "/ba se"]),
    st.sampled_from(["", "?y=1"]),
)


@given(added=st.lists(_BASES, max_size=5), removed=st.lists(_BASES, max_size=2), target=_TARGETS)
def test_permits_answers_as_is_under_against_every_allowed_base(added: list[str], removed: list[str],
                                                               target: str) -> None:
    """Asked after every change too (its remembered answers never outlive a change of the bases)."""
    allowed = AllowList()
    for base in added:
        try:
            allowed.add(base)
        except URLError:
            pass
        assert allowed.permits(target) is any(is_under(b, target) for b in allowed.bases())
    for base in removed:
        allowed.remove(base)
        assert allowed.permits(target) is any(is_under(b, target) for b in allowed.bases())
    assert allowed.permits(target) is any(is_under(base, target) for base in allowed.bases())


@given(st.text(max_size=12))
def test_the_refused_characters_are_whitespace_controls_and_backslashes(text: str) -> None:
    """One regex scan refuses exactly what the per-character test refused."""
    refused = any(ch.isspace() or ord(ch) < 0x20 or ch == "\\" for ch in text)
    assert (urls._BAD_CHARS.search(text) is not None) is refused
