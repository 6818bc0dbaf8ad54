"""Checking an untrusted run file against the types its records declare, before anything reads it.

A run file (runfile.RunRecord) arrives from a user's upload: every field is checked against the type
hints of the dataclass it fills (trace.GenerationTrace, RoundTrace, DraftedToken, RoundStates),
unknown and missing keys are refused, numbers must be finite and within a 64-bit range, and the rule
lab's block is checked against the shape the views read. A failure is one SchemaError naming the
field, so that the reader can say it in one line.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing

LIMIT = 2**63


class SchemaError(ValueError):
    """A run file field of the wrong type or shape; the message names the field."""


def check_dataclass(data, cls, where: str) -> None:
    """data (JSON) fills the dataclass cls: a dict with no unknown key, every field without a default
    present, every value of its field's declared type."""
    schema, defaulted = _declared(cls)
    check_fields(data, schema, where, optional=defaulted, closed=True)


@functools.cache
def _declared(cls) -> tuple[dict, tuple[str, ...]]:
    """({field: type hint}, the fields with a default) of a dataclass; read once per class (resolving the
    hints evaluates every annotation's text)."""
    fields, hints = dataclasses.fields(cls), typing.get_type_hints(cls)
    defaulted = tuple(f.name for f in fields if f.default is not dataclasses.MISSING
                      or f.default_factory is not dataclasses.MISSING)
    return {f.name: hints[f.name] for f in fields}, defaulted


def check_fields(data, schema: dict, where: str, optional=(), closed: bool = False) -> None:
    """data (JSON) is an object with every key of schema but those optional, each of its type; closed: no other
    key (else other keys are kept: newer labs add some)."""
    if not isinstance(data, dict):
        raise SchemaError(f"{where}: expected an object, got {_kind(data)}")
    unknown = set(data) - set(schema) if closed else ()
    if unknown:
        raise SchemaError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    for name, hint in schema.items():
        if name in data:
            check = _checker(hint)
            if not check.passes(data[name]):  # the field's name is spelled out only for a message
                check(data[name], f"{where}.{name}")
        elif name not in optional:
            raise SchemaError(f"{where}: missing field {name!r}")


def check_value(value, hint, where: str) -> None:
    """value (JSON) is of the declared type hint (str, int, float, bool, None, tuples, unions, dicts,
    nested dataclasses)."""
    _checker(hint)(value, where)


class _Check:
    """The check of one declared type: called as check(value, where), it raises a SchemaError naming
    `where` when value is not of the type; passes(value) answers without a message for a type whose
    check is one test (a scalar), and False otherwise (then the call decides)."""

    def __init__(self, check, passes=None):
        self.check, self.passes = check, passes or (lambda value: False)

    def __call__(self, value, where: str) -> None:
        self.check(value, where)


@functools.cache
def _checker(hint) -> _Check:
    """The check of `hint`, built once per type: a run file holds ~10^5 values of a dozen types."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _Check(lambda value, where: check_dataclass(value, hint, where))
    if origin in (typing.Union, types.UnionType):
        options = [_checker(option) for option in args]
        return _Check(lambda value, where: _check_union(value, options, where),
                      lambda value: any(option.passes(value) for option in options))
    if origin is tuple:
        return _Check(lambda value, where: _check_tuple(value, args, where))
    if origin is dict or hint is dict:
        return _Check(_check_object, lambda value: isinstance(value, dict))
    return _scalar_check(hint)


def _check_object(value, where: str) -> None:
    if not isinstance(value, dict):
        raise SchemaError(f"{where}: expected an object, got {_kind(value)}")


def _check_union(value, options: list[_Check], where: str) -> None:
    for option in options:
        try:
            option(value, where)
            return
        except SchemaError as error:
            last = error
    raise last


def _check_tuple(value, args, where: str) -> None:
    if not isinstance(value, (list, tuple)):
        raise SchemaError(f"{where}: expected a list, got {_kind(value)}")
    if len(args) == 2 and args[1] is Ellipsis:
        item = _checker(args[0])
        for i, element in enumerate(value):
            if not item.passes(element):
                item(element, f"{where}[{i}]")
        return
    if len(value) != len(args):
        raise SchemaError(f"{where}: expected {len(args)} items, got {len(value)}")
    for i, (element, hint) in enumerate(zip(value, args)):
        check_value(element, hint, f"{where}[{i}]")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -LIMIT < value < LIMIT


def _is_float(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and abs(value) < LIMIT


def _scalar_check(hint) -> _Check:
    if hint in (type(None), bool, str):
        test = lambda value: isinstance(value, hint)  # noqa: E731
    elif hint is int:
        test = _is_int
    elif hint is float:
        test = _is_float
    else:
        def cannot(value, where: str) -> None:
            raise SchemaError(f"{where}: a field of type {hint!r} cannot be checked")
        return _Check(cannot)

    def check(value, where: str) -> None:
        if not test(value):
            raise SchemaError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {_kind(value)}")
    return _Check(check, test)


EXTRA_KINDS = ("correction", "bonus", "target")
PATH_VALUES = ("js", "threshold", "majority_token", "majority_votes", "draft_votes")


def _check_drafted(token: dict, where: str, reasons) -> None:
    """A drafted token's reason is known; with path tokens come all the path values and as many top lists."""
    if token["reason"] not in reasons:
        raise SchemaError(f"{where}.reason: unknown reason {token['reason']!r:.40}")
    paths, tops = token.get("path_tokens", ()), token.get("path_top", ())
    if tops and len(tops) != len(paths):
        raise SchemaError(f"{where}: {len(tops)} path top lists for {len(paths)} path tokens")
    if paths and any(token.get(name) is None for name in PATH_VALUES):
        raise SchemaError(f"{where}: path tokens without their JS, threshold and votes")


