"""The maintainers' commands (``python scripts/NAME.py``), run as files, not imported.

A package only so that import-linter (pyproject.toml) can hold their imports to the
contracts: like devenv/, they import no test tier.
"""
