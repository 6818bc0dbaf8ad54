"""DropMatch Studio: speculative decoding with MC-dropout acceptance, instrumented.

Data flows one way: models -> (drafting, verifying) -> engine -> traces -> metrics/plots -> UI
(docs/architecture.md walks a run through the modules). Nothing heavy is imported here.
"""

__version__ = "0.5.0"  # the same as pyproject.toml's (tests/test_house.py checks)
