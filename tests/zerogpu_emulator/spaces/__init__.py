"""A ZeroGPU emulator, importable as `spaces` (put this folder first on sys.path), for a machine
with no ZeroGPU. It keeps the mechanics of spaces 0.51.3 (zero/wrappers.py) that the app must
survive, not its GPU scheduling:

- `@GPU(duration=...)` on a function or generator function; `duration` may be a callable, called
  with the call's arguments (its value is kept in `calls`);
- a call pickles its arguments onto a multiprocessing queue to a worker forked from the calling
  process ('fork' context, as spaces), which is kept and reused while idle; the worker runs the
  function in a thread of its own and pickles every result (every yielded item) back; a generator
  whose consumer stops is stopped in the worker after its current item;
- stricter than the real one, so that mistakes show here: an argument that is (or holds) a model,
  a tensor or the app's engine/studio is refused (real ZeroGPU would pickle it into the worker, or
  fail to); importing this module after torch is refused (ZeroGPU needs `spaces` first).

`calls` (in the calling process) records, per call: the function's name, the duration asked and the
worker's pid.
"""

from __future__ import annotations

import dataclasses
import inspect
import multiprocessing
import os
import pickle
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

if "torch" in sys.modules:
    raise ImportError("ZeroGPU emulator: `spaces` must be imported before torch (import it first in app.py)")

_ctx = multiprocessing.get_context("fork")
_FORBIDDEN = ("Engine", "PairHost", "CausalLM", "LoadedPair", "Module", "Tensor", "PreTrainedModel")
calls: list[dict] = []
_in_worker = False
_END = "__zerogpu_emulator_end__"


class ArgumentError(TypeError):
    """An argument ZeroGPU should never receive (a model, an engine, a tensor)."""


def _check_argument(value, path: str = "argument", depth: int = 0) -> None:
    names = {cls.__name__ for cls in type(value).__mro__}
    if names & set(_FORBIDDEN):
        raise ArgumentError(f"ZeroGPU emulator: {path} is a {type(value).__name__}; GPU functions must take small "
                            "picklable arguments and reach the models through module state")
    if depth > 6:
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            _check_argument(getattr(value, field.name), f"{path}.{field.name}", depth + 1)
    elif isinstance(value, dict):
        for key, item in list(value.items())[:50]:
            _check_argument(item, f"{path}[{key!r}]", depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value[:50]):
            _check_argument(item, f"{path}[{index}]", depth + 1)


class _Worker:
    """One forked process running calls of one function, one at a time."""

    def __init__(self, task, generator: bool):
        self.args, self.results, self.stop = _ctx.Queue(), _ctx.Queue(), _ctx.Event()
        self.process = _ctx.Process(target=_serve, args=(task, generator, self.args, self.results, self.stop),
                                    daemon=True)
        self.process.start()


def _serve(task, generator, args_queue, results, stop) -> None:
    global _in_worker
    _in_worker = True
    while True:
        payload = args_queue.get()
        args, kwargs = pickle.loads(payload)
        stop.clear()

        def run():
            try:
                if not generator:
                    results.put(pickle.dumps(("ok", task(*args, **kwargs))))
                    return
                for item in task(*args, **kwargs):
                    if stop.is_set():
                        break
                    results.put(pickle.dumps(("item", item)))
                results.put(pickle.dumps(("end", None)))
            except BaseException as error:  # noqa: BLE001 - sent back, raised in the caller
                results.put(pickle.dumps(("error", error)))

        with ThreadPoolExecutor(1) as pool:  # as spaces: the task runs in a thread of the worker
            pool.submit(run).result()


def GPU(task=None, *, duration=None, size=None, **kwargs):
    if task is None or not callable(task):
        return lambda fn: _wrap(fn, duration if task is None else task)
    return _wrap(task, duration)


def _wrap(task, duration):
    generator = inspect.isgeneratorfunction(task)
    workers: list[_Worker] = []
    lock = threading.Lock()

    def prepare(args, kwargs) -> tuple[_Worker, bytes]:
        for index, value in enumerate(args):
            _check_argument(value, f"argument {index} of {task.__name__}")
        for name, value in kwargs.items():
            _check_argument(value, f"argument {name!r} of {task.__name__}")
        asked = duration(*args, **kwargs) if callable(duration) else duration
        if asked is not None and not (isinstance(asked, (int, float)) and 0 < asked <= 300):
            raise ValueError(f"ZeroGPU emulator: duration {asked!r} is not a number of seconds in (0, 300]")
        payload = pickle.dumps((args, kwargs))  # a PicklingError here, as in spaces
        with lock:
            worker = workers.pop() if workers and workers[-1].process.is_alive() else _Worker(task, generator)
        calls.append({"function": task.__name__, "duration": asked, "worker_pid": worker.process.pid})
        return worker, payload

    def release(worker: _Worker) -> None:
        with lock:
            workers.append(worker)

    def regular(*args, **kwargs):
        if _in_worker:
            return task(*args, **kwargs)
        worker, payload = prepare(args, kwargs)
        worker.args.put(payload)
        kind, value = pickle.loads(worker.results.get())
        release(worker)
        if kind == "error":
            raise value
        return value

    def streaming(*args, **kwargs):
        if _in_worker:
            yield from task(*args, **kwargs)
            return
        worker, payload = prepare(args, kwargs)
        worker.args.put(payload)
        try:
            while True:
                kind, value = pickle.loads(worker.results.get())
                if kind == "end":
                    break
                if kind == "error":
                    raise value
                yield value
        except GeneratorExit:  # the consumer went away: stop the task after its current item, drain
            worker.stop.set()
            while pickle.loads(worker.results.get())[0] not in ("end", "error"):
                pass
            raise
        finally:
            release(worker)

    wrapped = streaming if generator else regular
    wrapped.__name__ = task.__name__
    wrapped.zerogpu = None
    return wrapped


def worker_pid_is_not(pid: int) -> bool:
    return all(call["worker_pid"] != pid for call in calls)


__all__ = ["GPU", "ArgumentError", "calls", "worker_pid_is_not", "os"]
