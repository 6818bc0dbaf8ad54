"""Every event of the app, in one place, over the components (layout.py) and the callbacks."""

from __future__ import annotations

import threading

import gradio as gr

from ..decoding.acceptance import knob_by_key, votes_needed
from ..builtin_lessons import LESSON_NAMES
from ..decoding.config import METHOD_SETTINGS, Settings
from ..runfile import Downloads, RunRecord, recorded_runs
from ..render import lab_html
from ..assets import load_frontier
from ..pair_host import PairHost
from . import callbacks, views
from .sessions import SessionJanitor
from .layout import Ui, build_layout, knob_shown

RUN_TIME_LIMIT_S = 600
CHEAP_CONCURRENCY = 8  # a run past this is cancelled, so one user cannot hold the model forever


def method_note() -> str:
    """What the paper's-settings button set, from the settings themselves (config.METHOD_SETTINGS)."""
    k, p = METHOD_SETTINGS["k"], METHOD_SETTINGS["p"]
    return (f"Settings: the paper's own (DropMatch, K {k} paths, p {p}, the mean of the path distributions as "
            f"centroid, {votes_needed(k, METHOD_SETTINGS['majority_fraction'])} of {k} votes). Press **Run**.")


def register_listeners(demo: gr.Blocks, ui: Ui, host: PairHost, downloads: Downloads) -> None:
    """Every event of the app, in one place."""

    stops: dict[str, threading.Event] = {}  # each page's Stop flag for its latest Run, by session

    def on_run(request: gr.Request, *values):
        session = request.session_hash if request else ""
        stop = stops.setdefault(session, threading.Event())
        try:
            for view in callbacks.run_comparison(host, downloads, Settings(**dict(zip(ui.setting_names(), values))),
                                                 stop):
                yield ui.bind(view)
        finally:
            if stops.get(session) is stop:
                del stops[session]

    def shipped_view(title: str) -> dict:
        """A shipped run's views, computed once per server and shared (read-only) by every visitor:
        a first visit reads them from memory and writes nothing to disk."""
        with shipped_lock:
            if title not in shipped_views:
                shipped_views[title] = callbacks.open_recorded(downloads, recorded_runs()[title], title, shipped=True)
            return shipped_views[title]

    shipped_views: dict[str, dict] = {}
    shipped_lock = threading.Lock()
    janitor = SessionJanitor(demo)

    _control_listeners(ui)
    ui.prompt.change(lambda prompt: views.prompt_note(prompt, host.loaded_engine()), ui.prompt, ui.prompt_note,
                     trigger_mode="always_last", api_visibility="private", show_progress="hidden")
    first_visit = _visit_listeners(demo, ui, janitor, shipped_view)
    _run_listeners(ui, on_run, first_visit, janitor, stops)
    for trigger in (ui.step_round, ui.step_column):
        trigger.change(views.step_view, [ui.last_run, ui.step_column, ui.step_round], ui.step_out,
                       api_visibility="private")
    ui.load_timer.tick(lambda shown: views.load_status_view(host.status, shown), ui.status, [ui.status, ui.load_timer],
                       api_visibility="private")
    _lab_listeners(ui, host)
    _recorded_listeners(ui, downloads, shipped_view)
    def compare(settings: Settings):
        janitor.sweep()
        yield from callbacks.compare_api(host, settings)

    gr.api(callbacks.settings_endpoint(compare), api_name="compare",
           concurrency_id="engine", concurrency_limit=1, time_limit=RUN_TIME_LIMIT_S)


