"""Downloads are what others send: on a real HTTP server on 127.0.0.1, a body cut short of its Content-Length, an
HTML page where an image belongs, a drip of one byte a second, an endless body, a file:// address and a redirect to
one each fail within their bounds, counted by kind in one line each, and nothing but the good image is kept; the
command's own deadline ends it; a damaged `.fetched.tsv` is read, not a traceback. Each fails on 9638f3c (#54)."""

from __future__ import annotations

import http.server
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from bench.cli.main import main
from bench.datasets.image_files import decode
from bench.download import FAILURE_KINDS, MANIFEST, Fetched, Limits, fetch_many
from tests.datasets.test_realworld import write_red


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


GOOD = png()


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[str]:
    """A server on 127.0.0.1 whose every path is one way to fail; each loop ends by itself (a bound on what it sends,
    or the client gone)."""
    local = tmp_path / "local.png"
    local.write_bytes(GOOD)  # a real image: only its address is wrong

    class Handler(http.server.BaseHTTPRequestHandler):
        def head(self, status: int = 200, length: int | None = None, **headers: str) -> None:
            self.send_response(status)
            for key, value in ({"Content-Length": str(length)} if length is not None else {}).items() | \
                    headers.items():
                self.send_header(key, value)
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802 (the base class's name)
            try:
                self.answer(self.path.lstrip("/").split("/")[-1])
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up: what a bound does

        def answer(self, name: str) -> None:
            if name.startswith("good"):
                self.head(length=len(GOOD))
                self.wfile.write(GOOD)
            elif name.startswith("cut"):
                self.head(length=10_000)
                self.wfile.write(GOOD[:100])
            elif name.startswith("page"):
                page = b"<html><body>Image not found</body></html>"
                self.head(length=len(page), **{"Content-Type": "text/html"})
                self.wfile.write(page)
            elif name.startswith("drip"):
                self.head(length=1_000)
                for i in range(30):  # one byte a second, 30 at most
                    self.wfile.write(GOOD[i:i + 1])
                    self.wfile.flush()
                    time.sleep(1)
            elif name.startswith("endless"):
                self.head()
                for _ in range(4_000):  # 64 KB blocks, 256 MB at most
                    self.wfile.write(b"\0" * (1 << 16))
            elif name.startswith("redirect"):
                self.head(302, length=0, Location=local.as_uri())
            else:
                self.head(404, length=0)

        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.protocol_version = "HTTP/1.0"  # a body without Content-Length ends with the connection
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


LIMITS = Limits(file_seconds=3, file_bytes=1_000_000, read_seconds=5, command_seconds=60)


def image(path: Path) -> None:
    decode(path, 8, "test")


def test_each_hostile_answer_fails_within_its_bound_by_kind(tmp_path: Path, hostile: str) -> None:
    items = {"good.png": f"{hostile}/good.png", "cut.png": f"{hostile}/cut.png", "page.png": f"{hostile}/page.png",
             "drip.png": f"{hostile}/drip.png", "endless.png": f"{hostile}/endless.png",
             "file.png": (tmp_path / "local.png").as_uri(), "redirect.png": f"{hostile}/redirect.png"}
    folder = tmp_path / "images"
    start = time.monotonic()
    done = fetch_many(items, folder, workers=len(items), limits=LIMITS, check=image)
    assert time.monotonic() - start < LIMITS.file_seconds + 3
    assert done == Fetched(fetched=["good.png"], kept=[], failed={
        "cut.png": "cut", "drip.png": "slow", "endless.png": "large", "file.png": "scheme", "page.png": "unreadable",
        "redirect.png": "scheme"})
    assert sorted(p.name for p in folder.iterdir()) == [".failed.tsv", MANIFEST, "good.png"]
    assert (folder / "good.png").read_bytes() == GOOD
    lines = done.lines("set: ")
    assert len(lines) == 5 and f"set: 2 failed: {FAILURE_KINDS['scheme']} (first: file.png)" in lines
    failed = dict(line.split("\t", 1) for line in (folder / ".failed.tsv").read_text().splitlines())
    assert "10,000 bytes its Content-Length announced" in failed["cut.png"]
    assert f"redirected to {(tmp_path / 'local.png').as_uri()}" in failed["redirect.png"]


def test_the_commands_deadline_ends_it_and_the_rest_fail_for_the_next_run(tmp_path: Path, hostile: str) -> None:
    items = {"drip.png": f"{hostile}/drip.png", "good.png": f"{hostile}/good.png"}
    limits = Limits(file_seconds=30, file_bytes=1_000_000, read_seconds=5, command_seconds=2)
    start = time.monotonic()
    done = fetch_many(items, tmp_path / "images", workers=1, limits=limits, check=image)
    assert time.monotonic() - start < 5
    assert done.failed == {"drip.png": "deadline", "good.png": "deadline"}
    assert fetch_many(items | {"drip.png": f"{hostile}/good.png"}, tmp_path / "images", limits=LIMITS).fetched == \
        ["drip.png", "good.png"]  # the next run goes on


def test_a_damaged_manifest_is_read_and_its_files_fetched_again(tmp_path: Path, hostile: str) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "good.png").write_bytes(GOOD)
    (folder / MANIFEST).write_text("good.png\t\u00b2\t" + "0" * 64 + "\ngood.png\t" + "9" * 5000 + "\tx\nno tabs\n",
                                   encoding="utf-8")
    done = fetch_many({"good.png": f"{hostile}/good.png"}, folder, limits=LIMITS)
    assert done == Fetched(fetched=["good.png"], kept=[], failed={})


def test_prepare_says_each_failure_kind_in_one_line(tmp_path: Path, hostile: str, capsys) -> None:
    import json

    root = tmp_path / "data"
    written = write_red(root, n=10)
    web = sorted({key for rows in written["levels"].values() for key, _ in rows if not key.startswith("n")})
    for key in web:
        (root / "mini-imagenet" / "all_images" / key).unlink()
    listing = tmp_path / "annotations.json"
    kinds = ["page", "cut"]
    listing.write_text(json.dumps({"data": [[{"image/id": Path(key).stem,
                                              "image/uri": f"{hostile}/{kinds[i % 2]}{i}.jpg"}]
                                            for i, key in enumerate(web)]}))
    assert main(["datasets", "--prepare", "red_mini_imagenet", "--from", str(listing), "--data-root", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"{len(web)} failed" in out[0]
    assert any(f"failed: {FAILURE_KINDS['unreadable']} (first: " in line for line in out)
    assert any(f"failed: {FAILURE_KINDS['cut']} (first: " in line for line in out)


def test_a_datasets_own_file_is_fetched_within_the_same_bounds(tmp_path: Path, hostile: str) -> None:
    """`bench datasets --download` (`fetch`): a cut body, an endless one, file:// and a redirect to it each fail in one
    line naming the kind, and leave no file."""
    from bench.config import UserError
    from bench.download import fetch

    for name, url, kind in (("cut", f"{hostile}/cut.png", "cut"), ("endless", f"{hostile}/endless.png", "large"),
                            ("file", (tmp_path / "local.png").as_uri(), "scheme"),
                            ("redirect", f"{hostile}/redirect.png", "scheme")):
        with pytest.raises(UserError) as refused:
            fetch(url, tmp_path / "data" / f"{name}.tar.gz", limits=LIMITS)
        assert "\n" not in str(refused.value) and FAILURE_KINDS[kind] in str(refused.value), (name, refused.value)
    assert list((tmp_path / "data").iterdir()) == []
