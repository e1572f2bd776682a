"""Render the README's picture of the report, docs/report.png, from a real report.html with headless Chromium.

    .venv/bin/python docs/make_report_image.py                       # the demo run of docs/make_samples.py
    .venv/bin/python docs/make_report_image.py results/samples/results/variation/report/report.html
                                                                     # the one-cell variation's report (minutes)

Chromium (`apt-get install chromium`) draws the page as a browser shows it, in a throw-away profile with no network
features, in a window as wide as a repository page shows a README's picture (900 CSS pixels, one image pixel each):
the report's text stays at its own 13-14 px. The picture is the page's top only, cut after the first figure: the
title, the summary, the headline accuracy table with its winners, and that table's plot. Make it from a clean tree
(the report names the commit its trials ran at).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image, ImageOps

REPO = Path(__file__).resolve().parents[1]
DEMO_REPORT = REPO / "results" / "samples" / "results" / "demo" / "report" / "report.html"
OUT = REPO / "docs" / "report.png"
MAX_BYTES = 300_000
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars")


# Run by Chromium before it draws: everything after the page's first figure is hidden, so that the picture ends there.
CUT_AFTER_FIRST_FIGURE = """<script>
document.addEventListener("DOMContentLoaded", () => {
  let node = document.querySelector("img");
  while (node && node !== document.body) {
    for (let next = node.nextElementSibling; next; next = next.nextElementSibling) next.style.display = "none";
    node = node.parentElement;
  }
});
</script>"""


def screenshot(page: Path, png: Path, width: int, height: int) -> None:
    """The page as Chromium draws it in a window of width x height CSS pixels, cut after its first figure."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        raise SystemExit("make_report_image: no chromium found; install it (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as profile:
        cut = Path(profile) / "report.html"
        cut.write_text(page.read_text(encoding="utf-8").replace("</head>", CUT_AFTER_FIRST_FIGURE + "</head>", 1),
                       encoding="utf-8")
        subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}/profile", f"--screenshot={png}",
                        f"--window-size={width},{height}", "--force-device-scale-factor=1", cut.as_uri()],
                       check=True, capture_output=True, timeout=120)


def trim(image: Image.Image, margin: int = 16) -> Image.Image:
    """The picture without the blank window below the page's end."""
    inked = ImageOps.invert(image.convert("L")).getbbox()
    return image if inked is None else image.crop((0, 0, image.width, min(image.height, inked[3] + margin)))


def save(image: Image.Image, out: Path) -> int:
    """As a palette PNG (the page's few colours; the plot's lines keep theirs); return its size."""
    image.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    return out.stat().st_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", nargs="?", type=Path, default=DEMO_REPORT, help="a report.html")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the PNG to write (default: {OUT.relative_to(REPO)})")
    parser.add_argument("--width", type=int, default=900, help="window width, CSS pixels (= the picture's)")
    parser.add_argument("--height", type=int, default=3000, help="window height, CSS pixels (the blank end is cut)")
    args = parser.parse_args()
    if not args.report.is_file():
        raise SystemExit(f"make_report_image: no report at {args.report}; run docs/make_samples.py demo first, or "
                         "name a report.html")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "page.png"
        screenshot(args.report, raw, args.width, args.height)
        size = save(trim(Image.open(raw).convert("RGB")), args.out)
    if size > MAX_BYTES:
        raise SystemExit(f"make_report_image: {args.out} is {size / 1000:.0f} kB, over {MAX_BYTES / 1000:.0f} kB")
    print(f"{args.out}: {size / 1000:.0f} kB from {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
