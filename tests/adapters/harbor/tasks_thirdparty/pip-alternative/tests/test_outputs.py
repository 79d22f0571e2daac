from pathlib import Path


def test_answer_is_42() -> None:
    assert Path("/app/answer.txt").read_text().strip() == "42"
