"""Add 'Shown in the chapter "Title".' to the docstring of every pargrad function a chapter shows.

A chapter shows the package's code with ``show_source(obj)`` or
``show_lines(obj, ...)``; whoever edits ``obj`` should learn from its
docstring that a page reads it.  ``tests/repository/test_layout.py`` checks the mark;
this script adds the missing ones (run from the repository's root:
``PYTHONPATH=. .venv/bin/python tools/mark_shown_code.py``), then review the
diff.  Code outside pargrad (Keras's) is left alone.
"""

import ast
import builtins
import inspect
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def chapter_title(path):
    """The chapter's first markdown heading, ``# # Title``."""
    return next(line[4:].strip() for line in path.read_text().splitlines()
                if line.startswith("# # "))


def shown(path):
    """(expression, object) of each show_source/show_lines target of a chapter."""
    tree = ast.parse(path.read_text(), filename=str(path))
    namespace = {"__builtins__": builtins}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            try:
                exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"),
                     namespace)
            except ImportError:   # an optional import of the chapter
                pass
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and ast.unparse(node.func).split(".")[-1] in (
                "show_source", "show_lines"):
            target = ast.unparse(node.args[0])
            yield target, eval(target, namespace)


def definition(tree, qualname):
    """The ``def``/``class`` node of ``qualname`` (``Class.method``) in a module's tree."""
    node = tree
    for part in qualname.split("."):
        node = next(child for child in ast.iter_child_nodes(node)
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                    and child.name == part)
    return node


def mark(path, qualname, title):
    """Insert the sentence at the end of the docstring (or add one), reading the file afresh."""
    sentence = f'Shown in the chapter "{title}".'
    lines = path.read_text().splitlines(keepends=True)
    node = definition(ast.parse("".join(lines)), qualname)
    if sentence in " ".join((ast.get_docstring(node) or "").split()):
        return False
    body = node.body[0]
    indent = " " * body.col_offset
    if ast.get_docstring(node) is None:
        lines.insert(body.lineno - 1, f'{indent}"""{sentence}"""\n')
    elif lines[body.end_lineno - 1].strip() != '"""':   # text, then the closing quotes
        text = lines[body.end_lineno - 1].rstrip()
        lines[body.end_lineno - 1] = f'{text[:-3]}\n\n{indent}{sentence}\n{indent}"""\n'
    else:                                     # the closing quotes on a line of their own
        last = body.end_lineno - 1
        lines.insert(last, f"\n{indent}{sentence}\n" if lines[last - 1].strip() else
                     f"{indent}{sentence}\n")
    path.write_text("".join(lines))
    return True


def main():
    sys.path.insert(0, str(ROOT))
    wanted = []                               # first every target, then the edits
    for chapter in sorted((ROOT / "chapters").glob("*.py")):
        for target, obj in shown(chapter):
            obj = inspect.unwrap(obj)
            if getattr(obj, "__module__", "").startswith("pargrad"):
                path = pathlib.Path(inspect.getsourcefile(obj))
                wanted.append((chapter.name, target, path, obj.__qualname__,
                               chapter_title(chapter)))
    for chapter, target, path, qualname, title in wanted:
        if mark(path, qualname, title):
            print(f"{chapter}: marked {target} ({path.relative_to(ROOT)})")


if __name__ == "__main__":
    main()
