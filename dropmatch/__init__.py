"""DropMatch Studio: speculative decoding with MC-dropout acceptance, instrumented.

Data flows one way: models -> engine -> traces -> metrics/plots -> UI.
Nothing heavy is imported here.
"""

__version__ = "0.1.0"
