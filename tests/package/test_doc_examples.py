"""Every example in README.md and docs/*.md runs as written.

* Every ```python block (also ```py, ```python3) of a page runs, in order, in
  one namespace per page: the page's blocks are written to one module, each
  block at its own line numbers (the other lines left blank, so a traceback's
  line is the page's line), and that module is run by pytest in a fresh
  process in an empty directory.  Its import runs the blocks; test functions a
  page defines (docs/testing.md) are collected and must pass.  Fragments not
  meant to run use another fence (```text).
* Every ```c block with a ``main`` is a complete program: compiled with gcc
  against the installed kina_fx (``kina-fx config --cflags --libs``) and run
  with an empty environment; it must exit 0.  Every ```mlir block with a
  ``func.func @main`` is lowered with kina_fx.compiled's pipeline, linked
  against libkina_fx.so and run the same way.  Other C and MLIR blocks are
  fragments of a program shown in full elsewhere (tests/hosts/).

Pages and blocks are discovered here, so a new page or block is covered
without touching this file.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kina_fx.compiled import MLIR_PIPELINE

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON = {"python", "py", "python3"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")


@dataclass
class Block:
    page: Path
    line: int          # the page's line number of the block's first code line
    lang: str
    code: str

    def __str__(self):
        return f"{self.page.relative_to(ROOT)}:{self.line} ({self.lang})"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order."""
    found = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        lang = (opening["info"].strip().split() or [""])[0].lower()
        body = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence))
                                      and not lines[i].strip().strip(fence[0])):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        found.append(Block(page, i - len(body) + 1, lang, "\n".join(body) + "\n"))
        i += 1
    return found


def python_pages() -> list[Path]:
    return [page for page in PAGES if any(b.lang in PYTHON for b in blocks(page))]


def page_module(page: Path) -> str:
    """The page's Python blocks as one module whose line numbers are the page's."""
    lines = [f"# the ```python blocks of {page.relative_to(ROOT)}, at the page's line numbers"]
    for block in (b for b in blocks(page) if b.lang in PYTHON):
        lines += [""] * (block.line - 1 - len(lines))
        lines += block.code.splitlines()
    return "\n".join(lines) + "\n"


def test_the_examples_are_found():
    """The discovery itself: blocks of every kind are seen where they are known to be."""
    every = [b for page in PAGES for b in blocks(page)]
    assert sum(b.lang in PYTHON for b in every) >= 15
    assert {"README.md", "effects.md", "testing.md", "autograd.md"} <= {
        b.page.name for b in every if b.lang in PYTHON}
    assert [b for b in every if is_c_program(b)], "no complete C program in the docs"
    assert [b for b in every if is_mlir_program(b)], "no complete MLIR program in the docs"
    # a block's first line is where the page has it (a block in a list item is indented there)
    for b in every:
        page_line = b.page.read_text().splitlines()[b.line - 1:][:1]
        assert [line.strip() for line in page_line] == [line.strip() for line in b.code.splitlines()[:1]]


# The page's blocks run as the __main__ module (as a reader's script would),
# compiled under the page's own name: a traceback names the page and shows its lines.
RUN_AS_THE_PAGE = """
import sys, types
page, path = sys.argv[1:]
main = sys.modules["__main__"] = types.ModuleType("__main__")
main.__file__ = page
exec(compile(open(path).read(), page, "exec"), main.__dict__)
"""


@pytest.mark.parametrize("page", python_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_python_examples_run_as_written(page, tmp_path):
    name = str(page.relative_to(ROOT))
    module = tmp_path / ("test_" + re.sub(r"\W", "_", name) + ".py")
    module.write_text(page_module(page))
    result = subprocess.run([sys.executable, "-W", "error::DeprecationWarning:__main__", "-c", RUN_AS_THE_PAGE,
                             str(page), str(module)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    if result.returncode:
        pytest.fail(f"the Python examples of {name} fail:\n{result.stderr}", pytrace=False)
    if re.search(r"^(async )?def test_", module.read_text(), re.M):
        # The page's test functions (with kina_fx's pytest plugin, as a user runs them).
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
             str(module)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        if result.returncode:
            pytest.fail(f"the tests in the examples of {name} fail:\n{result.stdout}", pytrace=False)


# --- complete C and MLIR programs -----------------------------------------------------

def is_c_program(block: Block) -> bool:
    return block.lang == "c" and re.search(r"\bint\s+main\s*\(", block.code) is not None


def is_mlir_program(block: Block) -> bool:
    return block.lang == "mlir" and "func.func @main" in block.code


def programs(predicate) -> list[Block]:
    return [b for page in PAGES for b in blocks(page) if predicate(b)]


def kina_fx_config(*flags: str) -> list[str]:
    script = Path(sys.executable).parent / "kina-fx"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kina_fx.cli"]
    return subprocess.run(cmd + ["config", *flags], check=True, capture_output=True,
                          text=True).stdout.split()


def build(cmd: list) -> None:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300)
    if result.returncode:
        pytest.fail(f"{' '.join(map(str, cmd))}\n{result.stdout}{result.stderr}", pytrace=False)


def run_clean(exe: Path, block: Block) -> None:
    """Run with an empty environment (env -i), as docs/install.md says a host runs."""
    result = subprocess.run(["env", "-i", str(exe)], capture_output=True, text=True, timeout=300)
    if result.returncode:
        pytest.fail(f"{block} exited {result.returncode}:\n{result.stdout}{result.stderr}", pytrace=False)


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    return path


@pytest.mark.integration
@pytest.mark.parametrize("block", programs(is_c_program), ids=str)
def test_c_programs_compile_and_run(block, tmp_path):
    source, exe = tmp_path / "program.c", tmp_path / "program"
    source.write_text(f'#line {block.line} "{block.page.relative_to(ROOT)}"\n' + block.code)
    build([tool("gcc"), "-O2", "-Wall", "-Werror", source, *kina_fx_config("--cflags", "--libs"),
           "-lm", "-o", exe])
    run_clean(exe, block)


@pytest.mark.integration
@pytest.mark.parametrize("block", programs(is_mlir_program), ids=str)
def test_mlir_programs_compile_and_run(block, tmp_path):
    source, lowered = tmp_path / "program.mlir", tmp_path / "program.llvm.mlir"
    ll, obj, exe = tmp_path / "program.ll", tmp_path / "program.o", tmp_path / "program"
    source.write_text(block.code)
    build([tool("mlir-opt-19"), source, *MLIR_PIPELINE, "-o", lowered])
    build([tool("mlir-translate-19"), "--mlir-to-llvmir", lowered, "-o", ll])
    build([tool("clang-19"), "-c", "-O2", "-Wno-override-module", ll, "-o", obj])
    build([tool("clang-19"), obj, *kina_fx_config("--libs"), "-lm", "-o", exe])
    run_clean(exe, block)
