"""Screenshots of the HTML report in headless Chromium (docs/report-*.png): one page per campaign
family, each from the store of a real job.

    PYTHONPATH=. python scripts/report_screenshots.py \
        --family crash=CAMPAIGN/exception-one-rank/store \
        --family healthy=CAMPAIGN/healthy-end-of-job/store [--family NAME=STORE ...] [--out docs]

    PYTHONPATH=. python scripts/report_screenshots.py --store STORE --job JOB --shot NAME=ATTEMPT

A family's page is the attempt of the job's first incident (`faultlens report --attempt N`), or the
whole job when it has none (a healthy job); the store's one job, or --job. CAMPAIGN is the --out of
`faultlens campaign` (or bench/bench_campaign.py): each scenario's directory holds its store. Each
page is also read from Chromium's DOM: the verdict (the culprit's node and rank, or that nobody is
named) must be on the first screen, above everything else (printed; a page where it is not fails
the script). The image is the top of the page, reduced to 128 colours (octree) to stay small.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

from faultlens.attribution.reading.store import Store
from faultlens.controller.report import data as report_data
from faultlens.controller.report.html import render_html
from tests.chromium_page import FLAGS, chromium, read_first_screens


def browser() -> str:
    found = chromium()
    if found is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium)")
    return found


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            browser(),
            *FLAGS,
            f"--user-data-dir={profile}",
            *args,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "HOME": str(profile)},
    )


def shoot(page: Path, png: Path, width: int, height: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        _chromium(
            [f"--window-size={width},{height}", f"--screenshot={png}", page.as_uri()], Path(profile)
        )
    image = Image.open(png).convert("RGB")
    # 128 colours by octree: every legend colour kept exact (median cut merges the small swatches)
    image.quantize(colors=128, method=Image.Quantize.FASTOCTREE).save(png, optimize=True)


def family_page(store: Store, job: str | None) -> tuple[str, int | None, dict]:
    """The job, the attempt a family's page shows (its first incident's; None: the whole job) and
    that page's data."""
    if job is None:
        jobs = [j["job_id"] for j in report_data.job_ids(store)]
        if len(jobs) != 1:
            raise SystemExit(
                f"the store holds {len(jobs)} jobs ({', '.join(jobs[:5])}): give --job"
            )
        job = jobs[0]
    whole = report_data.job_data(store, job)
    if not whole["incidents"]:
        return job, None, whole
    attempt = int(whole["incidents"][0].get("attempt") or 0)
    return job, attempt, report_data.job_data(store, job, attempt=attempt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", action="append", default=[], metavar="NAME=STORE")
    parser.add_argument("--store", help="with --shot: the store of the job")
    parser.add_argument("--job", help="the job (default: the store's only job)")
    parser.add_argument("--shot", action="append", default=[], metavar="NAME=ATTEMPT")
    parser.add_argument("--out", default="docs")
    parser.add_argument("--width", type=int, default=1040)
    parser.add_argument("--height", type=int, default=1500)
    args = parser.parse_args(argv)
    pages: list[tuple[str, str, str | None, int | None]] = []
    for item in args.family:
        name, _, store = item.partition("=")
        pages.append((name, store, args.job, None))
    for item in args.shot:
        if not args.store:
            parser.error("--shot needs --store")
        name, _, attempt = item.partition("=")
        pages.append((name, args.store, args.job, int(attempt)))
    if not pages:
        parser.error("give --family NAME=STORE or --store STORE --shot NAME=ATTEMPT")
    out = Path(args.out)
    rendered: dict[str, tuple[str, str, int | None]] = {}
    for name, store_path, job, attempt in pages:
        with Store(store_path) as store:
            if attempt is None:
                job, attempt, data = family_page(store, job)
            else:
                data = report_data.job_data(store, job, attempt=attempt)
        rendered[name] = (render_html(data), str(job), attempt)
    readings = read_first_screens({name: page for name, (page, _, _) in rendered.items()})
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (html, job, attempt) in rendered.items():
            page = Path(tmp) / f"{name}.html"
            page.write_text(html, encoding="utf-8")
            png = out / f"report-{name}.png"
            shoot(page, png, args.width, args.height)
            read = readings[name]
            top = read["verdict_top"]
            ok = top is not None and read["verdict_bottom"] <= read["height"]
            failed += not ok
            verdict = " / ".join((read["verdict"] or "no verdict").splitlines())
            print(
                f"{png} ({png.stat().st_size // 1024} KiB): job {job}"
                + ("" if attempt is None else f" attempt {attempt}")
                + f"; verdict at {top:.0f} px: {verdict}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
