"""Live controls: written by any thread (dashboard keys), read by the engine between steps.

The engine calls `Controls.snapshot()` once at the top of each step, so a change never
lands mid-step; the engine emits a `ControlChange` event for each setting that moved.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from specdash.settings import SessionSettings, VerifyMode

Control = Literal["gemm_backend", "speculation", "k", "verify_mode"]
CONTROLS: tuple[Control, ...] = ("gemm_backend", "speculation", "k", "verify_mode")
"""The live settings an engine applies (or refuses) between steps; `paused` the session keeps."""


@dataclass(frozen=True, slots=True)
class ControlState:
    """The live settings; each named as its `SessionSettings` field."""

    gemm_backend: str
    speculation: bool
    k: int
    verify_mode: VerifyMode
    paused: bool = False


class Controls:
    @classmethod
    def from_settings(
        cls, settings: SessionSettings, gemm_backend: str | None = None, stay_open: bool = False
    ) -> Controls:
        """Controls starting at the session's settings (`gemm_backend`: the resolved name)."""
        state = ControlState(
            gemm_backend=gemm_backend or settings.gemm_backend,
            speculation=settings.speculation,
            k=settings.k,
            verify_mode=settings.verify_mode,
        )
        return cls(state, stay_open)

    def __init__(self, initial: ControlState, stay_open: bool = False) -> None:
        self._lock = threading.Lock()
        self._state = initial
        self.stay_open = stay_open
        """After its prompts the session waits for typed ones (the dashboard) instead of
        ending; it ends when stopped."""
        self._skip_prompt = threading.Event()
        self._user_prompts: deque[str] = deque()
        self._prompt_queued = threading.Event()
        self._resume = threading.Event()
        self._resume.set()

    def snapshot(self) -> ControlState:
        with self._lock:
            return self._state

    def update(self, **changes: Any) -> ControlState:
        with self._lock:
            self._state = replace(self._state, **changes)
            state = self._state
        if "paused" in changes:
            (self._resume.clear if state.paused else self._resume.set)()
        return state

    def request_next_prompt(self) -> None:
        self._skip_prompt.set()

    def take_next_prompt_request(self) -> bool:
        """True once per `request_next_prompt` call."""
        if self._skip_prompt.is_set():
            self._skip_prompt.clear()
            return True
        return False

    def submit_prompt(self, text: str) -> None:
        """Queue a prompt typed in the dashboard; the engine decodes it after the current one."""
        with self._lock:
            self._user_prompts.append(text)
            self._prompt_queued.set()

    def take_user_prompt(self) -> str | None:
        """The oldest queued user prompt, or None. The engine calls this between prompts."""
        with self._lock:
            if len(self._user_prompts) <= 1:
                self._prompt_queued.clear()
            return self._user_prompts.popleft() if self._user_prompts else None

    def wait_for_prompt(self, stop: threading.Event, poll_s: float = 0.05) -> None:
        """Block until a prompt is typed or the session stops (the engine is idle)."""
        while not self._prompt_queued.wait(poll_s):
            if stop.is_set():
                return

    def wait_while_paused(self, stop: threading.Event, poll_s: float = 0.05) -> None:
        while not self._resume.wait(poll_s):
            if stop.is_set():
                return
