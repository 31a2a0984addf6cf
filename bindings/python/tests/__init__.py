"""Tests of the metfs Python package (a package, so that its conftest does not shadow others)."""
