"""Benchmark splits: one small config each, the layouts each is shipped in, and how a split is found
and checked (the loaders that read each layout are in :mod:`paravt.eval.loaders`).

A split is found in one of three places, in this order (``load_split``):

1. ``split_paths.<split>`` (a folder), else ``<data_root>/<split dir>``: any of the split's layouts
   (the publisher's original files, or the Hub copy downloaded with ``--local-dir``, archives
   extracted in place);
2. the Hugging Face Hub cache (``$HF_HOME/hub``, ``HF_HUB_CACHE``): the dataset id the authors'
   release loads, resolved by ``huggingface_hub.snapshot_download`` (offline from a filled cache,
   e.g. with ``HF_HUB_OFFLINE=1``); its videos are looked up where ``python -m paravt.eval.fetch``
   extracts the dataset's archives (``$HF_HOME/<media dir>``, the folder lmms-eval extracts them
   to, so a copy lmms-eval already made is reused), then in the snapshot itself.

| split | Hub id (split) | layouts: annotation file(s) -> videos |
|---|---|---|
| videomme / videomme_sub | lmms-lab/Video-MME (test) | ``videomme/test-*.parquet`` -> ``data/<videoID>.mp4`` (``videos_chunked_*.zip``), ``subtitle/<videoID>.srt`` (``subtitle.zip``) |
| longvideobench | longvideobench/LongVideoBench (validation) | ``lvb_val.json`` or ``validation-*.parquet`` -> ``videos/<video_path>`` (``videos.tar.part.*``) |
| lvbench | lmms-lab/LVBench (train = the test set) | Hub: ``data/train-*.parquet`` -> ``<video_path>`` (``video_chunks/videos_chunk_*.zip``); THUDM/LVBench: ``video_info.meta.jsonl`` -> ``videos/<key>.mp4`` |
| mlvu | sy1998/MLVU_dev (test = dev) | Hub: ``mlvu/test-*.parquet`` -> ``<video_name>`` (``video_part_*.zip``, ``action_count.zip``); MLVU/MVLU: ``MLVU/json/*.json`` -> ``MLVU/video/<task dir>/<video>`` |
| mmvu | yale-nlp/MMVU (validation) | ``validation.json`` -> ``videos/<subject>/<n>.mp4`` |
| charades_sta | lmms-lab/charades_sta (test) | Hub: ``data/test-*.parquet`` -> ``Charades_v1_480/<video>`` (``Charades_v1_480_part_*.zip``); original: ``charades_sta_test.txt`` -> ``Charades_v1_480/<vid>.mp4`` |
| synthetic | (none: the project's own) | ``paravt_eval_synth.parquet`` (the RL-row schema, materialized) |

Every loaded row is checked (``check_sample``): options under their own letters A, B, C, ... (a
Hub option already written "A. ..." is not lettered twice), the gold letter among them, a
grounding span with 0 <= start < end, an open answer that is not empty. A row that fails is
dropped and counted by reason; a row whose video (or, for a subtitle split, subtitle file) is
missing is **kept** and reported (``missing_video``): counted, never silently dropped.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from paravt.eval.hub import HubUnavailable, hf_home, prepare, snapshot
from paravt.eval.loaders import LOADERS
from paravt.eval.sample import LETTER_PREFIX, LETTERS, BenchmarkItem, HubSource, Layout, Roots, SplitConfig

log = logging.getLogger(__name__)

_VIDEOMME_HUB = HubSource("lmms-lab/Video-MME", "test", ("videomme/*.parquet",), ("videos_chunked_*.zip", "subtitle.zip"),
                          "videomme")
SPLITS: dict[str, SplitConfig] = {s.name: s for s in [
    SplitConfig("videomme", "Video-MME", (Layout("hub", "videomme/test-*.parquet", "videomme"),), _VIDEOMME_HUB,
                about="Video-MME test, 2700 MCQ, without subtitles"),
    SplitConfig("videomme_sub", "Video-MME", (Layout("hub", "videomme/test-*.parquet", "videomme"),), _VIDEOMME_HUB,
                subtitles=True, about="Video-MME test, 2700 MCQ, with the whole subtitle file"),
    SplitConfig("longvideobench", "LongVideoBench",
                (Layout("json", "lvb_val.json", "longvideobench"), Layout("parquet", "validation-*.parquet", "longvideobench")),
                HubSource("longvideobench/LongVideoBench", "validation", ("lvb_val.json", "validation-*.parquet"),
                          ("videos.tar.part.*",), "datasets/longvideobench"),
                about="LongVideoBench validation, 1337 MCQ"),
    SplitConfig("lvbench", "LVBench",
                (Layout("hub", "data/train-*.parquet", "lvbench_hub"), Layout("publisher", "video_info.meta.jsonl", "lvbench")),
                HubSource("lmms-lab/LVBench", "train", ("data/*.parquet",), ("video_chunks/*.zip",), "lvbench"),
                duration_buckets=[1800, 3600], about="LVBench, 1549 MCQ on 30-140 min videos"),
    SplitConfig("mlvu", "MLVU",
                (Layout("hub", "mlvu/test-*.parquet", "mlvu_hub"), Layout("publisher", "MLVU/json", "mlvu")),
                HubSource("sy1998/MLVU_dev", "test", ("mlvu/*.parquet",), ("video_part_*.zip", "action_count.zip"), "mlvu"),
                duration_buckets=[180, 600], about="MLVU dev, multiple-choice tasks (~2200)"),
    SplitConfig("mmvu", "MMVU", (Layout("hub", "validation.json", "mmvu"),),
                HubSource("yale-nlp/MMVU", "validation", ("validation.json",), ("videos/**",), "mmvu"),
                about="MMVU validation, 1000 MCQ + open-ended"),
    SplitConfig("charades_sta", "Charades-STA",
                (Layout("hub", "data/test-*.parquet", "charades_hub"), Layout("publisher", "charades_sta_test.txt", "charades")),
                HubSource("lmms-lab/charades_sta", "test", ("data/*.parquet",), ("Charades_v1_480_part_*.zip",), "charades_sta"),
                metric="temporal", about="Charades-STA test, 3720 grounding queries (mIoU, R@0.3/0.5/0.7)"),
    SplitConfig("synthetic", "synthetic", (Layout("project", "paravt_eval_synth.parquet", "synthetic"),),
                duration_buckets=[60, 90], about="the tiny synthetic world (materialized by the quickstart)"),
]}
#: Hub ids accepted in place of split names (the id of Video-MME names the split without subtitles).
HUB_IDS: dict[str, str] = {}
for _s in SPLITS.values():
    if _s.hub is not None:
        HUB_IDS.setdefault(_s.hub.repo_id, _s.name)

#: Public sample counts of the paper's splits (the driver warns when a load differs): Video-MME
#: 900 videos x 3 questions, LongVideoBench validation, LVBench, MLVU dev multiple choice
#: (approximate: the release reads the sy1998/MLVU_dev copy), MMVU validation, Charades-STA test.
EXPECTED_COUNTS: dict[str, tuple[int, float]] = {  # split -> (count, relative tolerance)
    "videomme": (2700, 0.0), "videomme_sub": (2700, 0.0), "longvideobench": (1337, 0.0), "lvbench": (1549, 0.0),
    "mlvu": (2200, 0.05), "mmvu": (1000, 0.0), "charades_sta": (3720, 0.0),
}


def count_check(split: str, loaded: int) -> str | None:
    """A warning text when ``loaded`` differs from the split's public count, else None."""
    if split not in EXPECTED_COUNTS:
        return None
    n, tol = EXPECTED_COUNTS[split]
    if abs(loaded - n) <= tol * n:
        return None
    return (f"{split}: loaded {loaded} samples, expected {'~' if tol else ''}{n} (public count); "
            "check the download (missing annotation files, a different version of the split)")


