"""The course's static site (`minitrain-inspect docs`, nbs/17_docsite.ipynb), built from the real notebooks: a page for
every notebook, the index listing them all, navigation on every page, and every link on every page resolving (files
to files in the site, #anchors to ids on the page they name), maths as MathML and nothing from the network, and the
index saying that the site shows the solutions. Built once, without execution (a few seconds)."""
import html
import re
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytest.importorskip("nbconvert")            # the dev extra

from minitrain_inspect.docsite import MARKER, build_site  # noqa: E402

NBS = Path(__file__).resolve().parents[1] / "nbs"
NOTEBOOKS = sorted(p for p in NBS.glob("*.ipynb") if not p.name.startswith(("_", ".")))
LESSONS = [p.stem for p in NOTEBOOKS if p.stem != "index"]


class Page(HTMLParser):
    "What a test needs from a page: its links (href/src, with where they sit), its ids, and its navigation."

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.refs, self.ids, self.open = [], set(), []
        self.sidebar, self.pager, self.current = [], [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag not in {"br", "img", "meta", "link", "input", "hr", "source"}:
            self.open.append((tag, attrs.get("class") or ""))
        if "id" in attrs:
            self.ids.add(attrs["id"])
        inside = {cls for _, cls in self.open}
        for key in ("href", "src"):
            if attrs.get(key) is not None:
                self.refs.append((tag, key, attrs[key], "sidebar" in inside))
        if tag == "a" and "sidebar" in inside and "href" in attrs and attrs.get("class") != "site-title":
            self.sidebar.append(attrs["href"])
            if attrs.get("aria-current") == "page":
                self.current.append(attrs["href"])
        if tag == "a" and attrs.get("rel") in ("prev", "next"):
            self.pager.append((attrs["rel"], attrs["href"]))

    def handle_endtag(self, tag):
        for i in range(len(self.open) - 1, -1, -1):       # tolerate unclosed inner tags
            if self.open[i][0] == tag:
                del self.open[i:]
                break


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs") / "_site"
    started = time.perf_counter()
    pages = build_site(NBS, out)
    print(f"\nsite of {len(pages)} pages built in {time.perf_counter() - started:.1f} s")
    parsed = {p.name: Page(p.read_text(encoding="utf-8")) for p in pages}
    return out, pages, parsed


def test_a_page_for_every_notebook_in_course_order(site):
    out, pages, _ = site
    expected = ["index.html"] + [f"{stem}.html" for stem in LESSONS]
    assert [p.name for p in pages] == expected, f"expected pages {expected}, got {[p.name for p in pages]}"
    assert all(p.parent == out and p.is_file() and p.stat().st_size > 0 for p in pages), "every page should be written"
    assert (out / "style.css").is_file() and (out / MARKER).is_file()
    assert not list(out.parent.glob("._site.*")), "no staging folder should be left beside the site"


def test_every_page_has_the_navigation(site):
    _, pages, parsed = site
    names = [p.name for p in pages]
    for i, name in enumerate(names):
        page = parsed[name]
        assert page.sidebar == names, f"{name}: the sidebar should list every page in course order, got {page.sidebar}"
        assert page.current == [name], f"{name}: the sidebar should mark this page (and only it), got {page.current}"
        expected = ([("prev", names[i - 1])] if i > 0 else []) + ([("next", names[i + 1])] if i + 1 < len(names) else [])
        assert page.pager == expected * 2, f"{name}: previous/next links at top and bottom should be {expected}, got {page.pager}"


def test_the_index_lists_every_notebook_in_its_course_table(site):
    out, _, parsed = site
    text = (out / "index.html").read_text(encoding="utf-8")
    table = text[text.index("<table>"):]
    missing = [stem for stem in LESSONS if f'<a href="{stem}.html"><code>{stem}</code></a>' not in table]
    assert not missing, f"the index's course table (README.md) should link every lesson; missing {missing}"
    in_article = {ref for tag, key, ref, in_sidebar in parsed["index.html"].refs if tag == "a" and not in_sidebar}
    assert {f"{stem}.html" for stem in LESSONS} <= in_article


def test_every_relative_link_resolves(site):
    out, _, parsed = site
    broken = []
    for name, page in parsed.items():
        for tag, key, ref, _ in page.refs:
            parts = urlsplit(html.unescape(ref))
            if parts.scheme == "data" and tag == "img":
                continue                         # a figure embedded in its page
            if parts.scheme or parts.netloc:     # a link out is fine; a resource the page loads must be in the site
                assert tag == "a", f"{name}: a page should load nothing from outside the site, got {tag} {key}={ref!r}"
                continue
            target = name if not parts.path else unquote(parts.path)
            if not (out / target).is_file():
                broken.append(f"{name}: {tag} {key}={ref!r} (no file {target})")
            elif parts.fragment and target.endswith(".html") and not {parts.fragment, unquote(parts.fragment)} & parsed[target].ids:
                # a browser matches the fragment as written, then percent-decoded (nbconvert writes `"` as %22 in both)
                broken.append(f"{name}: {tag} {key}={ref!r} (no id {parts.fragment!r} on {target})")
    assert not broken, f"{len(broken)} broken links, first ones:\n" + "\n".join(broken[:10])


def test_pages_read_without_the_network(site):
    "Layout from the site's own stylesheet, no script; the maths converted to MathML, none of it left as LaTeX."
    out, pages, _ = site
    css = (out / "style.css").read_text(encoding="utf-8")
    assert "@import" not in css and not re.search(r"url\(\s*['\"]?https?:", css), "the stylesheet should need no network"
    texts = {p.name: p.read_text(encoding="utf-8") for p in pages}
    assert not [name for name, text in texts.items() if "<script" in text], "no page should need a script"
    stats = texts["08_stats.html"]
    assert stats.count("<math ") > 100, f"08_stats writes over 100 formulas; got {stats.count('<math ')} as MathML"
    assert r"\overline{x^2}" not in stats and "math-error" not in stats, "every formula of 08_stats should be converted"
    failed = {name: text.count('<code class="math-error"') for name, text in texts.items() if '<code class="math-error"' in text}
    assert not failed, f"formulas left as LaTeX (not converted): {failed}"


def test_no_formula_is_left_as_dollars(site):
    "Outside code, no page shows a `$...$` formula's source: a dollar that find_math missed would show as raw LaTeX."
    _, pages, _ = site
    left = []
    for page in pages:
        text = re.sub(r"<(pre|code|math|title)\b.*?</\1>", " ", page.read_text(encoding="utf-8"), flags=re.S)
        left += [f"{page.name}: {m[0]!r}" for m in re.finditer(r"\$[^$<>\n]{1,80}\$", re.sub(r"<[^>]+>", " ", text))]
    assert not left, f"{len(left)} formulas left as LaTeX, first ones: {left[:5]}"


def test_the_index_says_the_site_shows_the_solutions(site):
    out, _, _ = site
    index = (out / "index.html").read_text(encoding="utf-8")
    assert "<strong>This site shows the solutions</strong>" in index and "--from-release" in index
    assert "This page shows the solutions" in (out / "10_inspect.html").read_text(encoding="utf-8")


def test_notebook_mentions_and_directives(site):
    "Prose that names a lesson in code links to it; nbdev's #| directives and #| hide cells are not shown."
    out, _, _ = site
    inspect = (out / "10_inspect.html").read_text(encoding="utf-8")
    assert re.search(r'<a href="0\d_[a-z_]+\.html"><code>0\d_[a-z_]+</code></a>', inspect), \
        "10_inspect names earlier lessons in code; those names should link to their pages"
    assert "#| export" not in inspect and "#| default_exp" not in inspect, "nbdev directives should not be shown"
