"""Archives are what others made: a hostile member (an absolute name, a `..`, a symbolic or hard link, a device, a
pipe) is refused in one line naming it, whether the archive was already in place or fetched, with a published md5 or
without one (MR's), and no byte outside the dataset's folder changes (a sibling tree hashed before and after); an
archive in place that fails its md5 is refused before it is opened; a clean one unpacks, its members checked against
their published md5s before they are moved into place."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.cli.main import main
from bench.config import UserError
from bench.datasets.mr import MovieReview
from bench.download import file_md5, unpack

ARCHIVE = "rt-polaritydata.tar.gz"
POS, NEG = b"a fine film\n" * 30, b"a dull film\n" * 30


def tree_digest(root: Path, skip: Path) -> dict[str, str]:
    """Every entry under `root` but `skip`: a file by its bytes' sha256, a link by its target, a folder by its name."""
    seen = {}
    for path in sorted(root.rglob("*")):
        if path == skip or skip in path.parents:
            continue
        rel = str(path.relative_to(root))
        seen[rel] = (f"-> {os.readlink(path)}" if path.is_symlink() else
                     hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "folder")
    return seen


def error_lines(err: str) -> list[str]:
    """What a command said on stderr, the download's progress lines aside."""
    return [line for line in err.splitlines() if not line.startswith("downloading ")]


def add(tar: tarfile.TarFile, name: str, data: bytes = b"", **kind: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data) if not kind else 0
    for key, value in kind.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if not kind else None)


# Each hostile member kind, written after the two published files (so the archive looks like MR's): the member the
# refusal must name, and how it is written. `outside` is a folder beside the data root, holding `victim.txt`.
HOSTILE: dict[str, tuple[str, Callable[[tarfile.TarFile, Path], None]]] = {
    "dotdot": ("rt-polaritydata/../../outside/planted.txt",
               lambda t, out: add(t, "rt-polaritydata/../../outside/planted.txt", b"planted")),
    "absolute": ("OUTSIDE/planted.txt", lambda t, out: add(t, f"{out}/planted.txt", b"planted")),
    "symlink then file under it": (
        "rt-polaritydata/escape",
        lambda t, out: (add(t, "rt-polaritydata/escape", type=tarfile.SYMTYPE, linkname=str(out)),
                        add(t, "rt-polaritydata/escape/planted.txt", b"planted"))),
    "symlink then file over it": (
        "rt-polaritydata/rt-polarity.neg",
        lambda t, out: (add(t, "rt-polaritydata/rt-polarity.neg", type=tarfile.SYMTYPE,
                            linkname=str(out / "victim.txt")),
                        add(t, "rt-polaritydata/rt-polarity.neg", b"overwritten"))),
    "hard link": ("rt-polaritydata/hard",
                  lambda t, out: (add(t, "rt-polaritydata/hard", type=tarfile.LNKTYPE,
                                      linkname=str(out / "victim.txt")),
                                  add(t, "rt-polaritydata/hard", b"overwritten"))),
    "device": ("rt-polaritydata/null", lambda t, out: add(t, "rt-polaritydata/null", type=tarfile.CHRTYPE,
                                                          devmajor=1, devminor=3)),
    "pipe": ("rt-polaritydata/pipe", lambda t, out: add(t, "rt-polaritydata/pipe", type=tarfile.FIFOTYPE)),
}


def hostile_archive(path: Path, kind: str, outside: Path) -> str:
    """Write MR's archive with one hostile member kind; the member's name as the refusal must give it."""
    member, write = HOSTILE[kind]
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        add(tar, "rt-polaritydata/rt-polarity.pos", POS)
        add(tar, "rt-polaritydata/rt-polarity.neg", NEG)
        write(tar, outside)
    return member.replace("OUTSIDE", str(outside))


@pytest.fixture
def published_mr(monkeypatch: pytest.MonkeyPatch) -> None:
    """MR whose published files are this test's POS and NEG (their md5s), checksums on."""
    monkeypatch.setattr(MovieReview, "files", {"rt-polaritydata/rt-polarity.pos": hashlib.md5(POS).hexdigest(),
                                               "rt-polaritydata/rt-polarity.neg": hashlib.md5(NEG).hexdigest()})
    monkeypatch.setattr(MovieReview, "published_sizes", {})
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "1")