PAPER_SPLITS = ["videomme", "videomme_sub", "longvideobench", "lvbench", "mlvu", "mmvu", "charades_sta"]


def split_name(name: str) -> str:
    """A split name, or the Hub id of one (``lmms-lab/LVBench`` -> ``lvbench``)."""
    if name in SPLITS:
        return name
    if name in HUB_IDS:
        return HUB_IDS[name]
    raise ValueError(f"unknown split {name!r}; known: {sorted(SPLITS)} or the Hub ids {sorted(HUB_IDS)}")


def splits_table() -> str:
    """The --help table of valid splits: name, Hub id, what it reads."""
    lines = ["splits (name, or its Hub id; read from data_root/<dir>, else the Hugging Face cache):"]
    for s in SPLITS.values():
        hub = f"{s.hub.repo_id} ({s.hub.split})" if s.hub else "-"
        anns = " | ".join(lay.annotation for lay in s.layouts)
        lines.append(f"  {s.name:<15} {hub:<40} {s.dir}/{{{anns}}}  {s.about}")
    return "\n".join(lines)


_SHARD = re.compile(r"^(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})(?P<ext>\.\w+)$")


def check_shards(hits: list[Path]) -> None:
    """Hub shards are named ``<split>-00000-of-00003.parquet``: every one of them must be here."""
    groups: dict[tuple[str, str, int], set[int]] = {}
    for h in hits:
        m = _SHARD.match(h.name)
        if m:
            groups.setdefault((str(h.parent / m["stem"]), m["ext"], int(m["n"])), set()).add(int(m["i"]))
    for (stem, ext, n), have in groups.items():
        missing = [i for i in range(n) if i not in have]
        if missing:
            names = ", ".join(f"{Path(stem).name}-{i:05d}-of-{n:05d}{ext}" for i in missing[:3])
            from paravt.data.schema import DataError  # noqa: PLC0415
            raise DataError(f"{Path(stem).parent}: {len(missing)} of {n} shard(s) missing ({names}"
                             f"{', ...' if len(missing) > 3 else ''}); download the split again")


