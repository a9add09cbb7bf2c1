"""Kept for bench/load, which puts tests/integration on sys.path and imports
`gateway_fixture`. The code lives in tests/lib (gateway.py, shim.py,
procs.py); tests import it from there."""

import sys
from pathlib import Path

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from tests.lib.gateway import Gateway, start_gateway  # noqa: E402
from tests.lib.shim import start_shim  # noqa: E402

__all__ = ["Gateway", "start_gateway", "start_shim"]