def _visit_listeners(demo: gr.Blocks, ui: Ui, janitor: SessionJanitor, shipped_view) -> gr.events.Dependency:
    """A page's first visit (a shipped run shown at once), its close, and what its user does before the first
    visit lands (which that view then leaves alone). Returns the first visit's event (Run cancels it)."""
    def on_first_visit(request: gr.Request):
        """A shipped run at once, while the pair loads in the background; else the frontier alone.
        ?run=<name> opens that shipped run in the Replay tab (a link a speaker can share)."""
        janitor.page_opened(request.session_hash if request else None)
        shipped = recorded_runs()
        if not shipped:
            return ui.bind({"plot_tradeoff": views.tradeoff_figure(None, load_frontier())})
        query = request.query_params if request else {}
        asked = query.get("run") or ""
        title = views.shipped_run_title(shipped, asked)
        view = _copy(shipped_view(title or next(iter(shipped))))
        view["prompt"] = view["last_run"].prompt  # the recorded run's prompt: Run runs it live
        view = _linked(view, shipped, asked, title, query.get("lesson") or "")
        return ui.bind(_unless_overtaken(view, janitor.done_by(request.session_hash if request else None)))

    def on_tab_closed(request: gr.Request):
        janitor.page_closed(request.session_hash)

    def on_prompt_changed(prompt: str, request: gr.Request):
        """The box starts empty: text in it before the first visit landed is the visitor's (typed, pasted or
        an example picked). Gradio's .input missed a one-step fill (as a paste is), so this listens to changes."""
        if prompt:
            janitor.user_did(request.session_hash, "typed")

    ui.prompt.change(on_prompt_changed, ui.prompt, None, api_visibility="private", queue=False,
                     show_progress="hidden", trigger_mode="always_last")
    demo.unload(on_tab_closed)
    return demo.load(on_first_visit, None, [*ui.view_components(), ui.tabs, ui.watch_tabs, ui.learn_tabs, ui.prompt],
                     api_visibility="private")


def _run_listeners(ui: Ui, on_run, first_visit, janitor: SessionJanitor, stops: dict) -> None:
    """Run (cancelling the first visit's display if it is still on its way, and noting the press so that a
    first visit that had not yet reached the queue lands nothing) and Stop. Run shows the columns (the Watch
    group) and makes Stop active until the run ends, fails or is stopped. Stop sets the run's flag (made at the
    press, so that a run still queued is stopped too): the run ends itself at its next step."""
    def on_press(request: gr.Request):
        janitor.user_did(request.session_hash, "ran")
        stops[request.session_hash] = threading.Event()
        return gr.Tabs(selected="watch"), _stop_button(active=True)

    def on_stop(request: gr.Request):
        if (stop := stops.get(request.session_hash)) is not None:
            stop.set()

    ui.run_button.click(on_press, None, [ui.tabs, ui.stop_button], api_visibility="private", queue=False)
    run_event = ui.run_button.click(on_run, ui.setting_components(), ui.view_components(), cancels=[first_visit],
                                    api_visibility="private", concurrency_id="engine", concurrency_limit=1, time_limit=RUN_TIME_LIMIT_S)
    run_event.then(_stop_button, None, ui.stop_button, api_visibility="private", queue=False)
    ui.stop_button.click(on_stop, None, None, api_visibility="private", queue=False
                         ).then(_stop_button, None, ui.stop_button, api_visibility="private", queue=False)


def _stop_button(active: bool = False) -> gr.Button:
    """Stop as it looks while a run goes on (red, active), and while none does (grey, inactive)."""
    return gr.Button(variant="stop" if active else "secondary", interactive=active)


def _control_listeners(ui: Ui) -> None:
    """The custom pair's hub ids shown when asked for; the method's settings button: its values into the
    controls, and a line saying so."""
    ui.pair.change(views.pair_view, [ui.pair, ui.draft_source], [ui.target_id, ui.draft_id, ui.head_id, ui.draft_source],
                   api_visibility="private")
    names = tuple(METHOD_SETTINGS)
    controls = [ui.component(name) for name in names]
    ui.method_button.click(lambda: [*(METHOD_SETTINGS[name] for name in names), method_note()], None,
                           [*controls, ui.status], api_visibility="private")
    # The button says when the controls hold the paper's settings. One listener for all five, its calls one after
    # another and the last one's answer kept: five listeners' answers could arrive out of order.
    gr.on([control.change for control in controls],
          lambda *values: callbacks.method_button_state(dict(zip(names, values))), controls, ui.method_button,
          api_visibility="private", show_progress="hidden", queue=False, trigger_mode="always_last")
    # The fix a rule that could not act names (views.fix_view): its settings into the controls, and a line saying so.
    ui.fix_button.click(lambda fix: [fix.get("gamma", gr.skip()), gr.update(visible=False),
                                     f"Set: draft length γ {fix.get('gamma')}. Press **Run**." if fix else gr.skip()],
                        ui.fix_settings, [ui.gamma, ui.fix_button, ui.status], api_visibility="private")
    # Settings shows the chosen rule's knobs only (the rule table says which it reads).
    ui.rule.change(lambda rule: [gr.update(visible=knob_shown(knob_by_key(key).name, rule)) for key in ui.rule_knobs],
                   ui.rule, list(ui.rule_knobs.values()), api_visibility="private", show_progress="hidden")


