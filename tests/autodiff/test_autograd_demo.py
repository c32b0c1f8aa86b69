"""The digits MLP demo trains to >= 95% test accuracy and writes its loss curve."""
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

from kina_fx.demos import mlp as demo_mlp  # noqa: E402


def test_demo_reaches_95_percent_and_writes_png(tmp_path, capsys):
    out = tmp_path / "loss.png"
    assert demo_mlp.main(["--no-progress", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    assert "test accuracy" in text
    accuracy = float(text.split("test accuracy ")[1].split("%")[0])
    assert accuracy >= 95.0


@pytest.mark.integration
def test_compiled_forward_demo_matches_the_python_one(tmp_path, capsys):
    """The MLIR-compiled forward + tape trains like the Python version (>= 95%)."""
    from kina_fx import compiled
    from kina_fx.demos import compiled as demo_compiled

    if compiled.missing_mlir_tools():
        pytest.skip(f"missing {compiled.missing_mlir_tools()}")
    out = tmp_path / "compiled.png"
    assert demo_compiled.main(["--no-progress", "--epochs", "25", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    compiled_acc = float(text.split("compiled forward + tape: test accuracy ")[1].split("%")[0])
    python_acc = float(text.split("Python forward: ")[1].split("%")[0])
    assert compiled_acc >= 95.0
    assert abs(compiled_acc - python_acc) <= 1.0
