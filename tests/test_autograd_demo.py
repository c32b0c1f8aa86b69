"""The digits MLP demo trains to >= 95% test accuracy and writes its loss curve."""
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

from kina_fx import demo_mlp  # noqa: E402


def test_demo_reaches_95_percent_and_writes_png(tmp_path, capsys):
    out = tmp_path / "loss.png"
    assert demo_mlp.main(["--no-progress", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    assert "test accuracy" in text
    accuracy = float(text.split("test accuracy ")[1].split("%")[0])
    assert accuracy >= 95.0
