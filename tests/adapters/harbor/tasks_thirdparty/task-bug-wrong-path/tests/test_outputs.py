from pathlib import Path


def test_answer_is_42() -> None:
    assert Path("/app/anwser.txt").read_text().strip() == "42"
