"""The built documentation site, opened from disk in headless Chromium (issue 32).

The site is built once (``mkdocs build --strict``) and opened as ``file://``, the way
a user opens ``site/index.html``:

* screenshots of the home page, getting started and a guide (kept where
  ``MANIFEST_DOCS_SHOTS`` names, to look at; in a temporary folder otherwise);
* search works offline: the index is inlined as a script, the search box is there;
* every Mermaid diagram of the pages draws with the vendored mermaid (no network);
* the copy button copies the commands only, not the ``$`` prompts or the output;
* the header names the repository and the version.

Skipped without a Chromium (``apt-get install chromium``) or without mkdocs.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.runs import REPO
from tests.test_docs_examples import all_blocks

pytestmark = pytest.mark.slow

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)
MERMAID = next((REPO / "docs" / "assets" / "javascripts").glob("mermaid-*.min.js"))


def chromium(*args: str, timeout: float = 120) -> str:
    assert CHROMIUM is not None
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--allow-file-access-from-files", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if CHROMIUM is None:
        pytest.skip("no Chromium here (apt-get install chromium)")
    pytest.importorskip("mkdocs")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(["mkdocs", "build", "--strict", "-q", "--site-dir", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_screenshots_of_three_pages(site: Path, tmp_path: Path) -> None:
    shots = Path(os.environ.get("MANIFEST_DOCS_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    for page in ("index.html", "getting-started.html", "guides/verify.html"):
        png = shots / (page.replace("/", "-").removesuffix(".html") + ".png")
        chromium(f"--screenshot={png}", "--window-size=1280,1400",
                 "--virtual-time-budget=5000", (site / page).as_uri())
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 20_000, page


def test_search_works_from_disk_and_the_header_names_repo_and_version(site: Path) -> None:
    index = (site / "search" / "search_index.js").read_text(encoding="utf-8")
    assert "nothing-compared" in index  # the generated verdicts table is searchable
    # Type a query into the search box of the page opened from disk, as a user would.
    built = (site / "index.html").read_text(encoding="utf-8")
    probe = site / "search-probe.html"
    probe.write_text(built.replace("</body>", """<script>
addEventListener("load", () => setTimeout(() => {
  const input = document.querySelector("input[data-md-component=search-query]");
  input.focus(); input.value = "nothing-compared";
  input.dispatchEvent(new Event("input", {bubbles: true}));
  input.dispatchEvent(new KeyboardEvent("keyup", {bubbles: true}));
  setTimeout(() => {
    const found = document.querySelectorAll(".md-search-result__item").length;
    document.body.setAttribute("data-found", String(found));
  }, 4000);
}, 1000));
</script></body>"""), encoding="utf-8")
    dom = chromium("--dump-dom", "--virtual-time-budget=15000", probe.as_uri())
    assert 'data-md-component="search"' in dom
    found = re.search(r'data-found="(\d+)"', dom)
    assert found is not None and int(found[1]) >= 1, found
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(),
                        re.MULTILINE)
    assert version is not None
    assert re.search(rf"md-source__repository\">\s*torch-manifest {re.escape(version[1])}",
                     dom)
    assert 'href="https://github.com/' in dom


def test_every_diagram_draws_offline(site: Path, tmp_path: Path) -> None:
    diagrams = [b.body for b in all_blocks("diagram")]
    assert len(diagrams) >= 2
    page = tmp_path / "draw.html"
    sources = "".join(f'<pre class="src">{html.escape(d)}</pre>' for d in diagrams)
    page.write_text(f"""<!doctype html><html><body>{sources}<div id="out"></div>
<script src="{MERMAID.as_uri()}"></script>
<script>
(async () => {{
  mermaid.initialize({{startOnLoad: false}});
  const out = document.getElementById("out");
  let i = 0;
  for (const pre of document.querySelectorAll("pre.src")) {{
    const div = document.createElement("div");
    try {{
      const {{svg}} = await mermaid.render("d" + i++, pre.textContent);
      div.className = "drawn"; div.innerHTML = svg;
    }} catch (e) {{
      div.className = "broken"; div.textContent = String(e);
    }}
    out.appendChild(div);
  }}
  out.setAttribute("data-done", "1");
}})();
</script></body></html>""", encoding="utf-8")
    dom = chromium("--dump-dom", "--virtual-time-budget=20000", page.as_uri())
    assert 'data-done="1"' in dom
    assert 'class="broken"' not in dom, dom[dom.find('class="broken"'):][:500]
    assert dom.count('class="drawn"><svg') == len(diagrams)
    # The built pages carry the diagrams for Material to draw, and load the vendored copy.
    built = (site / "index.html").read_text(encoding="utf-8")
    assert 'class="mermaid"' in built and MERMAID.name in built
    assert "unpkg.com" not in built


def test_the_copy_button_copies_commands_only(site: Path, tmp_path: Path) -> None:
    """Material reads the code's innerText while it is marked [data-md-copying]; the
    site's CSS hides prompts and output lines then. Read it the same way here."""
    built = (site / "getting-started.html").read_text(encoding="utf-8")
    probe = tmp_path / "copy.html"
    script = """<script>
addEventListener("load", () => {
  const code = [...document.querySelectorAll(".highlight code")]
    .find(c => c.querySelector(".gp") && c.querySelector(".go"));
  const plain = code.innerText;
  code.setAttribute("data-md-copying", "");
  const copied = code.innerText;
  code.removeAttribute("data-md-copying");
  const out = document.createElement("textarea");
  out.id = "copied"; out.textContent = JSON.stringify({plain, copied});
  document.body.appendChild(out);
});
</script></body>"""
    probe.write_text(built.replace("</body>", script), encoding="utf-8")
    shutil.copytree(site / "assets", tmp_path / "assets")
    dom = chromium("--dump-dom", "--virtual-time-budget=5000", probe.as_uri())
    found = re.search(r'<textarea id="copied">(.*?)</textarea>', dom, re.DOTALL)
    assert found is not None
    import json

    texts = json.loads(html.unescape(found[1]))
    # Positive control: the block as shown has prompts and output.
    assert "$ manifest" in texts["plain"] and "identical" in texts["plain"]
    copied = [line for line in texts["copied"].splitlines() if line.strip()]
    assert copied and all(line.startswith("manifest ") for line in copied), copied
