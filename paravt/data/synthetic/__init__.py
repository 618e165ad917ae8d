"""The synthetic long-video world of the embedded default.

``python -m paravt.data.synthetic --out DIR [--seed S]`` writes, deterministically:

* real mp4 videos (H.264, 64×64, 2 fps, 40–120 s) under ``DIR/media/`` in two of the released
  buckets (``selfqa/`` and ``longvt_source/synthetic/``): dark scenes whose background
  changes at scene cuts, a small grey square drifting all the time (a distractor), and 1–3
  short **events**: a coloured shape (circle / square / triangle, one of eight colours)
  visible for 2–4 s at a random time;
* parquets in the released schemas with **sentinel-relative** paths under ``DIR/parquet/``:
  ``paravt_sft_synth.parquet`` (expert main-agent trajectories and sub-agent examples),
  ``paravt_perception_synth.parquet`` (sub-agent examples on 1-4 s windows: the tiny model's
  visual pretraining, see :func:`.rows.short_window_rows`),
  ``paravt_reading_synth.parquet`` (text only: reports then a question, answered by looking the
  reports up; the tiny main agent's reading lessons, see :func:`.rows.reading_rows`),
  ``paravt_rl_synth.parquet`` (RL prompts) and ``paravt_eval_synth.parquet`` (held-out videos);
* ``DIR/world.json`` (every video's script) and ``DIR/world_stats.json`` (sizes, and how often
  the asked event is visible in a K-frame overview: the Tool Necessity Gap).

Questions (one of each per event): ``mcq`` "What colour is the triangle?" with options A–D,
``oe`` the same question answered with a word, ``tvg`` "When does the red triangle appear?"
answered with ``[start, end]``. An event of 2–4 s is always caught by 64 overview frames of a
≤120 s video (spacing ≤ 1.9 s) and usually missed by 4 (spacing 10–30 s); a crop of the
right window at 1 fps always shows it. So tools are needed at small K and not at large K.

Expert trajectories follow the paper's §3.1: ``<think>`` → either an ``<answer>`` (event seen in
the overview) or several parallel ``crop_video`` calls in ONE turn covering the video →
``<tool_response>`` summaries → answer; temporal questions take a second, finer round.

Modules: :mod:`.world` (config, specs, questions), :mod:`.render` (frames, mp4),
:mod:`.traces` (expert traces), :mod:`.rows` (the parquet rows), :mod:`.writer` (``build_world``).
"""
