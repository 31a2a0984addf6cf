"""The repository root's conftest: loads the skip accounting (tests/skip_accounting.py) into
every pytest run from here, `tests` and `bindings/python/tests` alike (pytest.ini makes this
directory the root of a run of any test under it)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))

pytest_plugins = ["skip_accounting"]
