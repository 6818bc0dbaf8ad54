"""Serving DropMatch outside the Studio: the verification step of a batch of greedy requests
(verify.py, over the project's own verify step and rules) and its vLLM integration (vllm/)."""
