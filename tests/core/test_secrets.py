"""`.secrets.env` read by the Python entry points as the launch scripts source it."""

from paravt.core.secrets import load_secrets


def test_secrets_fill_what_the_environment_lacks(tmp_path, monkeypatch):
    f = tmp_path / ".secrets.env"
    f.write_text("# a comment\nHF_TOKEN=hf_abc\nWANDB_API_KEY=\nPARAVT_JUDGE_API_KEY='k y'\nexport PARAVT_X=1\n")
    for k in ("HF_TOKEN", "WANDB_API_KEY", "PARAVT_JUDGE_API_KEY", "PARAVT_X"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PARAVT_JUDGE_API_KEY", "from-env")
    assert sorted(load_secrets(f)) == ["HF_TOKEN", "PARAVT_X"]
    import os
    assert os.environ["HF_TOKEN"] == "hf_abc" and os.environ["PARAVT_X"] == "1"
    assert os.environ["PARAVT_JUDGE_API_KEY"] == "from-env"  # the environment wins
    assert "WANDB_API_KEY" not in os.environ  # an empty value is not exported
    assert load_secrets(tmp_path / "absent.env") == []
