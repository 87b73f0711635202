"""The helper's knowledge cards: checked on load, every cite a passage of the real sources (the installed torch, the
torch-npu wheel, opforge), and a card is what brings a question asked in a developer's words to its source."""
import json
import sqlite3
import zipfile
from pathlib import Path

import pytest
from registry_data import RegistryDataError, wheel
from typer.testing import CliRunner

from opforge.cli import app
from opforge.errors import InputError
from opforge.skills.helper import chunks, knowledge

runner = CliRunner()
CARD = """- id: {id}
  asks: [how many times may a function recompile]
  answer: recompile_limit caps it.
  cites: [{{corpus: torch, path: torch/_dynamo/config.py, symbol: torch._dynamo.config.recompile_limit}}]
"""


@pytest.mark.parametrize("text, where, what", [
    ("- id: a\n  asks: [x]\n  answer: y\n  cites: []\n", "t.yaml: card 1", "`cites`"),
    ("- id: a\n  asks: how\n  answer: y\n  cites: [{corpus: torch, path: p}]\n", "t.yaml: card 1", "`asks`"),
    ("- asks: [x]\n", "t.yaml: card 1", "`id`"),
    (CARD.format(id="a") + CARD.format(id="a"), "t.yaml: card 2", "another card"),
    ("- id: [unclosed\n", "t.yaml", "not YAML"),
])
def test_a_bad_card_is_named_with_its_file_and_place(tmp_path, text, where, what):
    (tmp_path / "t.yaml").write_text(text)
    with pytest.raises(InputError) as exc:
        knowledge.load(tmp_path)
    assert exc.value.where == where and what in exc.value.what


def test_the_shipped_cards_cover_the_topics_developers_ask_about():
    cards = knowledge.load()
    topics = {c["topic"] for c in cards}
    assert {"privateuse1", "custom_ops", "compile", "device_tests", "torch_npu"} <= topics
    assert len(cards) >= 200 and all(len(c["asks"]) >= 2 for c in cards)


def _symbols_in(path: str, source: str) -> set[str]:
    return {c.symbol for c in chunks.chunk(path, source)}


def test_every_torch_and_opforge_cite_is_a_passage_of_the_installed_sources():
    import torch

    import opforge

    roots = {"torch": Path(torch.__file__).resolve().parents[1],
             "opforge": Path(opforge.__file__).resolve().parent}
    missing = []
    for card in knowledge.load():
        for c in card["cites"]:
            if c["corpus"] not in roots:
                continue
            path = roots[c["corpus"]] / c["path"].removeprefix("opforge/")
            if c["corpus"] == "opforge" and c["path"] == "README.md":  # the checkout's, beside src/
                path = roots["opforge"].parents[1] / "README.md"
            if not path.is_file() or ("symbol" in c and c["symbol"] not in _symbols_in(c["path"], path.read_text())):
                missing.append(f"{card['id']}: {c['path']} {c.get('symbol', '')}")
    assert not missing


def test_every_torch_npu_cite_is_a_passage_of_the_wheel():
    try:
        zipped = zipfile.ZipFile(wheel())
    except RegistryDataError as exc:
        pytest.fail(str(exc))
    names = set(zipped.namelist())
    missing = []
    for card in knowledge.load():
        for c in card["cites"]:
            if c["corpus"] != "torch-npu":
                continue
            if c["path"] not in names or ("symbol" in c and c["symbol"] not in _symbols_in(
                    c["path"], zipped.read(c["path"]).decode("utf-8", "replace"))):
                missing.append(f"{card['id']}: {c['path']} {c.get('symbol', '')}")
    assert not missing


@pytest.fixture
def one_card(tmp_path, monkeypatch):
    """The knowledge base as one card, so the test weighs the mechanism, not the shipped cards of the day."""
    folder = tmp_path / "knowledge"
    folder.mkdir()
    (folder / "compile.yaml").write_text(CARD.format(id="recompile-limit").replace(
        "[how many times may a function recompile]",
        "[how many times may a function recompile before dynamo gives up, torch.compile falls back to eager after "
        "too many recompiles]"))
    monkeypatch.setattr(knowledge, "cards", lambda: tuple(knowledge.load(folder)))
    knowledge._card_index.cache_clear()
    yield
    knowledge._card_index.cache_clear()


def test_a_card_brings_a_question_in_task_words_to_the_setting_that_answers_it(tmp_path, monkeypatch, one_card):
    """Dynamo's config names the setting `recompile_limit`; a developer asks about falling back to eager. Indexed
    here: all of dynamo, whose recompilation code shares the question's words."""
    import shutil

    import torch

    root = Path(torch.__file__).resolve().parents[1]
    shutil.copytree(root / "torch" / "_dynamo", tmp_path / "src" / "torch" / "_dynamo",
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "i.sqlite"
    made = runner.invoke(app, ["helper", "index", "--corpus", str(tmp_path / "src"), "--index", str(path)])
    assert made.exit_code == 0, made.output
    db = sqlite3.connect(path)
    db.execute("UPDATE chunks SET corpus = 'torch'")  # a folder corpus is named by its path; cites name torch
    db.commit()
    question = "Dynamo keeps recompiling my function and then falls back to eager; how do I allow more recompiles?"
    found = json.loads(runner.invoke(app, ["helper", "ask", question, "--index", str(path), "--json"]).output)
    assert found["citations"][0]["symbol"] == "torch._dynamo.config.recompile_limit"
    assert found["knowledge"] == [{"id": "recompile-limit", "answer": "recompile_limit caps it."}]
    assert found["answer"].startswith("recompile_limit caps it.\n")
    monkeypatch.setattr(knowledge, "cards", lambda: ())
    knowledge._card_index.cache_clear()
    without = json.loads(runner.invoke(app, ["helper", "ask", question, "--index", str(path), "--json"]).output)
    assert without["citations"][0]["symbol"] != "torch._dynamo.config.recompile_limit" and not without["knowledge"]
