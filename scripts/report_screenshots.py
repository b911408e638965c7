"""Screenshots of the HTML report, one attempt per page, in headless Chromium (docs/report-*.png).

    PYTHONPATH=. python scripts/report_screenshots.py --store STORE --job JOB \
        --shot straggler=0 --shot hang=1 --shot crash=2 [--out docs] [--height 1500]

Each shot NAME=ATTEMPT renders `faultlens report --attempt ATTEMPT` and writes report-NAME.png (the
top of the page: summary with the culprit, timeline, heatmap, the start of the GPU charts), reduced
to 64 colours to stay small.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

from faultlens.attribution.reading.store import Store
from faultlens.controller.report.html import write_report


def shoot(page: Path, png: Path, width: int, height: int) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("chromium is not installed")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                f"--screenshot={png}",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=180,
        )
    image = Image.open(png).convert("RGB")
    image.quantize(colors=64).save(png, optimize=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--shot", action="append", required=True, metavar="NAME=ATTEMPT")
    parser.add_argument("--out", default="docs")
    parser.add_argument("--width", type=int, default=1040)
    parser.add_argument("--height", type=int, default=1500)
    args = parser.parse_args(argv)
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp, Store(args.store) as store:
        for shot in args.shot:
            name, _, attempt = shot.partition("=")
            page = write_report(store, args.job, Path(tmp) / f"{name}.html", attempt=int(attempt))
            png = out / f"report-{name}.png"
            shoot(page, png, args.width, args.height)
            print(f"wrote {png} ({png.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
