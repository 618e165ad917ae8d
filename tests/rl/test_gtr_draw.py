"""GTR's side of the trainer interface: it is given a callable for a prompt's overview images and
returns the step's SFT samples; it never reaches into the rollout worker or the trainer."""

from paravt.core.config import load_config
from paravt.rl.config import RLConfig
from paravt.rl.gtr import GTR, Correction


def test_draw_returns_sft_samples_with_images_from_the_callable_it_was_given():
    cfg = load_config(RLConfig, "configs/rl/tiny_gtr.yaml", ["model_path=m", "train_data=[x.parquet]"])
    gtr = GTR(cfg, processor=None, is_main=False)
    asked = []

    def images_of(sample_id: str, k: int):
        asked.append((sample_id, k))
        return ["frame"] * k if sample_id == "known" else None

    gtr.attach(images_of)
    kept = Correction("known", 2, 0, 0, [1, 2, 3], [0, 1, 1], 2, "t")  # images gone, as after a resume
    gone = Correction("unknown", 2, 0, 0, [1, 2], [0, 1], 2, "t")  # a prompt the callable does not know
    text = Correction("text", 4, 0, 0, [5, 6], [0, 1], 0, "t")  # no image in its prefix: nothing to resolve
    out = gtr.draw([kept, gone, text], step=0, n_rl=3)
    assert [s.input_ids for s in out] == [[1, 2, 3], [5, 6]] and all(s.kind == "sft" for s in out)
    assert out[0].images == ["frame", "frame"] and out[0].loss_mask == [0, 1, 1] and out[1].images is None
    assert asked == [("known", 2), ("unknown", 2)] and gtr.dropped_on_resume == 1
    cfg.gtr.mode = "observe"  # observe mode buffers the corrections and trains on none
    assert gtr.draw([], step=1, n_rl=3) == [] and len(gtr.buffer.items) == 3