def _lab_listeners(ui: Ui, host: PairHost) -> None:
    def on_lab(record, *values):
        *controls, disagreements_only = values
        return ui.bind(callbacks.reverify_view(host, record, dict(zip(ui.lab_knobs, controls)), disagreements_only))

    lab_outputs = [ui.lab_status, ui.lab_out, ui.lab_summary, ui.lab_matrix]
    # User input only (a run setting the controls re-judges nothing); a drag's many steps coalesce to the last one.
    for control in ui.lab_controls():
        control.input(on_lab, [ui.last_run, *ui.lab_controls(), ui.lab_disagreements], lab_outputs,
                      api_visibility="private", concurrency_id="engine", concurrency_limit=1, trigger_mode="always_last")
    ui.lab_disagreements.input(lambda matrix, only: lab_html(matrix, only) if matrix else gr.update(),
                               [ui.lab_matrix, ui.lab_disagreements], ui.lab_out, api_visibility="private")


def _recorded_listeners(ui: Ui, downloads: Downloads, shipped_view) -> None:
    """A recorded run, shipped or uploaded, shown with its prompt, rule and settings put back in the controls."""
    restored = [name for name in ui.setting_names() if name not in ("pair", "target_id", "draft_id", "head_id")]

    def with_settings(view: dict) -> dict:
        record = view.get("last_run")
        settings = views.settings_view(record) if isinstance(record, RunRecord) else {}
        if "draft_source" in settings:  # the pair stays as chosen: a source it lacks is offered with the run's
            settings["draft_source"] = gr.update(choices=views.draft_source_choices(None), value=settings["draft_source"])
        return ui.bind({**view, **{name: value for name, value in settings.items() if name in restored}})

    def on_recorded_choice(title):
        return with_settings(_copy(shipped_view(title)) if title in recorded_runs() else {})

    def on_recorded_upload(file):
        return with_settings(callbacks.open_recorded(downloads, file))

    outputs = [*ui.view_components(), *(ui.component(name) for name in restored)]
    ui.recorded_choice.change(on_recorded_choice, ui.recorded_choice, outputs, api_visibility="private")
    ui.recorded_upload.upload(on_recorded_upload, ui.recorded_upload, outputs, api_visibility="private")


def _linked(view: dict, shipped: dict, asked: str, title: str | None, lesson: str) -> dict:
    """The first view with what a link asked: ?run=NAME opens that shipped run in Replay, ?lesson=NAME the
    Lessons tab (lessons.js opens that lesson and scrolls to it); an unknown name is said in the status."""
    if asked and title:
        view["tabs"], view["watch_tabs"] = gr.Tabs(selected="watch"), gr.Tabs(selected="replay")
    elif asked:
        view["status"] = (f"No shipped run is called “{asked}”; the shipped runs are: "
                          + ", ".join(path.stem for path in shipped.values()) + ". " + view.get("status", ""))
    if lesson in LESSON_NAMES:
        view["tabs"], view["learn_tabs"] = gr.Tabs(selected="learn"), gr.Tabs(selected="lessons")
    elif lesson:
        view["status"] = f"No built-in lesson is called “{lesson}”; they are: {', '.join(LESSON_NAMES)}. " + view.get("status", "")
    return view


def _unless_overtaken(view: dict, done: frozenset[str]) -> dict:
    """The first view, less what the user overtook while it was on its way: nothing at all once they pressed
    Run (their run's columns stand), the prompt once they typed (their words stay)."""
    if "ran" in done:
        return {name: gr.skip() for name in view}
    if "typed" in done:
        return {name: value for name, value in view.items() if name != "prompt"}
    return view


def _copy(view: dict) -> dict:
    """A shared view for one response: its own dict, and its own copy of every update dict in it."""
    return {name: dict(value) if isinstance(value, dict) else value for name, value in view.items()}


def create_demo(host: PairHost, downloads: Downloads | None = None) -> gr.Blocks:
    """The whole UI over one PairHost: layout, then the listeners."""
    downloads = downloads or Downloads()
    with gr.Blocks(title="DropMatch Studio", delete_cache=(3600, 3600)) as demo:
        ui = build_layout()
        register_listeners(demo, ui, host, downloads)
    # Model work (runs, the lab's re-judge, /compare) is one group of one; cheap events (page load, a
    # recorded run, the step slider, the timer) run beside it instead of queueing behind a run.
    demo.queue(default_concurrency_limit=CHEAP_CONCURRENCY, max_size=64)
    return demo
