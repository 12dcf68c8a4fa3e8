"""MkDocs hook (mkdocs.yml `hooks:`): fills the recipe schema page from the
schema itself (hvdkeras/recipes/schema_doc.py), so the page cannot drift."""

from __future__ import annotations

from hvdkeras.recipes.schema_doc import schema_markdown

PLACEHOLDER = "<!-- recipe-schema -->"
PAGE = "recipe-schema.md"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if PLACEHOLDER not in markdown:
        raise ValueError(f"docs/{PAGE} lost its {PLACEHOLDER} line; the schema goes there")
    return markdown.replace(PLACEHOLDER, schema_markdown())