def find_layout(c: SplitConfig, root: Path) -> tuple[Layout, Path | list[Path]] | None:
    """The first of the split's layouts whose annotation is under ``root``: one path, or every
    shard of a glob (``test-*.parquet``) in order, checked complete by :func:`check_shards`."""
    for lay in c.layouts:
        if any(ch in lay.annotation for ch in "*?["):
            hits = sorted(root.glob(lay.annotation))
            if hits:
                check_shards(hits)
                return lay, hits if len(hits) > 1 else hits[0]
        elif (root / lay.annotation).exists():
            return lay, root / lay.annotation
    return None


def card_num_examples(root: Path, split: str) -> int | None:
    """``num_examples`` of ``split`` in the dataset card's ``dataset_info`` (a Hub snapshot's README.md),
    or None when the card does not say."""
    card = root / "README.md"
    if not card.is_file():
        return None
    text = card.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return None
    import yaml  # noqa: PLC0415 - PyYAML comes with hydra/omegaconf

    try:
        meta = yaml.safe_load(text.split("---", 2)[1]) or {}
    except yaml.YAMLError:
        return None
    infos = meta.get("dataset_info") or []
    counts = [sp.get("num_examples") for info in (infos if isinstance(infos, list) else [infos]) if isinstance(info, dict)
              for sp in info.get("splits") or [] if isinstance(sp, dict) and sp.get("name") == split]
    counts = [n for n in counts if isinstance(n, int)]
    return counts[0] if len(counts) == 1 else None


def media_roots(c: SplitConfig, snapshot: Path, media_root: str | None = None) -> list[Path]:
    """Where a Hub copy's videos are looked up: an explicit folder, the extraction folder
    (``$HF_HOME/<media dir>``), the release's own MLVU folder, then the snapshot itself."""
    out = [Path(media_root).expanduser()] if media_root else []
    if c.hub is not None:
        out.append(hf_home() / c.hub.media_dir)
        if c.name == "mlvu":
            out.append(hf_home() / "MLVU" / "video")  # the release's PARAVT_MLVU_VIDEO_DIR default
    return out + [snapshot]


def check_sample(s: BenchmarkItem, c: SplitConfig) -> str | None:
    """Why a loaded row is wrong (it is then dropped and counted), or None."""
    if s.question_type == "mcq":
        if not s.options:
            return "no options"
        if any(not o for o in s.options):
            return "an empty option"
        if any(LETTER_PREFIX.match(o) for o in s.options):
            return "an option carries another letter (doubled or shuffled letters)"
        if not (isinstance(s.answer, str) and len(s.answer) == 1 and s.answer in LETTERS[:len(s.options)]):
            return "gold letter not among the options"
        return None
    if s.question_type == "tvg":
        a = s.answer
        if not (isinstance(a, (list, tuple)) and len(a) == 2 and all(isinstance(t, (int, float)) for t in a)):
            return "span is not [start, end]"
        if not all(math.isfinite(t) for t in a) or a[0] < 0 or a[1] <= a[0]:
            return "span is not 0 <= start < end"
        return None
    if s.question_type == "oe":
        return None if str(s.answer or "").strip() else "no answer text"
    return f"unknown question type {s.question_type!r}"


@dataclass
class LoadReport:
    split: str
    where: str  # folder (and Hub id) the annotation came from
    layout: str
    dropped: Counter = field(default_factory=Counter)  # reason -> rows
    first_dropped: dict[str, str] = field(default_factory=dict)  # reason -> first row id
    missing_video: int = 0
    missing_subtitle: int = 0

    def line(self, loaded: int) -> str:
        out = f"{self.split}: loaded {loaded} samples ({self.layout} layout, {self.where})"
        if self.dropped:
            out += "; dropped " + ", ".join(f"{n} ({r}; first {self.first_dropped[r]})" for r, n in self.dropped.items())
        if self.missing_video:
            out += f"; {self.missing_video} without their video (kept, reported as missing_video)"
        if self.missing_subtitle:
            out += f"; {self.missing_subtitle} without a subtitle file"
        return out