@pytest.mark.parametrize("digest", ["published md5", "no md5"])
@pytest.mark.parametrize("where", ["in place", "fetched"])
@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_member_is_refused_in_one_line_and_nothing_outside_changes(
        kind: str, where: str, digest: str, tmp_path: Path, monkeypatch, published_mr, published, capsys) -> None:
    outside, root = tmp_path / "outside", tmp_path / "data"
    outside.mkdir()
    root.mkdir()  # the data root; the dataset's folder under it is the download's to make
    (outside / "victim.txt").write_text("the user's own file")
    archive = (root / "MR" if where == "in place" else tmp_path / "published") / ARCHIVE
    member = hostile_archive(archive, kind, outside)
    monkeypatch.setattr(MovieReview, "urls", {published(tmp_path / "published" / ARCHIVE): ARCHIVE})
    monkeypatch.setattr(MovieReview, "archive_md5", {ARCHIVE: file_md5(archive)} if digest == "published md5" else {})
    before = tree_digest(tmp_path, skip=root / "MR")

    assert main(["datasets", "--download", "mr", "--data-root", str(root)]) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and f"member {member!r}" in err[0], err
    assert tree_digest(tmp_path, skip=root / "MR") == before
    assert sorted(p.name for p in (root / "MR").iterdir()) == [ARCHIVE]  # nothing unpacked, no staging folder left


def test_an_archive_in_place_that_fails_its_md5_is_refused_before_it_is_opened(
        tmp_path: Path, monkeypatch, published_mr, capsys) -> None:
    outside, root = tmp_path / "outside", tmp_path / "data"
    outside.mkdir()
    hostile_archive(root / "MR" / ARCHIVE, "dotdot", outside)
    monkeypatch.setattr(MovieReview, "archive_md5", {ARCHIVE: "0" * 32})
    assert main(["datasets", "--download", "mr", "--data-root", str(root)]) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "is not the published file (md5 mismatch)" in err[0], err
    assert not (outside / "planted.txt").exists() and not (root / "MR" / "rt-polaritydata").exists()


def test_a_clean_archive_unpacks_its_members_checked_and_moved_into_place(
        tmp_path: Path, monkeypatch, published_mr, capsys) -> None:
    root = tmp_path / "data"
    archive = root / "MR" / ARCHIVE
    archive.parent.mkdir(parents=True)
    stale = root / "MR" / "rt-polaritydata"
    stale.mkdir()
    (stale / "rt-polarity.pos").write_bytes(b"a damaged copy")
    with tarfile.open(archive, "w:gz") as tar:
        add(tar, "rt-polaritydata/rt-polarity.pos", POS)
        add(tar, "rt-polaritydata/rt-polarity.neg", NEG)
    assert main(["datasets", "--download", "mr", "--data-root", str(root)]) == 0
    assert (stale / "rt-polarity.pos").read_bytes() == POS and (stale / "rt-polarity.neg").read_bytes() == NEG
    assert sorted(p.name for p in (root / "MR").iterdir()) == ["rt-polaritydata", ARCHIVE]

    # MR's archive has no published md5: a member that fails its own is refused before anything moves into place.
    (stale / "rt-polarity.pos").unlink()
    with tarfile.open(archive, "w:gz") as tar:
        add(tar, "rt-polaritydata/rt-polarity.pos", POS + b"one more line\n")
        add(tar, "rt-polaritydata/rt-polarity.neg", NEG)
    assert main(["datasets", "--download", "mr", "--data-root", str(root)]) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "member rt-polaritydata/rt-polarity.pos is not the published file" in err[0], err
    assert sorted(p.name for p in stale.iterdir()) == ["rt-polarity.neg"]


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_zip_members_are_held_to_the_same_rule(kind: str, tmp_path: Path) -> None:
    outside, folder = tmp_path / "outside", tmp_path / "data" / "set"
    outside.mkdir()
    folder.mkdir(parents=True)
    archive = tmp_path / "set.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("set/ok.txt", "fine")
        if kind == "symlink":
            link = zipfile.ZipInfo("set/escape")
            link.external_attr = (0o120777 << 16)
            z.writestr(link, str(outside))
            member = "set/escape"
        else:
            member = "../../outside/planted.txt" if kind == "dotdot" else f"{outside}/planted.txt"
            z.writestr(member, "planted")
    before = tree_digest(tmp_path, skip=folder)
    with pytest.raises(UserError, match=f"member {member!r}"):
        unpack(archive, folder)
    assert tree_digest(tmp_path, skip=folder) == before and list(folder.iterdir()) == []
