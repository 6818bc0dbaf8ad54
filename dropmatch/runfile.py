"""The run file: a finished comparison as plain data (`RunRecord`), its JSON format and version,
reading it back with one clear error for a bad file, and the server's one downloads folder.

A RunRecord holds the three traces, the text of every token id they mention and the rule lab's
matrix at the run's own settings, so that every view (columns, stats, charts, step view, rule lab)
is drawn without a model. The Downloads tab writes it; "Recorded runs" and scripts/record_runs.py
read and write the same file.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from . import lab
from .decoding.acceptance import REASONS
from .assets import RECORDED_DIR
from .decoding.config import ConfigError, one_line
from .metrics import summarize
from .runfile_schema import SchemaError, check_lab, check_trace_consistency, check_value
from .decoding.trace import GenerationTrace, RemovedOptionError, upgraded_dict

# 3: masks keyed by (seed, prompt, position); 4: each trace keeps its DecodeConfig and RuleConfig whole;
# 6: a RuleConfig keeps every knob of the rule table in `knobs`, and the run says where it was made.
RUN_FORMAT, RUN_VERSION = "dropmatch-run", 6
# A version 3 file's loose settings are read into whole ones; versions 3 and 4 kept two options version 5
# removed (path_support, draft_confidence): read where they were off (trace.upgraded_dict).
READ_VERSIONS = (3, 4, 5, 6)
KEEP_DOWNLOADS = 32  # the newest runs' files kept in the server's one downloads folder
MAX_RUN_FILE_BYTES = 20_000_000  # a 96-token run with its states is about 2 MB


@dataclass(frozen=True)
class RunRecord:
    """A finished comparison: prompt, lossy rule, whether p was auto, the lossless / lossy /
    autoregressive traces, token id -> text, and the rule lab's matrix (None without states)."""

    prompt: str
    rule: str
    p_auto: bool
    lossless: GenerationTrace
    lossy: GenerationTrace
    ar: GenerationTrace | None
    tokens: dict[int, str]
    lab: dict | None = None
    # transformers' own run of the rule (compare.static_ensemble_peer), shown under its column; this run's
    # only: a run file does not keep it (a recorded run shows no peer row).
    peer: dict | None = None
    made: str = ""  # where and when it was recorded: "<CPU or GPU>, <cores> cores, <date>" (machine_line)
    # transformers' generate() on the same target, prompt and budget, timed (compare.target_alone): {"tokens",
    # "seconds"}, the denominator of "vs the target alone"; None where it did not run (no speedup is shown).
    target_alone: dict | None = None

    def token_text(self, token: int) -> str:
        return self.tokens.get(token, f"<{token}>")

    @property
    def alone_tokens_per_s(self) -> float | None:
        """The target alone's tokens/s (transformers' generate()), None where it did not run."""
        alone = self.target_alone
        return alone["tokens"] / alone["seconds"] if alone and alone["seconds"] > 0 else None

    def metrics(self):
        """(lossless, lossy) RunMetrics."""
        return (summarize(self.lossless, self.alone_tokens_per_s),
                summarize(self.lossy, self.alone_tokens_per_s, lossless=self.lossless))

    def to_dict(self) -> dict:
        return {"format": RUN_FORMAT, "version": RUN_VERSION, "prompt": self.prompt, "rule": self.rule,
                "p_auto": self.p_auto, "lossless": self.lossless.to_dict(), "lossy": self.lossy.to_dict(),
                "autoregressive": self.ar.to_dict() if self.ar else None,
                "tokens": {str(k): v for k, v in self.tokens.items()}, "lab": self.lab, "made": self.made,
                "target_alone": self.target_alone}

    @staticmethod
    def from_dict(data) -> "RunRecord":
        """A recorded run from its JSON; ConfigError with one line for an old, foreign or damaged file
        (every field is checked against the records' declared types before it is read)."""
        if not isinstance(data, dict) or data.get("format") != RUN_FORMAT:
            raise ConfigError("this file is not a DropMatch Studio run (its trace JSON from Downloads)")
        if data.get("version") not in READ_VERSIONS:
            raise ConfigError(f"this run was written in format version {data.get('version')!r:.40}; this app "
                              f"reads versions {', '.join(map(str, READ_VERSIONS))}: record it again")
        try:
            data = {"made": "", "target_alone": None, **data,
                    **{name: upgraded_dict(data.get(name)) for name in ("lossless", "lossy", "autoregressive")}}
            _check_run(data)
            ar = data["autoregressive"]
            return RunRecord(data["prompt"], data["rule"], data["p_auto"],
                             GenerationTrace.from_dict(data["lossless"]), GenerationTrace.from_dict(data["lossy"]),
                             None if ar is None else GenerationTrace.from_dict(ar),
                             {int(k): v for k, v in data["tokens"].items()}, data.get("lab"), made=data["made"],
                             target_alone=data["target_alone"])
        except RemovedOptionError:
            raise
        except (SchemaError, KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"this run file is damaged ({one_line(error)})") from None


RUN_FIELDS = {"format": str, "version": int, "prompt": str, "rule": str, "p_auto": bool, "lossless": GenerationTrace,
              "lossy": GenerationTrace, "autoregressive": GenerationTrace | None, "tokens": dict, "lab": dict | None, "made": str,
              "target_alone": dict | None}


