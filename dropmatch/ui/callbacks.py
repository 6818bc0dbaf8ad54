"""The app's callbacks: settings in, views (by Ui field name) out. The model work goes through the
PairHost (pair_host.py), which owns the one loaded pair and its model thread; on a ZeroGPU Space the
generation and the rule lab's re-judge run inside GPU calls (zerogpu.py), the loading outside."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from pathlib import Path
from typing import Iterator

import gradio as gr

from .. import lab
from ..decoding.config import DEFAULTS, METHOD_SETTINGS, ConfigError, DecodeConfig, RuleConfig, Settings
from ..runfile import Downloads, RunRecord, read_recorded_run
from ..pair_host import PairHost
from . import layout, views, zerogpu
from .streaming import Reading, stream_comparison

# Errors a user's input or the hub can cause: shown as one line, never as a traceback.
USER_ERRORS = (ConfigError, RuntimeError, ValueError, OSError)


def generation(host: PairHost, engine, settings: Settings, decode: DecodeConfig, rule: RuleConfig,
               reading: Reading | None = None):
    """The views of one comparison's generation: on ZeroGPU from the module-level GPU function
    (its arguments are the settings only; the worker reaches the models through zerogpu's state),
    else computed on the host's model thread, with reading's status lines (str) while a long
    prompt is read."""
    if zerogpu.serves(host):
        return zerogpu.compare_on_gpu(settings)
    stream = stream_comparison(engine, settings.prompt, decode, rule, bool(settings.run_autoregressive), reading)
    return host.iterate(stream, waiting=reading.note if reading else None)


def method_button_state(shown: dict) -> gr.Button:
    """The paper's-settings button: inactive, and saying so, while the controls (shown: the values of the
    METHOD_SETTINGS controls, by name) hold those settings."""
    in_use = all(_same(shown[name], value) for name, value in METHOD_SETTINGS.items())
    return gr.Button(layout.method_button_label(in_use), interactive=not in_use)


def _same(shown, wanted) -> bool:
    """A control's value equals a setting's: as numbers where both are numbers ("0.30" is 0.3), else as text."""
    try:
        return float(shown) == float(wanted)
    except (TypeError, ValueError):
        return str(shown).strip() == str(wanted)


def run_comparison(host: PairHost, downloads: Downloads, settings: Settings, stop: threading.Event | None = None):
    """Yields partial views (by Ui field name) while both columns grow, then the finished view.
    The pair loads outside the GPU call (on ZeroGPU only the generation runs in it: `generation`).
    stop: Stop's flag, read at every step: the run then ends itself, its columns as they are, "Stopped." (a
    cancelled event could leave Gradio's Error badges and a late "Running" status)."""
    try:
        decode, rule = settings.parse()
        host.policy.check_length(decode.max_new_tokens)
        spec = settings.pair_spec()
        if not host.is_loaded(spec):
            yield {"status": f"Waiting for **{spec.label}** to load … (the first load of the embedded pair converts the "
                             "GGUF once, about 20 s)"}
        engine = host.engine(spec)  # outside any GPU call: on ZeroGPU, in the main process
        yield {"status": "Running …", "load_timer": gr.Timer(active=False)}
        # The previous run stays on screen until this one has started: a run refused at its start (its rule,
        # its prompt's length) leaves it there, with the refusal in the status line.
        cleared = {"lossy_header": views.lossy_title(rule.rule), "lossless_out": "", "lossy_out": "",
                   "lossless_stats": "", "lossy_stats": "", "verdict": "", "fix_button": gr.update(visible=False)}
        record, reading, said = None, Reading(rule), False
        items = generation(host, engine, settings, decode, rule, reading)
        for item in items:
            if stop is not None and stop.is_set():
                items.close()
                yield {"status": "Stopped."}
                return
            if isinstance(item, RunRecord):
                record = item
                continue
            if isinstance(item, str):  # how far the prompt is read; the next round puts "Running" back
                said, item = True, {"status": item}
            elif said and "status" not in item:
                said, item = False, {"status": "Running …", **item}
            yield {**cleared, **item}
            cleared = {}
    except USER_ERRORS as error:
        gr.Warning(str(error))
        yield {"status": f"⚠️ {error}"}
        return
    except Exception as error:  # a bug of ours: say so plainly, keep the traceback in the server log
        logging.exception("run failed")
        yield {"status": f"⚠️ internal error ({type(error).__name__}); the server log has the details"}
        return
    yield views.finished_view(record, downloads)


