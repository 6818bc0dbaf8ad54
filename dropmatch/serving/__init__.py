"""Serving DropMatch outside the Studio: its vLLM integration (vllm/), over the method's verify step for a
server's batch (decoding/server_rounds.py)."""
