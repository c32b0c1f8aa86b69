"""docs/autograd.md's op table is the registry's (python -m kina_fx.autograd.optable)."""
from kina_fx.autograd import optable


def test_the_op_table_in_the_docs_is_up_to_date():
    assert optable.current() == optable.render(), \
        "docs/autograd.md is out of date: run python -m kina_fx.autograd.optable"


def test_the_table_lists_every_builtin_op_and_numpy_mapping():
    text = optable.render()
    for name in optable.builtin_ops():
        assert f"| `{name}` |" in text
    assert "`np.dot` -> `dot`" in text and "`np.concatenate`" in text
    assert optable.main(["--check"]) == 0


def test_the_typing_stub_declares_every_builtin_op():
    assert optable._read(optable.STUB) == optable.render_stub(), \
        "kina_fx/autograd/_op_signatures.pyi is out of date: run python -m kina_fx.autograd.optable"
    stub = optable.render_stub()
    for name in optable.builtin_ops():
        assert f"\ndef {name}(" in stub
