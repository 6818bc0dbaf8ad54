"""Where the plugin meets vLLM (0.32): three hooks that register() installs, each harmless to an engine
that does not ask for DropMatch, so that no vLLM engine ever depends on the plugin working.

- check_engines: `EngineArgs.create_engine_config` (the front end, before any worker starts) refuses,
  in one line, an engine that asks for DropMatch where the plugin cannot act: bad settings, a platform
  whose runner it does not cover, vLLM's V2 model runner (the default on CUDA with Triton), or a hook
  that failed to install.
- check_requests: `InputProcessor._validate_params` (the front end, admitting a request) refuses, with
  HTTP 400 and one line, what the request's rule cannot serve as asked (params.check_request), its
  settings read over the engine's own.
- hook_workers: `WorkerWrapperBase.init_device` (in the worker, just before it builds its model runner)
  imports the current platform's V1 runner, and only that one, puts DropMatchRunner in front of it,
  and checks after the build that the runner in use is a DropMatch runner: an engine never serves
  lossless output while it was asked for DropMatch.
"""

from __future__ import annotations

from ...decoding import config
from ...decoding.config import ConfigError
from .settings import ServeSettings

# (module, class name) of the V1 runner DropMatchRunner goes in front of, per platform vLLM reports
RUNNERS = {"cpu": ("vllm.v1.worker.cpu_worker", "CPUModelRunner"),
           "cuda": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")}
PROBLEMS: list[str] = []  # hooks that failed to install in this process, one line each (register())


def asked(vllm_config) -> dict | None:
    """The engine's DropMatch settings (additional_config["dropmatch"]), or None."""
    return (getattr(vllm_config, "additional_config", None) or {}).get("dropmatch")


def one_line(error: BaseException) -> str:
    """config.one_line at 300 characters, or the error's type where it has no message."""
    return config.one_line(error, 300) or type(error).__name__


def platform_name() -> str:
    from vllm.platforms import current_platform

    return "cuda" if current_platform.is_cuda() else "cpu" if current_platform.is_cpu() else \
        str(getattr(current_platform, "device_name", "unknown"))


def refusal(vllm_config, platform: str, uses_v2_runner: bool) -> str | None:
    """Why an engine asking for DropMatch cannot have it (one line), or None: pure, for the tests."""
    given = asked(vllm_config)
    if given is None:
        return None
    try:
        ServeSettings().updated(given, engine=True)
    except ConfigError as error:
        return f"DropMatch: additional_config['dropmatch']: {error}"
    if PROBLEMS:
        return f"DropMatch: the plugin could not hook vLLM in this process ({PROBLEMS[0]})"
    if platform not in RUNNERS:
        return (f"DropMatch: the plugin hooks vLLM's V1 runner on CPU and CUDA; this engine runs on {platform}: "
                "remove additional_config['dropmatch']")
    if uses_v2_runner:
        return ("DropMatch: the plugin hooks vLLM's V1 model runner, and this engine would use the V2 runner: "
                "set VLLM_USE_V2_MODEL_RUNNER=0 (or remove additional_config['dropmatch'])")
    return None


def check_engines() -> None:
    """Wraps EngineArgs.create_engine_config with `refusal` (ValueError, one line). Idempotent."""
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_engine_config
    if getattr(original, "dropmatch_hook", False):
        return

    def create_engine_config(self, *args, **kwargs):
        config = original(self, *args, **kwargs)
        if asked(config) is not None:
            why = refusal(config, platform_name(), bool(config.use_v2_model_runner))
            if why:
                raise ValueError(why)
        return config

    create_engine_config.dropmatch_hook = True
    EngineArgs.create_engine_config = create_engine_config


def check_requests() -> None:
    """Wraps InputProcessor._validate_params with params.check_request (vLLM's validation error: HTTP
    400 with the one line). Idempotent."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.input_processor import InputProcessor

    from .params import check_request

    original = InputProcessor._validate_params
    if getattr(original, "dropmatch_hook", False):
        return

    def _validate_params(self, params, *args, **kwargs):
        resolved = original(self, params, *args, **kwargs)
        if hasattr(params, "temperature"):  # SamplingParams (a pooling request asks nothing of DropMatch)
            try:
                check_request(params, asked(self.vllm_config))
            except ValueError as error:
                raise VLLMValidationError(str(error)) from None
        return resolved

    _validate_params.dropmatch_hook = True
    InputProcessor._validate_params = _validate_params


def hook_workers() -> None:
    """Wraps WorkerWrapperBase.init_device: for an engine that asks for DropMatch, the platform's runner
    gets DropMatchRunner before the worker builds it, and a runner without it is refused. Idempotent."""
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    original = WorkerWrapperBase.init_device
    if getattr(original, "dropmatch_hook", False):
        return

    def init_device(self):
        if asked(self.vllm_config) is None:
            return original(self)
        install_runner(platform_name())
        original(self)
        check_runner(getattr(self.worker, "model_runner", None))

    init_device.dropmatch_hook = True
    WorkerWrapperBase.init_device = init_device


def install_runner(platform: str) -> None:
    """DropMatchRunner in front of the platform's V1 runner class (imported here, lazily); RuntimeError
    (one line) when the platform has none the plugin covers or its import fails."""
    import importlib

    if platform not in RUNNERS:
        raise RuntimeError(f"DropMatch: no runner of the plugin's for platform {platform}")
    module_name, class_name = RUNNERS[platform]
    try:
        module = importlib.import_module(module_name)
        from .runner import DropMatchRunner
    except Exception as error:  # noqa: BLE001 - any import failure is this one refusal
        raise RuntimeError(f"DropMatch: the plugin's runner could not be imported ({one_line(error)})") from None
    base = getattr(module, class_name)
    if not issubclass(base, DropMatchRunner):
        setattr(module, class_name, type(f"DropMatch{class_name}", (DropMatchRunner, base), {}))


def check_runner(model_runner) -> None:
    """RuntimeError (one line) unless the worker's model runner is a DropMatch runner."""
    from .runner import DropMatchRunner

    if not isinstance(model_runner, DropMatchRunner):
        name = type(model_runner).__qualname__
        raise RuntimeError(f"DropMatch: this worker's model runner ({name}) is not one the plugin hooks (the V1 "
                           "runner on CPU or CUDA): set VLLM_USE_V2_MODEL_RUNNER=0 or remove additional_config['dropmatch']")