def _resolve(c: SplitConfig, data_root: str | Path, path_override: str | None, hub: Any) -> tuple[Roots, Layout, Path]:
    looked = []
    source = getattr(hub, "source", "auto")
    if path_override or source != "hub" or c.hub is None:
        root = Path(path_override) if path_override else Path(data_root) / c.dir
        hit = find_layout(c, root)
        if hit:
            return Roots(root, [root], "local"), hit[0], hit[1]
        looked.append(f"{root}/{{{', '.join(lay.annotation for lay in c.layouts)}}}")
    if c.hub is not None and not path_override and source != "local":
        try:
            if getattr(hub, "download", False):  # first use: download and extract like python -m paravt.eval.fetch
                snap = prepare(c, download=True, cache_dir=getattr(hub, "cache_dir", None),
                               media_root=getattr(hub, "media_root", None), progress=getattr(hub, "progress", True))
            else:
                snap = snapshot(c, download=False, cache_dir=getattr(hub, "cache_dir", None))
        except HubUnavailable as exc:
            looked.append(f"the Hugging Face cache: {exc}")
        else:
            hit = find_layout(c, snap)
            if hit:
                return Roots(snap, media_roots(c, snap, getattr(hub, "media_root", None)), "hub"), hit[0], hit[1]
            looked.append(f"{c.hub.repo_id} snapshot {snap} has none of {[lay.annotation for lay in c.layouts]}")
    how = (f"python -m paravt.eval.fetch {c.name}" if c.hub else "python -m paravt.data.materialize / the quickstart")
    raise FileNotFoundError(f"split {c.name}: annotation not found; looked in " + "; ".join(looked)
                            + f" (download: {how}, or pass split_paths.{c.name}=DIR)")


def load_split(name: str, data_root: str | Path, path_override: str | None = None, hub: Any = None,
               report: list[LoadReport] | None = None) -> list[BenchmarkItem]:
    """The checked samples of one split (see the module docstring for where it is looked up).
    ``hub``: an object with ``source`` (auto | local | hub), ``download``, ``cache_dir``,
    ``media_root`` (the eval config's ``hub``); ``report`` gets the LoadReport appended."""
    c = SPLITS[split_name(name)]
    roots, layout, ann = _resolve(c, data_root, path_override, hub)
    try:
        samples = LOADERS[layout.loader](c, roots, ann)
    except (KeyError, TypeError, ValueError, AttributeError, OSError) as exc:
        from paravt.data.schema import DataError  # noqa: PLC0415
        first = ann[0] if isinstance(ann, list) else ann
        what = f"missing column {exc}" if isinstance(exc, KeyError) else " ".join(f"{type(exc).__name__}: {exc}".split())
        raise DataError(f"split {c.name}: {first}{f' (+{len(ann) - 1} shards)' if isinstance(ann, list) else ''}: "
                        f"cannot read it as the {layout.name} layout ({what[:300]})") from None
    if c.hub is not None and layout.name == "hub" and any(ch in layout.annotation for ch in "*?["):
        known = card_num_examples(roots.ann, c.hub.split)
        shards = ann if isinstance(ann, list) else [ann]
        if known is not None and all(p.suffix == ".parquet" for p in shards):
            n_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in shards)
            if n_rows != known:
                from paravt.data.schema import DataError  # noqa: PLC0415
                raise DataError(f"split {c.name}: {n_rows} rows in {len(shards)} shard file(s) under {roots.ann}, but "
                                f"the dataset card says {known}; download the split again")
    where = f"{c.hub.repo_id} at {roots.ann}" if roots.source == "hub" else str(roots.ann)
    rep = LoadReport(c.name, where, layout.name)
    good = []
    for s in samples:
        why = check_sample(s, c)
        if why:
            rep.dropped[why] += 1
            rep.first_dropped.setdefault(why, s.id)
            continue
        rep.missing_video += not s.video_exists
        rep.missing_subtitle += bool(c.subtitles and s.subtitle and not Path(s.subtitle).is_file())
        good.append(s)
    if rep.dropped:
        log.warning(rep.line(len(good)))
    if report is not None:
        report.append(rep)
    return good


def read_srt(path: str | Path, max_chars: int | None = None) -> str:
    """The whole subtitle text of an .srt file, one cue line per line (indices, timestamps and
    markup dropped), as the authors pass it for Video-MME with subtitles (the split that carries
    the headline 69.4). ``max_chars`` cuts it (off by default)."""
    p = Path(path)
    if not p.is_file():
        return ""
    lines = []
    for block in re.split(r"\n\s*\n", p.read_text(encoding="utf-8", errors="replace").strip()):
        for ln in block.strip().splitlines()[2:]:  # [index, "a --> b", text...]
            ln = re.sub(r"<[^>]+>", "", ln).strip()
            if ln:
                lines.append(ln)
    text = "\n".join(lines)
    return text[:max_chars] if max_chars else text
