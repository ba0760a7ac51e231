"""Subcommands of the ``torchstage`` command: one module each, exposing ``add_parser(subparsers)``."""
