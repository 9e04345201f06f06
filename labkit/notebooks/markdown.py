"""Text for a Markdown output that JupyterLab shows as written.

JupyterLab (and Colab, and Workbench) typesets anything between two dollar signs as LaTeX before
it parses the Markdown, so "$/epoch | Spot $/epoch" in a table header becomes one formula, the
header loses a column and the table is not drawn at all. Escaped dollars stay dollars.
"""

from __future__ import annotations


def literal(text: str) -> str:
    """`text` with every dollar sign escaped, so no part of it is read as math."""
    return text.replace("$", "\\$")
