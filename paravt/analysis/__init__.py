"""What the runs mean, read from their outputs: the quickstart's report and its paired comparisons
(:mod:`~paravt.analysis.report`), what the sub-agents see (:mod:`~paravt.analysis.probe`), the across-seed
report (:mod:`~paravt.analysis.seeds`), the RL effects against fixed criteria (:mod:`~paravt.analysis.effects`)
and the settings each seed ran with (:mod:`~paravt.analysis.run_settings`).

The layer above the stages: it reads what eval, RL and SFT wrote; nothing a run executes imports it.
"""
