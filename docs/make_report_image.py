"""Render the README's picture of the report, docs/report.png, from a real report.html with headless Chromium.

    .venv/bin/python docs/make_report_image.py                       # the demo run of docs/make_samples.py
    .venv/bin/python docs/make_report_image.py results/demo/report/report.html --height 2000 --columns 1

Chromium (`apt-get install chromium`) draws the page as a browser shows it, in a throw-away profile with no network
features; Pillow crops the top of the page (title, summary, the first accuracy table and its figure) and shrinks it
so that the PNG stays small.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
DEMO_REPORT = REPO / "results" / "samples" / "results" / "demo" / "report" / "report.html"
OUT = REPO / "docs" / "report.png"
MAX_BYTES = 300_000
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars")


def screenshot(page: Path, png: Path, width: int, height: int) -> None:
    """The page as Chromium draws it in a window of width x height CSS pixels."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        raise SystemExit("make_report_image: no chromium found; install it (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
                        f"--window-size={width},{height}", page.resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)


def columns(image: Image.Image, count: int) -> Image.Image:
    """The page's top cut into `count` bands laid side by side, like a newspaper: more of the page, still legible."""
    band = image.height // count
    sheet = Image.new("RGB", (image.width * count, band), "white")
    for i in range(count):
        sheet.paste(image.crop((0, i * band, image.width, (i + 1) * band)), (i * image.width, 0))
    return sheet


def shrink(image: Image.Image, out: Path, scale: float) -> int:
    """Scale the picture down, as a palette PNG, until it is under MAX_BYTES; return its size."""
    while True:
        size = (round(image.width * scale), round(image.height * scale))
        small = image.resize(size, Image.LANCZOS).quantize(colors=128, method=Image.Quantize.MEDIANCUT)
        small.save(out, optimize=True)
        if out.stat().st_size < MAX_BYTES or scale < 0.3:
            return out.stat().st_size
        scale *= 0.9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", nargs="?", type=Path, default=DEMO_REPORT, help="a report.html")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the PNG to write (default: {OUT.relative_to(REPO)})")
    parser.add_argument("--width", type=int, default=1100, help="window width, CSS pixels")
    parser.add_argument("--height", type=int, default=2800, help="how much of the page's top to show, CSS pixels")
    parser.add_argument("--columns", type=int, default=2, help="cut that height into this many side-by-side bands")
    parser.add_argument("--scale", type=float, default=0.6, help="shrink factor before the size limit applies")
    args = parser.parse_args()
    if not args.report.is_file():
        raise SystemExit(f"make_report_image: no report at {args.report}; run docs/make_samples.py demo first, or "
                         "name a report.html")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "page.png"
        screenshot(args.report, raw, args.width, args.height)
        size = shrink(columns(Image.open(raw).convert("RGB"), args.columns), args.out, args.scale)
    print(f"{args.out}: {size / 1000:.0f} kB from {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
