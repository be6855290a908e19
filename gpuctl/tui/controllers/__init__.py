"""The TUI's feature flows, each a controller the App composes: ``StressController`` (``s``,
``S``, ``B``), ``AcceptController`` (``a``), ``RecordController`` (``R``),
``QuitController`` (``q``) and ``ActivityController`` (others' actions, from the audit log).

Why apart from the App: the App is the shell (screens, keys, themes, the fleet's stream into
the store); a flow is what a key press does with the fleet (ask the service, ask the user,
start the work in a worker, say what happened). Each holds its own state (the run under way,
the recording, the burns the demo's story started) and reaches the screen only through the App
it is given (``notify``, ``push_screen``, ``run_worker``, the selection). The App's actions are
one line each, handing the key press to its controller.
"""

from gpuctl.tui.controllers.accept import AcceptController
from gpuctl.tui.controllers.activity import ActivityController
from gpuctl.tui.controllers.quit import QuitController
from gpuctl.tui.controllers.record import RecordController
from gpuctl.tui.controllers.stress import StressController

__all__ = [
    "AcceptController",
    "ActivityController",
    "QuitController",
    "RecordController",
    "StressController",
]
