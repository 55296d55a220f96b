"""Where the tests find the repository: its root and the tests' own folder (a test module
sits one level down, in the folder of its group)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
