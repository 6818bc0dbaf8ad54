"""The dev set (tuning, never evaluation): written prompts and GSM8K train questions that the draft's recipe
skips. Read by the scripts that tune or profile (distill_draft, make_lessons, generate_speed, round_profile)
and by the vLLM plugin's tensor-parallel test; the product never reads it."""

from __future__ import annotations

import json
import random
from pathlib import Path

DEFAULT_GSM8K_TRAIN = Path(__file__).resolve().parents[3] / "shared" / "benchmarks" / "gsm8k_train.jsonl"


def gsm8k_questions(seed: int, gsm8k_train: Path = DEFAULT_GSM8K_TRAIN) -> list[str]:
    """GSM8K train questions, shuffled with the seed (the dev set and the recipe read the same order)."""
    questions = [json.loads(line)["question"] for line in Path(gsm8k_train).read_text().splitlines()]
    random.Random(seed).shuffle(questions)
    return questions


DEV_GSM8K = slice(700, 720)  # GSM8K train questions that `generate` skips: the dev set's math half
DEV_PROMPTS = [  # written for the dev set only, not built from the training templates
    "How do I politely decline an invitation to a colleague's party?",
    "Write a short thank-you note to a neighbour who watered my plants.",
    "What should I pack for a three-day hiking trip in spring?",
    "Explain what a mortgage is and how interest works on it.",
    "Suggest a name and a slogan for a bicycle repair shop.",
    "Why do leaves change colour before they fall?",
    "Give me a simple weekly plan to start running.",
    "Write a four-line poem about a sleepy cat on a windowsill.",
    "What is the difference between weather and climate?",
    "Describe how a bill becomes a law, in a few steps.",
    "Write a Python function that returns the number of words in a sentence.",
    "How can I make my mornings less stressful?",
    "Explain how vaccines train the immune system.",
    "Write a short product review of a pair of noise-cancelling headphones.",
    "What are three good habits for keeping a tidy desk?",
    "Summarize the plot of a heist story in five sentences.",
    "How does a refrigerator keep food cold?",
    "Write an invitation to a board game night with friends.",
    "What questions should I ask before adopting a dog?",
    "Explain recursion to someone who has just started programming.",
]
