"""The docs' API reference documents every public name, from its docstring."""

from __future__ import annotations

import re
from html import unescape

import pytest

import idemstore
from tests.conftest import ROOT

REFERENCE = ROOT / "docs" / "reference"
# mkdocstrings renders a name where a line reads "::: dotted.path" (options may follow).
DIRECTIVE = re.compile(r"^:::\s+(\S+)\s*$", re.MULTILINE)


def documented_names() -> list[str]:
    """Every top-level ``idemstore.<name>`` the reference pages render, in page order."""
    names = []
    for page in sorted(REFERENCE.rglob("*.md")):
        for target in DIRECTIVE.findall(page.read_text()):
            module, _, name = target.rpartition(".")
            if module == "idemstore":
                names.append(name)
    return names


def test_every_name_in_all_has_an_entry_in_the_api_reference() -> None:
    missing = sorted(set(idemstore.__all__) - set(documented_names()))
    assert not missing, f"add '::: idemstore.NAME' to a page under docs/reference/ for {missing}"


def test_the_api_reference_documents_only_public_names_each_once() -> None:
    names = documented_names()
    stale = sorted(set(names) - set(idemstore.__all__))
    assert not stale, f"documented but not in idemstore.__all__: {stale}"
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"documented twice: {twice}"


def test_every_public_name_has_its_own_docstring() -> None:
    # The reference is generated from docstrings: a name without one renders as a bare
    # signature. A dataclass without a docstring gets "Name(field: type, ...)" from the
    # dataclass machinery, which is no documentation either.
    undocumented = []
    for name in idemstore.__all__:
        if name == "__version__":
            continue
        obj = getattr(idemstore, name)
        # a class's own docstring, not one inherited from a base class
        doc = (vars(obj).get("__doc__") if isinstance(obj, type) else obj.__doc__) or ""
        if not doc.strip() or doc.startswith(f"{name}("):
            undocumented.append(name)
    assert not undocumented, f"public names without a docstring: {undocumented}"


def test_the_reference_pages_are_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in REFERENCE.rglob("*.md"):
        assert page.relative_to(ROOT / "docs").as_posix() in nav, page


def test_the_api_reference_is_one_page_and_renders_each_target_once() -> None:
    targets = [
        target
        for page in sorted((ROOT / "docs").rglob("*.md"))
        for target in DIRECTIVE.findall(page.read_text())
    ]
    twice = sorted({t for t in targets if targets.count(t) > 1})
    assert not twice, f"rendered on more than one page, or twice: {twice}"
    pages = {
        page.relative_to(ROOT / "docs").as_posix()
        for page in (ROOT / "docs").rglob("*.md")
        if DIRECTIVE.search(page.read_text())
    }
    assert pages == {"reference/index.md"}, pages


def test_the_reference_starts_with_what_users_reach_for_first() -> None:
    text = (REFERENCE / "index.md").read_text()
    order = DIRECTIVE.findall(text)
    assert order[0] == "idemstore.Idempotency"
    assert order.index("idemstore.ExecutionPolicy") < order.index("idemstore.open_store")
    assert order.index("idemstore.http.asgi.IdempotencyMiddleware") < order.index(
        "idemstore.Engine"
    )


def _rendered_signature(name: str) -> str:
    """The text of ``name``'s rendered signature on the built reference page."""
    from tests.docs.rendered_site import checkout_site

    html = (checkout_site() / "reference" / "index.html").read_text()
    start = html.index(f'id="{name}"')
    signature = html.index('class="doc-signature', start)
    end = html.index("</code>", signature)
    return unescape(re.sub(r"<[^>]+>", "", html[signature:end]))


# The doors that take their options as **options: Unpack[SomeOptions]: the rendered signature
# lists each option with its type and default (docs/griffe_typed_options.py expands them).
@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("idemstore.Idempotency", ["lease_ttl: float = 30", "retention: float = 86400"]),
        (
            "idemstore.ExecutionPolicy",
            ["lease_ttl: float = 30", 'in_flight: Literal["wait", "reject"] = "wait"'],
        ),
        ("idemstore.sync.Idempotency", ["lease_ttl: float = 30", "max_response_bytes: int"]),
        ("idemstore.http.asgi.IdempotencyMiddleware", ["lease_ttl: float = 30"]),
        (
            "idemstore.http.wsgi.IdempotencyMiddleware",
            ["lease_ttl: float = 30", "max_key_length: int"],
        ),
        ("idemstore.mcp.server.ServerIdempotency", ["lease_ttl: float = 30", "scope: str"]),
    ],
)
def test_the_rendered_reference_shows_each_option_with_its_type_and_default(
    name: str, options: list[str]
) -> None:
    signature = _rendered_signature(name)
    assert "**" not in signature, f"{name} still renders a **options parameter:\n{signature}"
    for option in options:
        # 30 or 30.0, not 300
        number = r"(\.0)?\b" if option[-1].isdigit() else ""
        assert re.search(re.escape(option) + number, signature), (option, signature)
        assert signature.count(option.split(":")[0] + ":") == 1, signature
