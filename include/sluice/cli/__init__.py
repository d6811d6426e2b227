"""Sluice's command-line tools (``python -m sluice <command>``) and the developer's embedded stack.

:mod:`sluice.cli.devserver` runs on the system Python before the virtualenv exists: this package imports nothing.
"""
