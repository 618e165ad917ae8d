"""Get benchmark splits from the Hugging Face Hub by id, the way each dataset ships them.

    python -m paravt.eval.fetch videomme mlvu lmms-lab/charades_sta      # download + extract
    python -m paravt.eval.fetch --annotations-only lvbench                # the question files only
    HF_HUB_OFFLINE=1 python -m paravt.eval.fetch videomme                 # check a filled cache, no network

Each split's Hub id and files are those the authors' release loads (``paravt.eval.splits.SPLITS``,
``HubSource``). The files go to the Hugging Face cache (``huggingface_hub.snapshot_download``:
``HF_HOME``/``HF_HUB_CACHE``, resumable, its own progress bars, a token from ``HF_TOKEN`` for the
gated sets); archives are then extracted to ``$HF_HOME/<media dir>`` (the folder lmms-eval uses,
``--media-root`` to change it): zips one by one, split tars (``videos.tar.part.aa``, ``.ab``, ...)
streamed as one tar without writing the joined file. Extraction is resumable: a member already on
disk with the same bytes (its size and CRC-32: the zip's own, or the tar member's hashed as it
streams) is skipped, each file is written under a temporary name and renamed when
complete, and a finished archive leaves a marker (``.paravt-extracted/<archive>.json``). A member
whose path would leave the target folder stops the run with its name.

The eval driver resolves the same cache (``hub.source``, ``hub.download`` in its config), so after
this command ``splits=[videomme]`` runs without any data_root.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from paravt.eval.hub import HubConfig, HubUnavailable, media_dir, prepare, snapshot
from paravt.eval.splits import LoadReport, SPLITS, load_split, split_name


@dataclass
class Fetched:
    split: str
    repo_id: str
    snapshot: Path
    media_dir: Path
    archives: dict[str, dict[str, int]] = field(default_factory=dict)
    samples: int = 0
    with_video: int = 0
    report: str = ""


def fetch_split(name: str, *, cache_dir: str | None = None, media_root: str | None = None, annotations_only: bool = False,
                download: bool = True, progress: bool = True) -> Fetched:
    """Download (unless ``download`` is false: the cache only) and extract one split, then load it
    through the eval driver's own path and count the samples whose video is there."""
    c = SPLITS[split_name(name)]
    if c.hub is None:
        raise HubUnavailable(f"split {c.name} has no Hub dataset (it is built by the project)")
    res = Fetched(c.name, c.hub.repo_id, Path(), media_dir(c, media_root))
    if annotations_only:
        res.snapshot = snapshot(c, download=download, cache_dir=cache_dir)
    else:
        res.snapshot = prepare(c, download=download, cache_dir=cache_dir, media_root=media_root, progress=progress,
                               counts=res.archives)
    reports: list[LoadReport] = []
    samples = load_split(c.name, "", None,
                         HubConfig(source="hub", cache_dir=cache_dir, media_root=media_root), reports)
    res.samples, res.with_video = len(samples), sum(s.video_exists for s in samples)
    res.report = reports[0].line(len(samples)) if reports else ""
    return res


def main(argv: list[str] | None = None) -> int:
    from paravt.core.secrets import load_secrets  # noqa: PLC0415

    load_secrets()  # HF_TOKEN for gated splits, as the launch scripts read it
    p = argparse.ArgumentParser(prog="python -m paravt.eval.fetch", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="splits: " + ", ".join(f"{s.name} ({s.hub.repo_id})" for s in SPLITS.values() if s.hub))
    p.add_argument("splits", nargs="+", help="split names or Hub ids (e.g. videomme lmms-lab/LVBench)")
    p.add_argument("--cache-dir", default=None, help="Hub cache (default: HF_HUB_CACHE or $HF_HOME/hub)")
    p.add_argument("--media-root", default=None, help="extract the videos here (default: $HF_HOME/<media dir>)")
    p.add_argument("--annotations-only", action="store_true", help="only the question files (no videos)")
    p.add_argument("--offline", action="store_true", help="use the cache only (like HF_HUB_OFFLINE=1)")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    try:
        names = list(dict.fromkeys(split_name(s) for s in a.splits))
    except ValueError as exc:
        print(f"fetch: {exc}", file=sys.stderr)
        return 2
    failed = 0
    for n in names:
        try:
            r = fetch_split(n, cache_dir=a.cache_dir, media_root=a.media_root, annotations_only=a.annotations_only,
                            download=not a.offline, progress=not a.no_progress)
        except (HubUnavailable, FileNotFoundError, ValueError, OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
            print(f"fetch: {n}: {' '.join(str(exc).split())}", file=sys.stderr)
            failed += 1
            continue
        done = ", ".join(f"{k}: " + ("already extracted" if v["done"] else f"{v['written']} written, {v['skipped']} kept")
                         for k, v in r.archives.items())
        where = f"videos {r.media_dir} ({done})" if r.archives else "videos in the snapshot (not archived)"
        print(f"{n}: {r.repo_id} -> annotations {r.snapshot}; " + (where if not a.annotations_only else "no videos"))
        print(f"  {r.report}; {r.with_video} of {r.samples} have their video", flush=True)
        if r.with_video < r.samples and not a.annotations_only:
            failed += 1
            print(f"fetch: {n}: {r.samples - r.with_video} samples have no video after extraction", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
