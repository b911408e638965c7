"""Pages read in headless Chromium (Debian's chromium): what a reader sees on the first screen of
each page, laid out by the browser and read back from its DOM.

read_first_screens renders every page at once (one Chromium run), each in an iframe the size of a
screen (srcdoc: same origin as the frame around it, so its layout can be read), and returns for
each page: the text of the first screen in document order, the verdict's text (#verdict) and where
it is, and the culprit-marked texts (.culprit, .culprit-label) on the first screen."""

from __future__ import annotations

import html as html_lib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

_READER = """<script>
window.addEventListener('load', function(){
  var result = {};
  document.querySelectorAll('iframe').forEach(function(frame){
    var doc = frame.contentDocument, win = frame.contentWindow, height = win.innerHeight;
    var out = [], culprits = [], range = doc.createRange(), node;
    var walker = doc.createTreeWalker(doc.body, NodeFilter.SHOW_TEXT);
    while ((node = walker.nextNode())) {
      var parent = node.parentElement;
      if (!node.textContent.trim() || !parent || parent.closest('script,style')) continue;
      range.selectNodeContents(node);
      var r = range.getBoundingClientRect();
      if (r.height > 0 && r.top < height) {
        out.push(node.textContent.trim());
        if (parent.closest('.culprit,.culprit-label')) culprits.push(node.textContent.trim());
      }
    }
    var v = doc.getElementById('verdict'), box = v ? v.getBoundingClientRect() : null;
    result[frame.id] = {height: height, text: out, culprits: culprits,
      verdict: v ? v.innerText : null, verdict_top: box ? box.top : null,
      verdict_bottom: box ? box.bottom : null};
  });
  var pre = document.createElement('pre'); pre.id = 'first-screens';
  pre.textContent = JSON.stringify(result); document.body.appendChild(pre);
});
</script>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def read_first_screens(
    pages: Mapping[str, str], *, width: int = 1040, height: int = 800
) -> dict[str, dict]:
    """{name: page html} -> {name: first-screen reading} (see the module's docstring)."""
    browser = chromium()
    if browser is None:
        raise RuntimeError("chromium is not installed (apt-get install -y chromium)")
    frames = "".join(
        f'<iframe id="{html_lib.escape(name)}" width="{width}" height="{height}" '
        f'style="border:0;display:block" srcdoc="{html_lib.escape(page, quote=True)}"></iframe>'
        for name, page in pages.items()
    )
    outer = (
        '<!DOCTYPE html><html><head><meta charset="utf-8"></head>'
        f'<body style="margin:0">{frames}{_READER}</body></html>'
    )
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "pages.html"
        page.write_text(outer, encoding="utf-8")
        profile = Path(tmp) / "profile"
        profile.mkdir()
        proc = subprocess.run(
            [
                browser,
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "--virtual-time-budget=5000",
                "--dump-dom",
                page.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "HOME": tmp},
        )
    if proc.returncode != 0:
        raise RuntimeError(f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}")
    dom = proc.stdout
    marker = '<pre id="first-screens">'
    if marker not in dom:
        raise RuntimeError(f"chromium's DOM has no reading: {dom[-2000:]}")
    start = dom.index(marker) + len(marker)
    return json.loads(html_lib.unescape(dom[start : dom.index("</pre>", start)]))
