"""Quality scores of generated answers (pure functions, except the HumanEval sandbox process).

- GSM8K: the final number of the answer, exact match with the reference after '####'.
- HumanEval: the completion run against the problem's tests in a separate Python process inside an
  operating-system sandbox (bubblewrap: read-only file system, one private writable folder, no
  network), with time, memory and file-size limits; pass@1 with one greedy sample.
- IFEval: the verifiable instructions that plain code can check; share followed.
- overlap: token-level similarity of two answers (difflib ratio over token ids), for MT-Bench
  where no judge model is available offline.
- distinct-2: unique / total token bigrams (degenerate repetition shows at once).
- length: an answer shorter than all of the target's own samples, or ended by the rule, is outside the band.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").rstrip("."))
    except ValueError:
        return None


def gsm8k_reference(answer: str) -> float | None:
    return _number(answer.split("####")[-1].strip())


def gsm8k_prediction(text: str) -> float | None:
    """The number after '####' or 'answer is' when present, else the last number in the text."""
    for marker in ("####", "answer is", "Answer:"):
        if marker in text:
            found = NUMBER.findall(text.split(marker)[-1])
            if found:
                return _number(found[0])
    found = NUMBER.findall(text)
    return _number(found[-1]) if found else None


def gsm8k_correct(text: str, answer: str) -> bool:
    predicted, reference = gsm8k_prediction(text), gsm8k_reference(answer)
    return predicted is not None and reference is not None and abs(predicted - reference) < 1e-6


def distinct2(tokens: list[int] | tuple[int, ...]) -> float:
    bigrams = list(zip(tokens, tokens[1:]))
    return len(set(bigrams)) / len(bigrams) if bigrams else 1.0


def outside_on_length(new_tokens: int, sample_tokens: list[int], ended_by_rule: bool) -> bool:
    """The reference band's length axis for one answer: outside when it is shorter than the shortest of the
    target's own answers on its prompt (its samples, and lossless SD's: bench.summary.ending_counts), or when its
    text ends with a token only the rule accepted."""
    return ended_by_rule or (bool(sample_tokens) and new_tokens < min(sample_tokens))


def token_overlap(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> float:
    """2 * matched tokens / (len a + len b), matched in order (difflib); 1.0 for identical answers (empty ones too)."""
    return difflib.SequenceMatcher(a=list(a), b=list(b), autojunk=False).ratio()


# ---------------------------------------------------------------- HumanEval

HUMANEVAL_PROMPT = "Complete the following Python function. Reply with the whole function in one code block.\n\n```python\n{prompt}```"
SANDBOX_PACKAGE = "bubblewrap"  # Debian's package of bwrap


class SandboxUnavailable(RuntimeError):
    """HumanEval scoring needs an operating-system sandbox that this machine lacks."""


def sandbox_command(folder: Path) -> list[str]:
    """bwrap around a program: the whole file system read-only, an empty /tmp, `folder` the one
    writable place, no network (every namespace unshared), a new session, and the sandbox dies with
    its parent. Raises SandboxUnavailable where bwrap is missing."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"HumanEval scoring runs model-written code only inside an operating-system "
                                 f"sandbox: install Debian's {SANDBOX_PACKAGE} (apt-get install {SANDBOX_PACKAGE})")
    # The interpreter (a virtual environment may live under /tmp, which the sandbox empties) stays readable.
    interpreter = sorted({sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent.parent)})
    readable = [arg for path in interpreter for arg in ("--ro-bind", path, path)]
    return [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", *readable,
            "--bind", str(folder), str(folder), "--chdir", str(folder), "--unshare-all", "--die-with-parent",
            "--new-session", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", str(folder),
            "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]


def extract_code(text: str) -> str:
    if blocks := re.findall(r"```(?:python|py)?\s*\n(.*?)```", text, flags=re.S):
        return max(blocks, key=len)
    if "```" in text:  # an unclosed block (cut by max new tokens)
        return text.split("```", 1)[1].split("\n", 1)[-1]
    return text


def humaneval_program(problem: dict, completion: str) -> str:
    """The prompt's imports and the model's function (or the prompt + a body), then the tests."""
    code = extract_code(completion)
    header = problem["prompt"] if f"def {problem['entry_point']}" not in code else _imports(problem["prompt"])
    return f"{header}\n{code}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def _imports(prompt: str) -> str:
    return "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))


def _limit_resources() -> None:  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (10, 10))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    os.setsid()


def humaneval_passes(problem: dict, completion: str, timeout_s: float = 10.0) -> bool:
    """Runs the program with `python -I` inside the sandbox (sandbox_command), in a fresh folder,
    with memory, CPU-time and file-size limits; True iff it exits 0 within timeout_s."""
    program = humaneval_program(problem, completion)
    folder = Path(tempfile.mkdtemp(prefix="humaneval-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    try:
        (folder / "program.py").write_text(program)
        command = sandbox_command(folder) + [sys.executable, "-I", str(folder / "program.py")]
        try:
            result = subprocess.run(command, timeout=timeout_s, capture_output=True, preexec_fn=_limit_resources,
                                    stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- IFEval (the checkable subset)


def _words(text: str) -> int:
    return len(re.findall(r"\b\w+\b", text))


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\s*\n\s*\n\s*|\*\*\*", text) if p.strip()]


def _relation(count: int, relation: str, value: int) -> bool:
    return count < value if relation == "less than" else count >= value


def _json_ok(text: str) -> bool:
    body = text.strip()
    fenced = re.match(r"^```(?:json)?\s*(.*?)```$", body, flags=re.S)
    try:
        json.loads(fenced.group(1) if fenced else body)
        return True
    except (json.JSONDecodeError, AttributeError):
        return False


IFEVAL_CHECKS = {
    "punctuation:no_comma": lambda t, k: "," not in t,
    "change_case:english_lowercase": lambda t, k: t == t.lower() and any(c.isalpha() for c in t),
    "change_case:english_capital": lambda t, k: t == t.upper() and any(c.isalpha() for c in t),
    "detectable_content:number_placeholders": lambda t, k: len(re.findall(r"\[[^\]]+\]", t)) >= k["num_placeholders"],
    "detectable_format:number_bullet_lists": lambda t, k: len(re.findall(r"^\s*[*-]\s", t, flags=re.M)) == k["num_bullets"],
    "detectable_format:multiple_sections": lambda t, k: len(re.findall(rf"{re.escape(k['section_spliter'])}\s*\d+", t)) == k["num_sections"],
    "detectable_format:json_format": lambda t, k: _json_ok(t),
    "length_constraints:number_words": lambda t, k: _relation(_words(t), k["relation"], k["num_words"]),
    "length_constraints:number_paragraphs": lambda t, k: len(_paragraphs(t)) == k["num_paragraphs"],
    "combination:two_responses": lambda t, k: len([p for p in t.split("******") if p.strip()]) == 2,
    "startend:end_checker": lambda t, k: t.strip().endswith(k["end_phrase"]),
    "startend:quotation": lambda t, k: t.strip().startswith('"') and t.strip().endswith('"'),
    "detectable_format:title": lambda t, k: re.search(r"<<[^\n]+>>", t) is not None,
}


def ifeval_followed(record: dict, text: str) -> tuple[int, int]:
    """(instructions followed, instructions checked) for one IFEval record."""
    followed = checked = 0
    for instruction, kwargs in zip(record["instruction_id_list"], record["kwargs"]):
        check = IFEVAL_CHECKS.get(instruction)
        if check is None:
            continue
        checked += 1
        followed += bool(check(text, {k: v for k, v in (kwargs or {}).items() if v is not None}))
    return followed, checked
