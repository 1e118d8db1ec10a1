import json

import pytest

from svdmlp.evaluate import datasets


def _jsonl(path, column, rows):
    path.write_text("".join(json.dumps({column: r}) + "\n" for r in rows))
    return path


def test_wikitext_protocol_on_a_local_file(tmp_path):
    path = _jsonl(tmp_path / "wiki.jsonl", "text", [" = Title = ", "", " body one ", " body two "])
    assert datasets.load_text("wikitext2", str(path)) == " = Title = \n\n\n\n body one \n\n body two "


def test_ptb_joins_sentences_with_spaces(tmp_path):
    pd = pytest.importorskip("pandas")
    path = tmp_path / "ptb.parquet"
    pd.DataFrame({"sentence": ["a b <unk>", "c d"]}).to_parquet(path)
    assert datasets.load_text("ptb", str(path)) == "a b <unk> c d"


def test_c4_keeps_the_first_2000_documents(tmp_path):
    path = _jsonl(tmp_path / "c4.json", "text", [f"doc{i}" for i in range(2005)])
    text = datasets.load_text("c4", str(path))
    assert text.split(" ") == [f"doc{i}" for i in range(2000)]


def test_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="unknown perplexity set 'lambada'"):
        datasets.load_text("lambada")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        datasets.load_text("wikitext2", str(tmp_path / "missing.jsonl"))
    wrong = _jsonl(tmp_path / "wrong.jsonl", "body", ["x"])
    with pytest.raises(ValueError, match="expected a 'text' column"):
        datasets.load_text("wikitext2", str(wrong))
    with pytest.raises(ValueError, match="cannot read"):
        (tmp_path / "x.xml").write_text("<a/>")
        datasets.load_text("wikitext2", str(tmp_path / "x.xml"))


def test_hub_sets_fail_offline_with_one_clear_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(
        ValueError, match=r"could not load perplexity set 'wikitext2' \(wikitext from the Hugging Face hub\)"
    ):
        datasets.load_text("wikitext2")
