"""The docs site as a reader gets it: built by mkdocs, served on loopback, loaded in Chromium.

``build_site`` runs ``mkdocs build --strict`` on a project directory (the checkout, or a copy
of it with a page changed); ``check_site`` loads every page of a built site in Debian's
headless Chromium (through chromedriver) and returns what a reader would see wrong:

- a console error (a script that failed, a resource that did not load: Chromium is kept to
  loopback, so a page that needs the network fails here too);
- an include or directive that was not rendered: ``--8<--`` (pymdownx snippets), a line
  starting with ``::: `` (mkdocstrings), or the ``--8 < --`` a Python formatter makes of an
  include;
- an example file the page's Markdown includes that is not shown whole in one code block;
- an internal link to a page, file or anchor the site does not have.

The Markdown-level tests next to this file check the blocks as written; this checks them as
rendered.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urldefrag, urlsplit

from tests.docs.markdown_blocks import ROOT

if TYPE_CHECKING:
    from collections.abc import Iterator

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Headless Chromium without a sandbox (containers), a GPU or any background traffic; every
# host name but loopback fails to resolve, so nothing is fetched from the network.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
]
# What an unrendered include or directive leaves in a page's text.
RAW_MARKERS = re.compile(r"--8\s*<\s*--|^[ \t]*::: \S", re.MULTILINE)
# A pymdownx snippets include in the Markdown: --8<-- "path" (also the block form's lines).
INCLUDE = re.compile(r"""^[ \t]*--8<--[ \t]+["']?(?P<path>[^"'\s]+)["']?[ \t]*$""", re.MULTILINE)

# What the page script collects once the page has loaded.
_PAGE_FACTS = """
return {
  text: document.body.innerText,
  code: [...document.querySelectorAll('pre code, pre')].map(e => e.textContent),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id)
        .concat([...document.querySelectorAll('a[name]')].map(e => e.name)),
  links: [...document.querySelectorAll('a[href]')].map(e => e.href),
};
"""


def build_site(project: Path, out: Path) -> Path:
    """``mkdocs build --strict`` of ``project`` (a directory with mkdocs.yml) into ``out``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(project)}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}")
    return out


@functools.cache
def checkout_site() -> Path:
    """The checkout's site, built once per test process (removed when the process exits)."""
    out = Path(tempfile.mkdtemp(prefix="idemstore-site-"))
    atexit.register(shutil.rmtree, out, True)
    return build_site(ROOT, out / "site")


def project_copy(into: Path) -> Path:
    """A copy of the checkout's docs project in ``into`` (docs/ copied, so a test may change a
    page; the package, the examples and the rest linked)."""
    project = into / "project"
    project.mkdir()
    for name in ("mkdocs.yml", "idemstore", "examples", "README.md", "pyproject.toml"):
        (project / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "docs", project / "docs")
    return project


def source_page(docs: Path, path: str) -> Path | None:
    """The Markdown page under ``docs`` that the site's ``path`` (``"http/"``) was made from."""
    rel = path.rstrip("/")
    for candidate in (f"{rel}.md", f"{rel}/index.md") if rel else ("index.md",):
        if (docs / candidate).exists():
            return docs / candidate
    return None


@dataclass
class PageFacts:
    text: str
    code: list[str]
    ids: set[str]
    links: list[str]
    console_errors: list[str] = field(default_factory=list)


@contextlib.contextmanager
def served(site: Path) -> Iterator[str]:
    """``site`` over HTTP on a loopback port; yields the base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(site), **kwargs)  # type: ignore[arg-type]

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A headless Chromium session driven through Debian's chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="idemstore-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        driver.set_page_load_timeout(30)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def load(driver: object, url: str) -> PageFacts:
    driver.get(url)  # type: ignore[attr-defined]
    facts = driver.execute_script(_PAGE_FACTS)  # type: ignore[attr-defined]
    errors = [
        entry["message"]
        for entry in driver.get_log("browser")  # type: ignore[attr-defined]
        if entry["level"] == "SEVERE"
    ]
    return PageFacts(facts["text"], facts["code"], set(facts["ids"]), facts["links"], errors)


def built_pages(site: Path) -> list[Path]:
    """Every page of the site but the 404 page (it is served only for a missing page)."""
    return sorted(p for p in site.rglob("index.html"))


def _target_file(site: Path, path: str) -> Path | None:
    local = site / unquote(path).lstrip("/")
    if local.is_dir():
        local = local / "index.html"
    return local if local.is_file() else None


def included_examples(markdown: str) -> list[str]:
    """The files (relative to the project root) a page's Markdown includes."""
    return INCLUDE.findall(markdown)


def _normalized(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def check_site(site: Path, docs: Path = ROOT / "docs", only: list[str] | None = None) -> list[str]:
    """What is wrong with the built ``site`` (made from ``docs``) in a browser, one line each
    (empty: nothing).

    ``only``: the pages to load (paths like ``"http/"``); every page by default. Links are
    checked against the files of the site, anchors against the ids of the pages as loaded
    (of a page not loaded: as written in its HTML). Included files are read relative to the
    directory above ``docs``, as mkdocs.yml's snippets ``base_path`` says.
    """
    problems: list[str] = []
    pages = built_pages(site)
    if only is not None:
        pages = [site / p / "index.html" for p in only]
    facts: dict[str, PageFacts] = {}
    with served(site) as base, chromium() as driver:
        for page in pages:
            rel = page.parent.relative_to(site).as_posix()
            path = "" if rel == "." else f"{rel}/"
            facts[path] = load(driver, base + path)
    for path, page_facts in facts.items():
        where = f"/{path}"
        problems += [f"{where}: console error: {m}" for m in page_facts.console_errors]
        for raw in RAW_MARKERS.finditer(page_facts.text):
            line = page_facts.text[raw.start() :].splitlines()[0]
            problems.append(f"{where}: unrendered include or directive: {line.strip()!r}")
        source = source_page(docs, path)
        if source is not None:
            code = [_normalized(block) for block in page_facts.code]
            for example in included_examples(source.read_text()):
                wanted = _normalized((docs.parent / example).read_text())
                if not any(wanted in block for block in code):
                    problems.append(
                        f"{where}: {example} (included by {source.name}) is not shown whole"
                    )
        for link in page_facts.links:
            parts = urlsplit(link)
            if f"{parts.scheme}://{parts.netloc}/" != base:
                continue  # another site: not ours to check
            target, fragment = urldefrag(link)
            target_path = urlsplit(target).path
            file = _target_file(site, target_path)
            if file is None:
                problems.append(f"{where}: link to a missing page or file: {target_path}")
                continue
            if fragment:
                key = file.parent.relative_to(site).as_posix()
                key = "" if key == "." else f"{key}/"
                ids = facts[key].ids if key in facts else _ids_in_html(file)
                if unquote(fragment) not in ids:
                    problems.append(f"{where}: link to a missing anchor: {target_path}#{fragment}")
    return sorted(set(problems))


def _ids_in_html(page: Path) -> set[str]:
    """The element ids of a page not loaded in the browser (read from its HTML)."""
    html = page.read_text(errors="replace")
    return set(re.findall(r"""\sid=["']([^"']+)["']""", html)) | set(
        re.findall(r"""\sname=["']([^"']+)["']""", html)
    )