def _check_run(data: dict) -> None:
    unknown = set(data) - set(RUN_FIELDS)
    if unknown:
        raise SchemaError(f"unknown field {sorted(unknown)[0]!r:.60}")
    for name, hint in RUN_FIELDS.items():
        if name not in data:
            raise SchemaError(f"missing field {name!r}")
        check_value(data[name], hint, name)
    for name in ("lossless", "lossy", "autoregressive"):
        if data[name] is not None:
            check_trace_consistency(data[name], name, REASONS)
    for key, text in data["tokens"].items():
        if not (key.lstrip("-").isdigit() and len(key) < 19 and isinstance(text, str)):
            raise SchemaError(f"tokens: {key!r:.40} is not a token id with its text")
    if data["lab"] is not None:
        check_lab(data["lab"], REASONS)
    alone = data["target_alone"]
    if alone is not None and not (set(alone) == {"tokens", "seconds"} and type(alone["tokens"]) is int
                                  and type(alone["seconds"]) in (int, float) and alone["tokens"] >= 0 and alone["seconds"] >= 0):
        raise SchemaError("target_alone: not {\"tokens\": a count, \"seconds\": a time}")


def read_recorded_run(path, max_bytes: int = MAX_RUN_FILE_BYTES) -> RunRecord:
    """A RunRecord from a trace JSON file; ConfigError with one line for anything else (too large,
    not UTF-8, not JSON, NaN or infinite numbers, nested too deep, of the wrong shape)."""
    try:
        size = Path(path).stat().st_size
        if size <= max_bytes:
            data = json.loads(Path(path).read_text(encoding="utf-8"), parse_constant=_finite, parse_float=_finite)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError):
        raise ConfigError("this file is not a DropMatch Studio run (not readable JSON)") from None
    if size > max_bytes:
        raise ConfigError(f"this file is {size / 1e6:.0f} MB; a run file is at most {max_bytes / 1e6:.0f} MB")
    return RunRecord.from_dict(data)


def _finite(text: str) -> float:
    """A JSON number or constant (NaN, Infinity, -Infinity) as a float; ValueError unless it is finite."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is not a number a run file may hold")
    return value


def recorded_runs(folder: Path = RECORDED_DIR) -> dict[str, Path]:
    """The runs shipped in assets/recorded, by their title (the file name, spaced); none without the folder."""
    return {p.stem.replace("_", " "): p for p in sorted(folder.glob("*.json"))}


def mentioned_tokens(*traces: GenerationTrace | None) -> set[int]:
    """Every token id a trace's views may show: outputs, drafts, targets, paths, top lists."""
    ids: set[int] = set()
    for trace in filter(None, traces):
        ids.update(trace.output_ids)
        ids.add(trace.first_token)
        for r in trace.rounds:
            ids.add(r.context_token)
            ids.update(r.emitted)
            for d in r.drafted:
                ids.update((d.token, d.target_token, *d.path_tokens, d.majority_token))
                ids.update(t for t, _ in (*d.draft_top, *d.target_top))
                ids.update(t for top in d.path_top for t, _ in top)
    ids.difference_update((-1, None))  # -1: no token there; None: no majority token
    return ids


def record_of(state, engine) -> RunRecord:
    """The RunRecord of a finished Comparison (compare.py): the engine names the tokens and gives
    the rule lab's matrix at the run's own settings."""
    lossless, lossy, ar = state.lossless.trace, state.lossy.trace, state.ar
    tokens = {token: engine.services.token_text(token) for token in sorted(mentioned_tokens(lossless, lossy, ar))}
    matrix = lab.rule_lab(engine.services, lossless, lab.lab_settings(lossy)) if lab.has_states(lossless) else None
    p_auto = state.rule.p is None and state.rule.uses_paths  # only a rule that reads p has p = auto
    return RunRecord(state.prompt, state.rule.rule, p_auto, lossless, lossy, ar, tokens, matrix,
                     state.peer, machine_line(), state.target_alone)


def machine_line() -> str:
    """Where a run is being made, for the verdict of its file: the GPU's or CPU's model, cores, the date."""
    import datetime
    import os

    import torch

    if torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
    else:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
        models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
        device = models[0] if models else "a CPU"
    return f"{device}, {os.cpu_count()} cores, {datetime.date.today().isoformat()}"


class Downloads:
    """The server's one folder for the Downloads tab: each run's trace JSON and metrics CSV, the newest
    KEEP_DOWNLOADS runs kept, the rest removed; the folder goes when the server ends."""

    def __init__(self, folder: Path | None = None, keep: int = KEEP_DOWNLOADS):
        self.folder = folder or Path(tempfile.mkdtemp(prefix="dropmatch-downloads-"))
        self.keep = keep
        self._lock = threading.Lock()
        self._shipped: dict[str, tuple[str, str]] = {}

    def for_shipped(self, path: Path, record: RunRecord) -> tuple[str, str]:
        """(trace JSON, metrics CSV) of a run shipped with the app: the shipped file itself, and its CSV
        written once per server, not per visitor (every first visit shows a shipped run)."""
        key = str(Path(path).resolve())
        with self._lock:
            if key not in self._shipped:
                metrics_path = self.folder / f"shipped-{Path(path).stem}-metrics.csv"
                _write_metrics(metrics_path, [m.to_dict() for m in record.metrics()])
                self._shipped[key] = (key, str(metrics_path))
            return self._shipped[key]

    def write(self, record: RunRecord) -> tuple[str, str]:
        """(trace JSON path, metrics CSV path) of a new run folder; the oldest folders beyond `keep` go."""
        with self._lock:
            run = self.folder / uuid.uuid4().hex[:12]
            run.mkdir(parents=True)
            trace_path = run / "dropmatch_trace.json"
            trace_path.write_text(json.dumps(record.to_dict()))
            metrics_path = run / "dropmatch_metrics.csv"
            _write_metrics(metrics_path, [m.to_dict() for m in record.metrics()])
            runs = sorted((p for p in self.folder.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)  # not shipped CSVs
            for old in runs[: max(0, len(runs) - self.keep)]:
                shutil.rmtree(old, ignore_errors=True)
            return str(trace_path), str(metrics_path)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _write_metrics(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
