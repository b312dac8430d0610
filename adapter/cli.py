"""Placeholder until this part's sub-commands land; registers nothing."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    return None
