"""Get the release's training data from the Hugging Face Hub by id, then materialize it: the
training twin of :mod:`paravt.eval.fetch`.

    python -m paravt.data.fetch --materialize /data/ParaVT-Parquet-local          # everything, one command
    python -m paravt.data.fetch --dry-run                                          # sizes only, nothing downloaded
    python -m paravt.data.fetch --source-include 'museg/*' --materialize OUT      # some media buckets
    HF_HUB_OFFLINE=1 python -m paravt.data.fetch --materialize OUT                 # a filled cache, no network

Two datasets (the release's README): ``ParaVT/ParaVT-Parquet`` (the SFT and RL annotations,
``paravt_*.parquet``, ~200 MB) and ``ParaVT/ParaVT-Source`` (the videos and auxiliary images as zip
archives per bucket, each member under its sentinel path ``longvt_source/…``, ``museg/…``,
``selfqa/…``). Their file lists and sizes are printed first (with the free space where the media go);
the files go to the Hugging Face cache (``snapshot_download``: resumable, ``HF_TOKEN`` when needed);
every archive is extracted into one media root (``--media-root``, default ``$HF_HOME/paravt_source``),
resumably and content-checked (:mod:`paravt.data.archives`); ``--materialize OUT`` then rewrites the
parquets' sentinel paths to that root (:mod:`paravt.data.materialize`), naming every missing file.

Exit codes: 0 ok; 1 materialize found missing or unresolved media (``--allow-missing`` accepts);
2 the Hub could not serve a dataset (one line: the id and the reason).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

PARQUET_REPO = "ParaVT/ParaVT-Parquet"
SOURCE_REPO = "ParaVT/ParaVT-Source"


class FetchError(RuntimeError):
    """A dataset the Hub (or the offline cache) cannot serve."""


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def listing(repo_id: str, patterns: list[str], cache_dir: str | None = None) -> list[tuple[str, int]]:
    """(path, bytes) of the dataset's files matching ``patterns``: from the Hub, or, offline, from
    the cached snapshot."""
    if _offline():
        snap = snapshot(repo_id, patterns, cache_dir, download=False)
        files = [(p.relative_to(snap).as_posix(), p.stat().st_size) for p in sorted(snap.rglob("*")) if p.is_file()]
    else:
        from huggingface_hub import HfApi  # noqa: PLC0415

        try:
            files = [(f.path, int(f.size or 0)) for f in HfApi().list_repo_tree(repo_id, repo_type="dataset", recursive=True)
                     if hasattr(f, "size")]
        except Exception as exc:  # noqa: BLE001 - gated, missing, network: one line
            raise FetchError(f"{repo_id}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
    from paravt.data.archives import path_matches  # noqa: PLC0415

    return [(p, n) for p, n in files if path_matches(p, patterns)]


def snapshot(repo_id: str, patterns: list[str], cache_dir: str | None = None, download: bool = True) -> Path:
    """The dataset's files matching ``patterns`` in the Hub cache (downloaded unless offline)."""
    from huggingface_hub import snapshot_download  # noqa: PLC0415

    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", allow_patterns=patterns, cache_dir=cache_dir,
                                      local_files_only=_offline() or not download))
    except Exception as exc:  # noqa: BLE001 - LocalEntryNotFound, gated, HTTP, OS errors
        hint = " (not in the cache: run without HF_HUB_OFFLINE=1 to download it)" if _offline() else ""
        raise FetchError(f"{repo_id}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}{hint}") from None