def compare_api(host: PairHost, settings: Settings) -> Iterator[dict]:
    """Lossless SD and the chosen rule on one prompt: a progress note per step while both columns grow,
    then both texts, both metric sets, the figures and the rule lab (a client's predict() gets the last).

    A generator, so that the model works only while the caller asks for the next step: when a client
    goes away or cancels, the server stops asking, and the run stops within one round."""
    try:
        decode, rule = settings.parse()
        host.policy.check_length(decode.max_new_tokens)
        engine = host.engine(settings.pair_spec())  # outside the GPU call
        record, steps = None, 0
        for item in generation(host, engine, settings, decode, rule):
            if isinstance(item, RunRecord):
                record = item
            else:
                steps += 1
                yield {"status": "running", "steps": steps}
    except USER_ERRORS as error:
        raise gr.Error(str(error)) from None
    yield views.api_result(record, rule)


def settings_endpoint(call):
    """A generator function taking the fields of Settings as keyword parameters (prompt required, the
    rest defaulting to the one table), which yields what `call(Settings(...))` yields: the /compare
    API's signature is built from Settings, never written out a second time."""
    types = Settings.types()
    parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=types[name],
                                    default=inspect.Parameter.empty if name == "prompt" else getattr(DEFAULTS, name))
                  for name in Settings.names()]
    signature = inspect.Signature(parameters, return_annotation=dict)

    def endpoint(*args, **kwargs) -> Iterator[dict]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        yield from call(Settings(**bound.arguments))

    endpoint.__signature__ = signature
    endpoint.__annotations__ = {**types, "return": dict}
    endpoint.__doc__ = compare_api.__doc__
    endpoint.__name__ = "compare"
    return endpoint


def open_recorded(downloads: Downloads, path, title: str | None = None, shipped: bool = False) -> dict:
    """The views of a recorded run (an uploaded file, or one shipped with the app: `shipped`, whose
    own file is its download); one clear message otherwise."""
    if not path:
        return {}
    try:
        record = read_recorded_run(path)
        return views.finished_view(record, downloads, recorded_from=title or Path(str(path)).name,
                                   shipped=Path(path) if shipped else None)
    except ConfigError as error:
        return {"status": f"⚠️ {error}"}
    except Exception as error:  # a file of the right shape whose content no view can draw: say so, log it
        logging.exception("recorded run could not be shown")
        return {"status": f"⚠️ this run file could not be shown ({type(error).__name__}); the server log has the details"}


def reverify_view(host: PairHost, record: RunRecord | None, controls: dict, disagreements_only: bool = False) -> dict:
    """The rule lab re-judged at the controls' settings (controls: knob name -> value) over every other knob
    of the run's own, through the heads of the pair in memory."""
    if record is None:
        return {"lab_status": "Run a comparison (or open a recorded run) first."}
    if not lab.has_states(record.lossless):
        return {"lab_status": views.NO_LAB_STATES}
    try:
        settings = lab.lab_settings(record.lossy, **controls)
    except ConfigError as error:
        return {"lab_status": f"⚠️ {error}"}
    engine = host.loaded_engine()
    names = (record.lossless.target_name, record.lossless.draft_name)
    if engine is None or engine.services.names != names:
        return {"lab_status": f"Re-verifying reads the heads of this run's pair ({names[0]} + {names[1]}), which is not "
                              f"in memory now ({host.status.line()}); the matrix shows the run's own settings. "
                              "Run that pair once (or wait for it to load), then move a control again."}
    refusal = lab.weights_mismatch(record.lossless, engine.services.computed_by)
    if refusal:
        return {"lab_status": f"⚠️ {refusal}"}
    start = time.perf_counter()
    if zerogpu.serves(host):
        matrix = zerogpu.rule_lab_on_gpu(host.loaded_spec(), record.lossless, settings)
    else:
        matrix = host.call(lab.rule_lab, engine.services, record.lossless, settings)
    return views.matrix_view(matrix, time.perf_counter() - start, disagreements_only)
