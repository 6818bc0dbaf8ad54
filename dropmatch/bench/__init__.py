"""The benchmark (python -m dropmatch.bench, console script dropmatch-bench), split by job:

    prompts.py   benchmark files of each kind, categories, scoring, input errors
    running.py   the variants and running them prompt by prompt (with the reference samples, peers)
    same_drafts.py  the comparison on the same drafts: lossless SD's drafts re-judged under every rule
    summary.py   pooled numbers, the reference band, frontier points, text tables
    cli.py       arguments, the run, the JSON / HTML / Markdown outputs
"""

from .cli import build_parser, main
from .prompts import BenchError, parse_file, read_prompts
from .running import PEERS, variants
from .summary import format_table, summarize_benchmark, within_reference

__all__ = ["BenchError", "PEERS", "build_parser", "format_table", "main", "parse_file",
           "read_prompts", "summarize_benchmark", "variants", "within_reference"]
