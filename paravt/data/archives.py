"""Archives of Hub datasets (zips, tars, split tars ``x.tar.part.aa`` …) found in a snapshot and
extracted, resumably and content-checked: shared by the benchmark fetch (:mod:`paravt.eval.hub`) and
the training-data fetch (:mod:`paravt.data.fetch`).

Extraction is resumable: a member already on disk with the same bytes (its size and CRC-32: the zip's
own, or the tar member's hashed as it streams) is skipped, each file is written under a temporary name
and renamed when complete, and a finished archive leaves a marker (``.paravt-extracted/<archive>.json``).
A member whose path would leave the target folder stops the run with its name."""

from __future__ import annotations

import io
import os
import json
import re
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tqdm import tqdm

MARKER_DIR = ".paravt-extracted"


@dataclass
class Archive:
    name: str  # zip file name, or the joined tar's name for split parts
    parts: list[Path]
    kind: str  # zip | tar

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.parts)


_TAR_PART = re.compile(r"^(?P<base>.+\.tar(?:\.gz)?)(?:\.part)?\.(?P<suffix>[a-z]{2,3}|\d{2,4})$")


def path_matches(rel_path: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """The one rule for ``--source-include`` / media patterns: :func:`fnmatch.fnmatch` on the path
    relative to the repository (``*`` crosses ``/``), used by the listing, the download and the
    extraction alike."""
    import fnmatch  # noqa: PLC0415

    return any(fnmatch.fnmatch(rel_path, pat) for pat in patterns)


def find_archives(snap: Path, patterns: tuple[str, ...] | list[str]) -> list[Archive]:
    """The archives among the snapshot files matching ``patterns`` (plain files, e.g. MMVU's mp4s,
    are used where they are). Split tars are grouped under their joined name, parts in order.

    ``patterns`` match each file's path relative to the snapshot with :func:`fnmatch.fnmatch` (``*``
    crosses ``/``), the rule :mod:`paravt.data.fetch` lists and downloads by, so ``museg/*`` extracts
    exactly the archives it downloaded, nested folders included."""
    files = sorted(p for p in snap.rglob("*") if p.is_file() and path_matches(p.relative_to(snap).as_posix(), patterns))
    out: list[Archive] = []
    tars: dict[str, list[Path]] = {}
    for p in files:
        n = p.name
        if n.endswith(".zip"):
            out.append(Archive(n, [p], "zip"))
        elif n.endswith((".tar", ".tar.gz", ".tgz")):  # a whole archive (x.tar.gz is not part "gz" of x.tar)
            out.append(Archive(n, [p], "tar"))
        elif (m := _TAR_PART.match(n)) is not None:
            tars.setdefault(m.group("base"), []).append(p)
    out += [Archive(base, sorted(parts, key=lambda q: q.name), "tar") for base, parts in sorted(tars.items())]
    return out


class _Joined(io.RawIOBase):
    """The parts of a split archive read as one stream (no joined copy on disk)."""

    def __init__(self, parts: list[Path], bar: tqdm | None = None):
        self._parts = list(parts)
        self._f: IO[bytes] | None = None
        self._bar = bar

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        while True:
            if self._f is None:
                if not self._parts:
                    return 0
                self._f = open(self._parts.pop(0), "rb")  # noqa: SIM115 - closed when exhausted
            n = self._f.readinto(b)
            if n:
                if self._bar is not None:
                    self._bar.update(n)
                return n
            self._f.close()
            self._f = None

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        super().close()


def _target(dest: Path, member: str, archive: str) -> Path:
    rel = Path(member)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"{archive}: member {member!r} would be written outside {dest}; not extracting it")
    return dest / rel


def _crc_of(src: IO[bytes]) -> int:
    crc = 0
    while chunk := src.read(1 << 20):
        crc = zlib.crc32(chunk, crc)
    return crc


def _same_file(target: Path, size: int, crc: int) -> bool:
    """True when ``target`` already holds these bytes (size, then CRC-32 of its content)."""
    if not (target.is_file() and target.stat().st_size == size):
        return False
    with open(target, "rb") as f:
        return _crc_of(f) == crc


def _write(src: IO[bytes], target: Path, keep_if_crc_differs_from: int | None = None) -> int:
    """Copy ``src`` to ``target`` through a temporary name; the CRC-32 of what was copied. With
    ``keep_if_crc_differs_from``, a copy with that CRC is dropped (the target already holds it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".paravt-part")
    crc = 0
    with open(tmp, "wb") as out:
        while chunk := src.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
            out.write(chunk)
    if keep_if_crc_differs_from is not None and crc == keep_if_crc_differs_from:
        tmp.unlink()
    else:
        os.replace(tmp, target)
    return crc


def extract(a: Archive, dest: Path, progress: bool = True) -> dict[str, int]:
    """Extract one archive into ``dest`` (resumable, see the module docstring). Returns counts:
    written, skipped (already there with their size), and ``done`` 1 when the marker said so."""
    dest.mkdir(parents=True, exist_ok=True)
    marker = dest / MARKER_DIR / f"{a.name}.json"
    stamp = [[p.name, p.stat().st_size] for p in a.parts]
    if marker.is_file():
        try:
            if json.loads(marker.read_text()).get("parts") == stamp:
                return {"written": 0, "skipped": 0, "done": 1}
        except (OSError, ValueError):
            pass
    counts = {"written": 0, "skipped": 0, "done": 0}
    bar = tqdm(total=a.size, unit="B", unit_scale=True, desc=f"extract {a.name}", disable=not progress, leave=False)
    try:
        if a.kind == "zip":
            with zipfile.ZipFile(a.parts[0]) as z:
                for info in z.infolist():
                    bar.update(info.compress_size)
                    if info.is_dir():
                        continue
                    target = _target(dest, info.filename, a.name)
                    if _same_file(target, info.file_size, info.CRC):  # the archive's own CRC-32
                        counts["skipped"] += 1
                        continue
                    with z.open(info) as src:
                        _write(src, target)
                    counts["written"] += 1
        else:
            stream = io.BufferedReader(_Joined(a.parts, bar), buffer_size=1 << 20)
            with tarfile.open(fileobj=stream, mode="r|*") as tf:
                for m in tf:
                    if not m.isfile():  # folders are made as needed; links are not followed
                        continue
                    target = _target(dest, m.name, a.name)
                    src = tf.extractfile(m)
                    assert src is not None
                    if target.is_file() and target.stat().st_size == m.size:
                        # tar keeps no checksum of the content: the member (read through anyway, the
                        # stream is sequential) is written aside while hashed, and kept only when it
                        # differs from the file on disk
                        with open(target, "rb") as f:
                            have = _crc_of(f)
                        if _write(src, target, keep_if_crc_differs_from=have) == have:
                            counts["skipped"] += 1
                            continue
                    else:
                        _write(src, target)
                    counts["written"] += 1
    finally:
        bar.close()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"parts": stamp, **counts}))
    return counts


# ------------------------------------------------------------------------------------ one split
