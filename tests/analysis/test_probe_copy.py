"""The probe's copying metric on the real tokenizer, with two reference predictors: a perfect
induction rule (continue the earlier position with the longest matching context) and a bigram rule
that never looks further back than one token."""

from types import SimpleNamespace

import torch

from paravt.data.synthetic.world import WorldConfig
from paravt.analysis.probe import copy_stats


class _Rule(torch.nn.Module):
    def __init__(self, vocab: int, induction: bool):
        super().__init__()
        self.vocab, self.induction = vocab, induction

    def forward(self, input_ids):
        ids = input_ids[0].tolist()
        logits = torch.zeros(1, len(ids), self.vocab)
        for i, t in enumerate(ids):
            nxt = 0
            if self.induction:  # continue the earlier position whose preceding context matches longest
                def match(j):
                    k = 0
                    while k <= j and ids[j - k] == ids[i - k]:
                        k += 1
                    return k
                best = max(range(i), key=lambda j: (match(j), j), default=None)
                if best is not None and match(best):
                    nxt = ids[best + 1]
            logits[0, i, nxt] = 1.0
        return SimpleNamespace(logits=logits)


def test_copy_stats_separates_induction_from_local_prediction(tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cfg = WorldConfig(seed=0)
    ind = copy_stats(_Rule(len(tok), True), tok, cfg, n=10)
    loc = copy_stats(_Rule(len(tok), False), tok, cfg, n=10)
    assert ind["repeat_acc"] > 0.9 and ind["repeat_gain"] > 0.5
    assert loc["repeat_acc"] == loc["first_acc"] == 0.0 and loc["repeat_gain"] == 0.0
    assert copy_stats(_Rule(len(tok), True), tok, cfg, n=10) == ind  # deterministic


def test_summary_hits_in_both_report_wordings():
    """The perception probe scores a summary the same in either world wording (a shape_first world
    scored 0% colour+shape before: the check only knew "yellow circle")."""
    from paravt.data.synthetic.traces import sighting
    from paravt.analysis.probe import summary_hits

    for wording in ("colour_first", "shape_first"):
        right = sighting("circle", "yellow", [14.0, 17.0], wording)
        assert summary_hits(right, "yellow", "circle") == {"colour": True, "colour_shape": True, "says_empty": False}
        wrong = sighting("square", "yellow", [14.0], wording) + " " + sighting("circle", "red", [20.0], wording)
        assert summary_hits(wrong, "yellow", "circle") == {"colour": True, "colour_shape": False, "says_empty": False}
        assert summary_hits(wrong, "red", "circle") == {"colour": False, "colour_shape": True, "says_empty": False}
    assert summary_hits("From 1.0 to 8.0 seconds no coloured shape is visible.", "red", "circle")["says_empty"]
