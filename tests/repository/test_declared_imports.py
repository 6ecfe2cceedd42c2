"""Every chapter runs with only what pargrad declares (a reader on Colab has no book tools).

The library (``pargrad/*.py``) may import the standard library, pargrad
itself and pargrad's dependencies (pyproject.toml's ``dependencies``: what
``pip install pargrad`` brings); the book's modules (``pargrad/book``) and
the chapters also what the ``book`` extra declares (``pip install
"pargrad[book]"``, the chapters' Colab setup cell) and what Colab provides
(COLAB_PROVIDES); anything else only inside a ``try`` that catches
ImportError (an optional extra, such as myst_nb's glue for the rendered
book).  ``make test-colab`` runs the chapters for real in such an
environment.
"""

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("*.py"))
LIBRARY = sorted((ROOT / "pargrad").glob("*.py"))
BOOK = sorted((ROOT / "pargrad" / "book").rglob("*.py"))
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# Preinstalled on a Colab runtime beside TensorFlow: PyTorch (the TF1
# accumulation chapter compares with it, and falls back without it).
COLAB_PROVIDES = {"torch"}


def distribution_names(requirements):
    return {_normal(re.split(r"[ <>=!~;\[]", requirement, maxsplit=1)[0])
            for requirement in requirements}


def declared_modules(requirements):
    """Import names of the distributions ``requirements`` name, plus pargrad."""
    wanted = distribution_names(requirements)
    names = {"pargrad"}
    for module, distributions in importlib.metadata.packages_distributions().items():
        if any(_normal(d) in wanted for d in distributions):
            names.add(module)
    missing = wanted - {_normal(d) for ds in importlib.metadata.packages_distributions().values()
                        for d in ds}
    assert not missing, f"declared but not installed here: {missing}"
    return names


def _normal(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def required_imports(path):
    """Top-level module names ``path`` imports outside a try that catches ImportError."""
    tree = ast.parse(path.read_text(), str(path))
    optional = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for child in node.body:
                optional.update(id(n) for n in ast.walk(child))
    names = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _catches_import_error(handler):
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id in ("ImportError", "ModuleNotFoundError")
               for k in kinds)


BASE = PROJECT["dependencies"]
BOOK_EXTRA = PROJECT["optional-dependencies"]["book"]
_ALLOWED = {}


def allowed(layer):
    """Module names a file of ``layer`` ("library" or "book") may import."""
    if layer not in _ALLOWED:
        requirements = BASE if layer == "library" else BASE + BOOK_EXTRA
        extra = set() if layer == "library" else COLAB_PROVIDES
        _ALLOWED[layer] = set(sys.stdlib_module_names) | declared_modules(requirements) | extra
    return _ALLOWED[layer]


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_library_imports_only_what_pip_install_pargrad_brings(path):
    undeclared = sorted(required_imports(path) - allowed("library"))
    assert not undeclared, (
        f"{path.relative_to(ROOT)} imports {undeclared}, which `pip install pargrad` does not "
        "bring: declare it in pyproject.toml's dependencies, or move the code into pargrad/book.")


@pytest.mark.parametrize("path", CHAPTERS + BOOK, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_are_declared_or_on_colab(path):
    undeclared = sorted(required_imports(path) - allowed("book"))
    assert not undeclared, (
        f"{path.relative_to(ROOT)} imports {undeclared}, which neither the standard library, "
        "pargrad's dependencies and its book extra (pyproject.toml) nor Colab provide: a reader "
        "on Colab would stop there. Declare it in the book extra, import it inside "
        "try/except ImportError with a fallback, or use pargrad.book.glue instead of myst_nb's glue.")


def test_pip_install_pargrad_brings_only_what_the_library_imports():
    """Every base dependency is imported by some library module: none rides along for the book."""
    imported = set().union(*(required_imports(path) for path in LIBRARY))
    unused = sorted(name for name in distribution_names(BASE)
                    if not (declared_modules([name]) - {"pargrad"}) & imported)
    assert not unused, f"no library module imports {unused}: move them to an extra"
    assert not distribution_names(BASE) & distribution_names(BOOK_EXTRA)


def test_the_check_sees_an_undeclared_import(tmp_path):
    page = tmp_path / "page.py"
    page.write_text("from myst_nb import glue\ntry:\n    import sphinx\nexcept ImportError:\n"
                    "    sphinx = None\nimport numpy\n")
    assert required_imports(page) - allowed("book") == {"myst_nb"}
    page.write_text("import matplotlib\nimport tqdm\n")
    assert required_imports(page) - allowed("library") == {"matplotlib"}
    assert required_imports(page) - allowed("book") == set()
