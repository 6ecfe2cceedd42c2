"""Read the book's settings that code needs: the repository address and branch."""

import pathlib

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent


def repository():
    """(url, branch) of the book's repository, from ``_config.yml``."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return config["repository"]["url"], config["repository"]["branch"]


def chapter_sources():
    """The percent-format sources of all chapters, sorted by name."""
    return sorted((ROOT / "chapters").glob("[0-9a-z]*.py"))


def setup_cell_source():
    """The first code cell of every chapter: install pargrad on Colab, nothing elsewhere."""
    url, branch = repository()
    return (
        "# On Colab: install pargrad and what its chapters need. Elsewhere: nothing to do.\n"
        "import sys\n"
        "\n"
        "if \"google.colab\" in sys.modules:\n"
        "    import subprocess\n"
        "\n"
        f"    REPOSITORY = \"{url}\"\n"
        "    subprocess.run(\n"
        f"        [sys.executable, \"-m\", \"pip\", \"install\", \"-q\", f\"pargrad[book] @ git+{{REPOSITORY}}@{branch}\"],\n"
        "        check=True,\n"
        "    )"
    )
