"""The method: speculative decoding with lossy acceptance rules, needing only torch and transformers.

Flat on purpose, every import inside it relative to a sibling (`from .x import`) and nothing else of the
project: transformers' `generate(custom_generate=...)`, the vLLM plugin and the Hub folder take it whole
(`scripts/deploy_generate.py --stage` copies its modules as they are). The Studio stands around it.
"""
