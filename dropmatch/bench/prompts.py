"""Benchmark prompts and their scoring: reading JSONL files of each kind, spreading a limit over
categories, scoring an answer where the kind has a score, and the CLI's one-line input errors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .. import quality
from ..quality import HUMANEVAL_PROMPT


class BenchError(Exception):
    """Bad benchmark input; printed as one line."""


@dataclass(frozen=True)
class Item:
    """One benchmark prompt: the text sent to the model and the record it came from."""
    prompt: str
    record: dict


def detect_kind(record: dict) -> str:
    if "entry_point" in record:
        return "humaneval"
    if "instruction_id_list" in record:
        return "ifeval"
    if "question" in record and "answer" in record:
        return "gsm8k"
    if "turns" in record:
        return "mt_bench"
    return "plain"


def prompt_of(record: dict, kind: str) -> str | None:
    if kind == "humaneval":
        return HUMANEVAL_PROMPT.format(prompt=record["prompt"])
    return record.get("prompt") or record.get("question") or (record.get("turns") or [None])[0]


def read_prompts(path: str, limit: int | None) -> tuple[str, list[Item]]:
    """(kind, items) of a JSONL file; BenchError with one line if it cannot be used.
    A limit keeps the first `limit` prompts, spread over the file's categories when its records
    have one (see spread_over_categories)."""
    file = Path(path)
    if not file.is_file():
        raise BenchError(f"prompt file not found: {path}")
    items, kind = [], None
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise BenchError(f"{path}:{number} is not a JSON line") from None
        if not isinstance(record, dict):
            raise BenchError(f"{path}:{number} is not a JSON object")
        kind = kind or detect_kind(record)
        prompt = prompt_of(record, kind)
        if not isinstance(prompt, str) or not prompt.strip():
            raise BenchError(f"{path}:{number} has no 'prompt', 'question' or 'turns'")
        items.append(Item(prompt, record))
    if not items:
        raise BenchError(f"{path} holds no prompts")
    return kind, spread_over_categories(items, limit)


SET_NAMES = {"gsm8k": "GSM8K", "mt_bench": "MT-Bench", "humaneval": "HumanEval", "ifeval": "IFEval"}


@dataclass(frozen=True)
class PromptSet:
    """The prompts of one file that a benchmark runs: its name (the file's stem), kind, the chosen
    items, and how many prompts the file holds (labels say how many of them ran)."""
    name: str
    kind: str
    items: list[Item]
    total: int

    def label(self, ran: int) -> str:
        """What ran, said as a reader counts it: "GSM8K test, 10 of 100"."""
        return f"{set_title(self.name)}, {ran} of {self.total}"


def set_title(stem: str) -> str:
    """A prompt file's stem as a set's name: a trailing count dropped, the known sets' own spelling
    ("gsm8k_test_100" -> "GSM8K test", "mt_bench" -> "MT-Bench", "multilingual_chat" -> "multilingual chat")."""
    words = stem.split("_")
    if len(words) > 1 and words[-1].isdigit():
        words = words[:-1]
    text = "_".join(words)
    for key, shown in SET_NAMES.items():
        text = text.replace(key, shown)
    return text.replace("_", " ")


def load_set(path: str, limit: int | None) -> PromptSet:
    """read_prompts's (kind, items) as a PromptSet, with the file's prompt count."""
    kind, items = read_prompts(path, None)
    return PromptSet(Path(path).stem, kind, spread_over_categories(items, limit), len(items))


def category_of(item: Item) -> str | None:
    category = item.record.get("category")
    return category if isinstance(category, str) and category else None


def spread_over_categories(items: list[Item], limit: int | None) -> list[Item]:
    """The first `limit` items, taken in turn from each category (in the order the categories
    first appear; file order within each), so that a sample of a file sorted by category (MT-Bench:
    ten writing questions, then ten roleplay, ...) covers them all. Items without a category:
    simply the first `limit`."""
    if limit is None or limit >= len(items):
        return items
    if any(category_of(item) is None for item in items):
        return items[:limit]
    queues: dict[str, list[Item]] = {}
    for item in items:
        queues.setdefault(category_of(item), []).append(item)
    chosen = []
    for rank in range(max(len(queue) for queue in queues.values())):
        chosen += [queue[rank] for queue in queues.values() if rank < len(queue)]
    position = {id(item): i for i, item in enumerate(items)}
    return sorted(chosen[:limit], key=lambda item: position[id(item)])  # file order, as without categories


def parse_file(text: str, default_limit: int | None) -> tuple[str, int | None]:
    """'file.jsonl' or 'file.jsonl:N' (N prompts of that file) -> (path, limit)."""
    path, _, count = text.rpartition(":") if text.rpartition(":")[2].isdigit() else (text, "", "")
    return (path, _positive(f"the count after {path}:", count)) if count else (text, default_limit)


def score(kind: str, item: Item, text: str) -> float | None:
    if kind == "gsm8k":
        return float(quality.gsm8k_correct(text, item.record["answer"]))
    if kind == "humaneval":
        return float(quality.humaneval_passes(item.record, text))
    if kind == "ifeval":
        followed, checked = quality.ifeval_followed(item.record, text)
        return followed / checked if checked else None
    return None


def _whole(name: str, value, least: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise BenchError(f"{name} must be a whole number, got {value!r}") from None
    if number < least:
        raise BenchError(f"{name} must be {'0 or more' if least == 0 else f'at least {least}'}")
    return number


def _positive(name: str, value) -> int | None:
    return None if value is None else _whole(name, value, 1)
