"""`tuner.server.base.exit_watch`, the watch every replay against a launcher runs with, on a stand-in
launcher (no server): it goes on while the server runs, passes a caller's own watch through, and raises
the launcher's own error once the server has exited."""

from __future__ import annotations

import pytest

from tuner.errors import ServerError
from tuner.server.base import exit_watch


class Launcher:
    """What the watch reads of a launcher: `exited`, and the error its next call raises once it has."""

    name = "stand-in"

    def __init__(self, *, says: str | None = "tritonserver (pid 7) exited with code -9; its log: /tmp/x.log"):
        self.gone = False
        self.says = says  # None: a launcher whose statistics do not raise (the watch raises its own)

    def exited(self) -> bool:
        return self.gone

    def statistics(self, model: str) -> dict:
        if self.gone and self.says is not None:
            raise ServerError(self.says)
        return {}


def test_a_running_server_goes_on_and_a_callers_own_watch_keeps_its_say():
    launcher, asked = Launcher(), []
    assert exit_watch(launcher, "m")(1.0) is False
    own = exit_watch(launcher, "m", then=lambda elapsed: asked.append(elapsed) or elapsed >= 2.0)
    assert [own(1.0), own(2.0)] == [False, True] and asked == [1.0, 2.0]


def test_an_exited_server_raises_the_launchers_own_error_and_the_callers_watch_is_not_asked():
    launcher, asked = Launcher(), []
    watch = exit_watch(launcher, "m", then=lambda elapsed: asked.append(elapsed) or True)
    launcher.gone = True
    # raised, not a stop: the warm-up's watch would read a stop as settled
    with pytest.raises(ServerError, match=r"^tritonserver \(pid 7\) exited with code -9; its log: /tmp/x.log$"):
        watch(3.0)
    assert asked == []
    quiet = Launcher(says=None)  # statistics that do not raise: the watch says it itself, never a stop
    quiet.gone = True
    with pytest.raises(ServerError, match=r"^the Triton server \(stand-in\) exited during the replay$"):
        exit_watch(quiet, "m")(1.0)