def check_trace_consistency(trace: dict, where: str, reasons) -> None:
    """What the views assume of a type-checked trace (trace.GenerationTrace as JSON): per drafted token
    as many top lists as path tokens, per round its counts within what it drafted and emitted, the
    states (when kept) one per round with one lossless result per drafted token."""
    rounds = trace["rounds"]
    for r, round_trace in enumerate(rounds):
        here = f"{where}.rounds[{r}]"
        drafted, emitted = round_trace["drafted"], round_trace["emitted"]
        if not 0 <= round_trace["num_accepted"] <= len(drafted) or not emitted:
            raise SchemaError(f"{here}: {round_trace['num_accepted']} accepted of {len(drafted)} drafted, "
                              f"{len(emitted)} emitted")
        for name in ("emitted_logprob", "emitted_in_nucleus"):
            if len(round_trace.get(name, ())) not in (0, len(emitted)):
                raise SchemaError(f"{here}.{name}: one value per emitted token expected")
        if round_trace["extra_kind"] not in EXTRA_KINDS:
            raise SchemaError(f"{here}.extra_kind: unknown kind {round_trace['extra_kind']!r:.40}")
        for d, token in enumerate(drafted):
            _check_drafted(token, f"{here}.drafted[{d}]", reasons)
    states = trace.get("states", ())
    if states and len(states) != len(rounds):
        raise SchemaError(f"{where}.states: {len(states)} for {len(rounds)} rounds")
    for r, state in enumerate(states):
        if len(state["exact"]) != len(rounds[r]["drafted"]):
            raise SchemaError(f"{where}.states[{r}].exact: one value per drafted token expected")
    if len(trace["token_texts"]) != len(trace["output_ids"]) or not trace["output_ids"]:
        raise SchemaError(f"{where}: {len(trace['token_texts'])} token texts for {len(trace['output_ids'])} tokens")


LAB_RULE = {"name": str, "label": str, "lossy": bool}
LAB_ROW = {"round": int, "slot": int, "token": int, "text": str, "cells": tuple[dict, ...]}
LAB_CELL = {"reason": str, "accepted": bool, "info": str}
LAB_SUMMARY = {"rule": str, "drafted": int, "accepted": int, "share": float, "tau": float}


def check_lab(lab, reasons: typing.Collection[str]) -> None:
    """The rule lab's block (lab.rejudge's JSON) has the shape its views read: settings, rules, rows
    of one cell per rule with a known reason, a summary per rule."""
    check_fields(lab, {}, "lab")  # an object
    _check_lab_settings(lab.get("settings"))
    rules = lab.get("rules")
    _check_list(rules, "lab.rules")
    for i, rule in enumerate(rules):
        check_fields(rule, LAB_RULE, f"lab.rules[{i}]")
    _check_list(lab.get("rows"), "lab.rows")
    for i, row in enumerate(lab["rows"]):
        check_fields(row, LAB_ROW, f"lab.rows[{i}]")
        if len(row["cells"]) != len(rules):
            raise SchemaError(f"lab.rows[{i}].cells: {len(row['cells'])} cells for {len(rules)} rules")
        for j, cell in enumerate(row["cells"]):
            check_fields(cell, LAB_CELL, f"lab.rows[{i}].cells[{j}]")
            if cell["reason"] not in reasons:
                raise SchemaError(f"lab.rows[{i}].cells[{j}].reason: unknown reason {cell['reason']!r}")
    _check_list(lab.get("summary"), "lab.summary")
    names = {rule["name"] for rule in rules}
    for i, part in enumerate(lab["summary"]):
        check_fields(part, LAB_SUMMARY, f"lab.summary[{i}]")
        if part["rule"] not in names:  # the summary's view labels each line by its rule's entry
            raise SchemaError(f"lab.summary[{i}].rule: {part['rule']!r} is not one of lab.rules")


def _check_lab_settings(settings) -> None:
    """The lab's knobs (acceptance.KNOBS): p a number (the lab re-judges at one), each knob given of its type."""
    from .decoding.acceptance import KNOBS

    knobs = {name: knob.kind | None if knob.auto else knob.kind for name, knob in KNOBS.items() if name != "p"}
    check_fields(settings, {"p": float, **knobs}, "lab.settings", optional=knobs)


def _check_list(value, where: str) -> None:
    if not isinstance(value, list):
        raise SchemaError(f"{where}: expected a list, got {_kind(value)}")


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__
