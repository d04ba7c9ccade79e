"""The course's site in a real browser (headless Chromium): a formula renders as MathML, not as `$...$` source, and the
dashboard of a real run shows as a picture on 11_dashboard and 13_overhead. The site is built with those two notebooks
run (about 30 s on an idle 2-core machine); every other page is rendered without running.

Chromium is Debian's `chromium` (`apt-get install chromium`; `.ci/run` installs it). Without it the tests are skipped
with the reason, except under CI=true, where a missing browser fails them: there the check must really run."""
import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("nbconvert")            # the dev extra

from minitrain_inspect.docsite import build_site  # noqa: E402

NBS = Path(__file__).resolve().parents[1] / "nbs"
EXECUTED = ["11_dashboard", "13_overhead"]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# Run in the page once it has loaded: what the browser made of its maths and images, written into the DOM as JSON so
# that `--dump-dom` carries it out. Text inside code is left out: the lessons show `$...$` in code on purpose.
PROBE = """<script>
window.addEventListener("load", () => {
  const article = document.querySelector("article").cloneNode(true);
  article.querySelectorAll("pre, code, math").forEach(e => e.remove());
  const maths = [...document.querySelectorAll("article math")];
  const images = [...document.querySelectorAll("article img")];
  const probe = {
    maths: maths.length,
    mathml_elements: maths.filter(m => typeof MathMLElement !== "undefined" && m instanceof MathMLElement).length,
    maths_laid_out: maths.filter(m => { const r = m.getBoundingClientRect(); return r.width > 0 && r.height > 0; }).length,
    images: images.map(i => ({natural_width: i.naturalWidth, natural_height: i.naturalHeight, complete: i.complete,
                              shown_width: i.getBoundingClientRect().width, inline: i.src.startsWith("data:image/png")})),
    dollars: (article.innerText.match(/\\$[^$\\n]{1,80}\\$/g) || []).slice(0, 5),
  };
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify(probe);
  document.body.appendChild(out);
});
</script>
"""


def find_browser():
    "The path of a Chromium on this machine, or None."
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    path = find_browser()
    if path is None:
        reason = f"no headless browser ({', '.join(BROWSERS)}) on PATH: install Debian's chromium (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {reason}; the site must be checked in a real browser in CI")
        pytest.skip(reason)
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("browser") / "_site"
    build_site(NBS, out, execute=EXECUTED)
    return out


def probe(browser: str, site: Path, page: str) -> dict:
    "What Chromium made of `page` of `site`: the page is copied beside itself with PROBE added, loaded, and its DOM read back."
    text = (site / page).read_text(encoding="utf-8")
    assert "</body>" in text, f"{page}: no </body> to add the probe before"
    probed = site / f"_probe_{page}"
    probed.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    profile = site.parent / "chromium-profile"
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
               f"--user-data-dir={profile}", "--window-size=1280,900", "--virtual-time-budget=20000",
               "--dump-dom", probed.as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert found, (f"{page}: Chromium gave no probe result (exit status {done.returncode}); stderr ends: "
                   f"{done.stderr.strip()[-500:]}")
    return json.loads(html.unescape(found[1]))


@pytest.mark.parametrize("page", ["08_stats.html", "13_overhead.html"])
def test_formulas_render_as_mathml(browser, site, page):
    seen = probe(browser, site, page)
    assert seen["maths"] > 0, f"{page}: no <math> element; the formulas were not converted"
    assert seen["mathml_elements"] == seen["maths"], \
        f"{page}: {seen['maths']} <math> elements, only {seen['mathml_elements']} of them MathML to the browser"
    assert seen["maths_laid_out"] == seen["maths"], \
        f"{page}: {seen['maths'] - seen['maths_laid_out']} of {seen['maths']} formulas take no space on the page"
    assert not seen["dollars"], f"{page}: LaTeX left as text outside code: {seen['dollars']}"


def test_a_known_formula_is_maths_and_not_source(browser, site):
    "13_overhead writes `$10^{-3}$` in its prose: the page holds it as MathML, and the browser shows no `$10^{-3}$`."
    text = (site / "13_overhead.html").read_text(encoding="utf-8")
    prose = re.sub(r"<(pre|code)\b.*?</\1>", "", text, flags=re.S)
    assert "$10^{-3}$" not in prose, "13_overhead: the formula $10^{-3}$ is left as source"
    assert "<msup><mn>10</mn><mrow><mo>&#x02212;</mo><mn>3</mn></mrow></msup>" in text, "13_overhead: 10^{-3} as MathML"
    assert not probe(browser, site, "13_overhead.html")["dollars"]


@pytest.mark.parametrize("page", [f"{stem}.html" for stem in EXECUTED])
def test_the_dashboard_of_a_real_run_shows(browser, site, page):
    seen = probe(browser, site, page)
    dashboards = [i for i in seen["images"] if i["inline"] and i["natural_width"] >= 1000]
    assert dashboards, f"{page}: expected the dashboard as a PNG image at least 1000 px wide, got images {seen['images']}"
    for image in dashboards:
        assert image["complete"] and image["natural_height"] > image["natural_width"] / 2, \
            f"{page}: the dashboard image did not decode to a full figure: {image}"
        assert image["shown_width"] > 300, f"{page}: the dashboard is drawn only {image['shown_width']:.0f} px wide"


def test_the_first_command_of_the_index_is_not_cut_off(browser, site):
    "The index's first command (a code block in the prose) wraps inside its box rather than running past its right edge."
    text = (site / "index.html").read_text(encoding="utf-8")
    check = """<script>
window.addEventListener("load", () => {
  const block = document.querySelector("article .text_cell_render pre");
  const out = document.createElement("pre"); out.id = "probe";
  out.textContent = JSON.stringify({scroll: block.scrollWidth, client: block.clientWidth, text: block.innerText});
  document.body.appendChild(out);
});
</script>
"""
    (site / "_index_check.html").write_text(text.replace("</body>", check + "</body>"), encoding="utf-8")
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={site.parent / 'chromium-profile'}", "--window-size=1024,800",
                           "--virtual-time-budget=10000", "--dump-dom", (site / "_index_check.html").as_uri()],
                          capture_output=True, text=True, timeout=180)
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert found, f"no probe result from Chromium: {done.stderr.strip()[-500:]}"
    seen = json.loads(html.unescape(found[1]))
    assert "python3 -m venv" in seen["text"], f"expected the first command to be the venv line, got {seen['text'][:80]!r}"
    assert seen["scroll"] <= seen["client"] + 1, \
        f"the first command is {seen['scroll']} px wide in a box of {seen['client']} px: its end is cut off"
