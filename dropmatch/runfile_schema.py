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
    """({field: type hint}, the fields with a default) of a dataclass, read once (hints are evaluated text)."""
    fields, hints = dataclasses.fields(cls), typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields}, tuple(
        f.name for f in fields if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)


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
            check, passes = _checker(hint)
            if not passes(data[name]):  # the field's name is spelled out only for a message
                check(data[name], f"{where}.{name}")
        elif name not in optional:
            raise SchemaError(f"{where}: missing field {name!r}")


def check_value(value, hint, where: str) -> None:
    """value (JSON) is of the declared type hint (scalars, tuples, unions, dicts, nested dataclasses)."""
    _checker(hint)[0](value, where)


SCALARS = {object: lambda value: True, type(None): lambda value: value is None, bool: lambda value: isinstance(value, bool),
           str: lambda value: isinstance(value, str), dict: lambda value: isinstance(value, dict),
           int: lambda value: isinstance(value, int) and not isinstance(value, bool) and -LIMIT < value < LIMIT,
           float: lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
           and math.isfinite(value) and abs(value) < LIMIT}


@functools.cache
def _checker(hint) -> tuple:
    """(check(value, where): raises a SchemaError naming `where`, passes(value): a test without a message, True
    only where the check is that one test) of `hint`, built once per type: a run file holds ~10^5 values."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return (lambda value, where: check_dataclass(value, hint, where)), (lambda value: False)
    if origin in (typing.Union, types.UnionType):
        tests = [_checker(option)[1] for option in args]  # each option's quick test, looked up once
        return (lambda value, where: _check_union(value, args, where)), (lambda value: any(t(value) for t in tests))
    if origin is tuple:
        return (lambda value, where: _check_tuple(value, args, where)), (lambda value: False)
    test = SCALARS.get(dict if origin is dict else hint)
    name = "an object" if test is SCALARS[dict] else getattr(hint, "__name__", hint)

    def check(value, where: str) -> None:
        if test is None:
            raise SchemaError(f"{where}: a field of type {hint!r} cannot be checked")
        if not test(value):
            raise SchemaError(f"{where}: expected {name}, got {_kind(value)}")
    return check, test or (lambda value: False)


def _check_union(value, args, where: str) -> None:
    for option in args:
        try:
            check_value(value, option, where)
            return
        except SchemaError as error:
            last = error
    raise last


def _check_tuple(value, args, where: str) -> None:
    if not isinstance(value, (list, tuple)):
        raise SchemaError(f"{where}: expected a list, got {_kind(value)}")
    if len(args) == 2 and args[1] is Ellipsis:
        check, passes = _checker(args[0])
        for i, item in enumerate(value):
            if not passes(item):  # an item's place is spelled out only for a message
                check(item, f"{where}[{i}]")
        return
    if len(value) != len(args):
        raise SchemaError(f"{where}: expected {len(args)} items, got {len(value)}")
    for i, (item, hint) in enumerate(zip(value, args)):
        check_value(item, hint, f"{where}[{i}]")


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
    check_value(rules, tuple[object, ...], "lab.rules")
    for i, rule in enumerate(rules):
        check_fields(rule, LAB_RULE, f"lab.rules[{i}]")
    check_value(lab.get("rows"), tuple[object, ...], "lab.rows")
    for i, row in enumerate(lab["rows"]):
        check_fields(row, LAB_ROW, f"lab.rows[{i}]")
        if len(row["cells"]) != len(rules):
            raise SchemaError(f"lab.rows[{i}].cells: {len(row['cells'])} cells for {len(rules)} rules")
        for j, cell in enumerate(row["cells"]):
            check_fields(cell, LAB_CELL, f"lab.rows[{i}].cells[{j}]")
            if cell["reason"] not in reasons:
                raise SchemaError(f"lab.rows[{i}].cells[{j}].reason: unknown reason {cell['reason']!r}")
    check_value(lab.get("summary"), tuple[object, ...], "lab.summary")
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


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__
