"""`python -m enginefoundry.cli`."""

from enginefoundry.cli import entry

entry()