def _cache_dir(cache_dir: str | None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    from huggingface_hub import constants  # noqa: PLC0415

    return Path(constants.HF_HUB_CACHE)


def _existing(p: Path) -> Path:
    """``p`` or its nearest existing parent (a dry run creates nothing)."""
    p = p.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _writable(p: Path) -> bool:
    e = _existing(p)
    return e.is_dir() and os.access(e, os.W_OK)


def space_shortfall(media_root: Path, cache: Path, download: int, extracted: int) -> dict:
    """Whether the downloads (to the Hub cache) and the extraction (to the media root) fit in the free
    space of their filesystems (one filesystem holding both must hold their sum)."""
    need: dict[int, list] = {}
    for where, n in ((_existing(cache), download), (_existing(media_root), extracted)):
        st = os.stat(where)
        entry = need.setdefault(st.st_dev, [where, 0])
        entry[1] += n
    parts, short = [], False
    for where, n in need.values():
        free = shutil.disk_usage(where).free
        short |= n > free
        parts.append(f"{_human(n)} needed on the filesystem of {where}, {_human(free)} free")
    return {"short": short, "summary": "; ".join(parts)}


def default_media_root() -> Path:
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "paravt_source"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paravt.data.fetch", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--parquet-repo", default=PARQUET_REPO, help="the annotations' dataset id (default: %(default)s)")
    p.add_argument("--source-repo", default=SOURCE_REPO, help="the media's dataset id (default: %(default)s)")
    p.add_argument("--parquet-include", action="append", default=None,
                   help="glob of annotation files (repeatable; default: *.parquet)")
    p.add_argument("--source-include", action="append", default=None,
                   help="glob of media archives to get (repeatable; default: every *.zip), e.g. 'museg/*'")
    p.add_argument("--parquets-only", action="store_true", help="the annotations only")
    p.add_argument("--media-root", default=None, help="where the archives are extracted (default: $HF_HOME/paravt_source)")
    p.add_argument("--cache-dir", default=None, help="the Hub cache (default: huggingface_hub's)")
    p.add_argument("--materialize", metavar="OUT_DIR", default=None,
                   help="then rewrite the parquets' media paths to the media root into OUT_DIR")
    p.add_argument("--allow-missing", action="store_true", help="materialize: exit 0 although some media are missing")
    p.add_argument("--allow-unresolved", action="store_true",
                   help="materialize: exit 0 although some paths are under none of the media buckets")
    p.add_argument("--skip-space-check", action="store_true",
                   help="download although the free space looks short (the check counts cache + extraction)")
    p.add_argument("--dry-run", action="store_true", help="print what would be downloaded, with sizes, and stop")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    from paravt.core.secrets import load_secrets  # noqa: PLC0415

    load_secrets()  # HF_TOKEN from .secrets.env, as the launch scripts read it
    parquet_pats = a.parquet_include or ["*.parquet", "**/*.parquet"]
    source_pats = a.source_include or ["*.zip", "**/*.zip"]
    media_root = Path(a.media_root).expanduser() if a.media_root else default_media_root()
    wanted = [(a.parquet_repo, parquet_pats)] + ([] if a.parquets_only else [(a.source_repo, source_pats)])
    try:
        total, sizes = 0, {}
        for repo, pats in wanted:
            files = listing(repo, pats, a.cache_dir)
            size = sum(n for _, n in files)
            total += size
            sizes[repo] = size
            print(f"{repo}: {len(files)} file(s), {_human(size)}" + ("" if files else f" (nothing matches {pats})"))
            for path, n in files[:20]:
                print(f"  {path}  {_human(n)}")
            if len(files) > 20:
                print(f"  ... {len(files) - 20} more")
        extracted = sizes.get(a.source_repo, 0)  # the archives' size: about what they extract to
        short = space_shortfall(media_root, _cache_dir(a.cache_dir), total, extracted)
        print(f"in all {_human(total)} to the Hub cache ({_cache_dir(a.cache_dir)})" + ("" if a.parquets_only else
              f", about {_human(extracted)} more extracted to {media_root}") + f"; {short['summary']}")
        if a.dry_run:
            return 0
        if not _writable(media_root):
            raise FetchError(f"--media-root {media_root}: not writable (choose a folder you can write to)")
        if short["short"] and not a.skip_space_check:
            raise FetchError(f"not enough free space: {short['summary']} (free some, choose --media-root / "
                             "--cache-dir elsewhere, or --skip-space-check)")
        media_root.mkdir(parents=True, exist_ok=True)
        snaps = {repo: snapshot(repo, pats, a.cache_dir) for repo, pats in wanted}
    except FetchError as exc:
        print(f"python -m paravt.data.fetch: {exc}", file=sys.stderr)
        return 2
    parquet_snap = snaps[a.parquet_repo]
    if not a.parquets_only:
        from paravt.data.archives import extract, find_archives  # noqa: PLC0415

        archives = find_archives(snaps[a.source_repo], source_pats)
        for arc in archives:
            counts = extract(arc, media_root, progress=not a.no_progress)
            print(f"extracted {arc.name}: {counts}")
        print(f"{len(archives)} archive(s) extracted to {media_root}")
    print(f"annotations: {parquet_snap}")
    if a.materialize is None:
        print(f"next: python -m paravt.data.materialize --root {media_root} --parquet-dir {parquet_snap} "
              "--output-dir OUT_DIR")
        return 0
    from paravt.data import materialize  # noqa: PLC0415

    parquet_dirs = sorted({q.parent for q in parquet_snap.rglob("paravt_*.parquet")}) or [parquet_snap]
    rc = 0
    for d in parquet_dirs:
        args = ["--root", str(media_root), "--parquet-dir", str(d), "--output-dir", a.materialize]
        rc = max(rc, materialize.main(args + (["--allow-missing"] if a.allow_missing else [])
                                      + (["--allow-unresolved"] if a.allow_unresolved else [])))
    return rc


if __name__ == "__main__":
    sys.exit(main())
