"""The dashboard's bounded memory of a session, for exporting a trace mid-session.

A dashboard can stay open for hours, so it cannot keep every event. It keeps the
`SessionStart` header, the most recent `WINDOW_EVENTS` events in full, and of the older ones
only the landmarks (prompt starts and ends, divergences, control changes, errors, the
summary), up to `MAX_LANDMARKS`. What it no longer holds is counted by kind, and an export
built from it says so in its header (`config["export_gap"]`), so a partial trace never passes
for a complete one. A session recorded from its header on (`--trace`, or `e` early enough)
does not need this: its trace file is the complete session.

Held events are packed: a pydantic event takes ~1.3 kB as an object, so a full window of
objects would be ~65 MB, and the dashboard's RSS would grow until it filled. All but the newest
`PACK` events are kept as zlib-compressed blocks of their field dicts plus each event's kind
and time (~35 B an event, ~2 MB for a full window, ~4 us an event to pack); landmarks are
also kept as objects. Packing is lossless: an export unpacks the same events.

A count alone bounds nothing when the events carry text: a prompt's start holds its whole text
(tens of kB for a long prompt, which packing barely shrinks when each prompt differs), and a
day of prompts would fill memory through the landmarks and the window alike. So both are held
to a byte budget as well (`MAX_PACKED_BYTES`, `MAX_LANDMARK_BYTES`): past it the oldest leave,
counted as any dropped event is, and the dashboard's memory stays flat however long it runs.
"""

from __future__ import annotations

import pickle
import sys
import typing
import zlib
from array import array
from collections import Counter, deque
from collections.abc import Iterator

from specdash.events import Event, SessionStart

WINDOW_EVENTS = 50_000
"""Recent events kept in full: minutes of decoding on a GPU, tens of minutes for the tiny CPU
model; packed, about 2 MB (as pydantic objects it would be ~65 MB: a token is ~1.3 kB)."""
PACK = 1024
"""Events per packed block; fewer than this newest events stay objects."""
MAX_LANDMARKS = 20_000
MAX_PACKED_BYTES = 16 * 2**20
"""Bytes of the packed window (its compressed blocks and the landmarks among them, kept as
objects): a window of long, different prompts leaves early."""
MAX_LANDMARK_BYTES = 8 * 2**20
"""Estimated bytes of the landmarks kept as objects (`_landmark_bytes`)."""
LANDMARK_OBJECT_BYTES = 1_300
"""What a pydantic event takes besides its text (measured: ~1.3 kB)."""
LANDMARK_KINDS = frozenset(
    {"prompt_start", "prompt_done", "divergence", "control", "error", "summary"}
)
"""Rare events that say what happened when: kept after their neighbours are dropped."""
_TYPES = {t.model_fields["kind"].default: t for t in typing.get_args(typing.get_args(Event)[0])}


def object_bytes(event: Event) -> int:
    """About what `event` takes as an object: the pydantic object, and its texts."""
    texts = (v for v in event.__dict__.values() if isinstance(v, str))
    return LANDMARK_OBJECT_BYTES + sum(map(sys.getsizeof, texts))


class _Block:
    """`PACK` consecutive events, packed; `start` is the first one still held."""

    __slots__ = ("data", "kinds", "landmarks", "nbytes", "start", "t_ns")

    def __init__(self, events: list[Event]) -> None:
        self.data = zlib.compress(pickle.dumps([e.__dict__ for e in events], 5), 1)
        self.kinds = [e.kind for e in events]  # interned literals: a pointer each
        self.t_ns = array("q", (e.t_ns for e in events))
        self.landmarks = {i: e for i, e in enumerate(events) if e.kind in LANDMARK_KINDS}
        self.start = 0
        self.nbytes = len(self.data) + sum(map(object_bytes, self.landmarks.values()))
        """What it holds: its packed data, and its landmarks as objects."""

    def __len__(self) -> int:
        return len(self.kinds) - self.start

    def events(self) -> list[Event]:
        """The held events, unpacked (equal to the ones packed: fields are already valid)."""
        fields = pickle.loads(zlib.decompress(self.data))[self.start :]
        return [_TYPES[f["kind"]].model_construct(**f) for f in fields]


class EventLog:
    """`append` every event in stream order; `export` yields what a trace can hold."""

    def __init__(
        self,
        window: int = WINDOW_EVENTS,
        max_landmarks: int = MAX_LANDMARKS,
        max_packed_bytes: int = MAX_PACKED_BYTES,
        max_landmark_bytes: int = MAX_LANDMARK_BYTES,
    ) -> None:
        self.header: SessionStart | None = None
        self._recent: deque[Event] = deque()
        """The newest events (fewer than `PACK` once blocks exist), after `_blocks`."""
        self._blocks: deque[_Block] = deque()
        self._packed = 0
        """Events held in `_blocks`."""
        self._packed_bytes = 0
        self._landmarks: deque[tuple[Event, int]] = deque()
        """Each landmark with its estimated size."""
        self._landmark_bytes = 0
        self._window = window
        self._max_landmarks = max_landmarks
        self._max_packed_bytes = max_packed_bytes
        self._max_landmark_bytes = max_landmark_bytes
        self.dropped: Counter[str] = Counter()
        """Events no longer held, by kind."""
        self.dropped_until_ns: int | None = None
        """Event time of the newest dropped event: the export is complete after it."""

    def append(self, event: Event) -> None:
        if isinstance(event, SessionStart):
            self.header = event
            return
        self._recent.append(event)
        if len(self._recent) >= PACK:
            block = _Block(list(self._recent))
            self._blocks.append(block)
            self._packed += len(self._recent)
            self._packed_bytes += block.nbytes
            self._recent.clear()
        if self._packed + len(self._recent) > self._window:
            self._evict_oldest()
        while len(self._blocks) > 1 and self._packed_bytes > self._max_packed_bytes:
            self._evict_oldest()  # event by event until the oldest block goes

    def _evict_oldest(self) -> None:
        """The oldest held event leaves the window: kept as a landmark, or counted."""
        if self._blocks:
            block = self._blocks[0]
            i = block.start
            kind, t_ns, old = block.kinds[i], block.t_ns[i], block.landmarks.pop(i, None)
            block.start += 1
            self._packed -= 1
            if not len(block):
                self._blocks.popleft()
                self._packed_bytes -= block.nbytes
        else:
            old = self._recent.popleft()
            kind, t_ns = old.kind, old.t_ns
        if kind in LANDMARK_KINDS:
            assert old is not None  # a block keeps every landmark-kind event it packs
            size = object_bytes(old)
            self._landmarks.append((old, size))
            self._landmark_bytes += size
            while len(self._landmarks) > self._max_landmarks or (
                self._landmark_bytes > self._max_landmark_bytes
            ):
                landmark, size = self._landmarks.popleft()
                self._landmark_bytes -= size
                self._drop(landmark.kind, landmark.t_ns)
        else:
            self._drop(kind, t_ns)

    def _drop(self, kind: str, t_ns: int) -> None:
        self.dropped[kind] += 1
        self.dropped_until_ns = max(self.dropped_until_ns or t_ns, t_ns)

    def __len__(self) -> int:
        """Events held (header included)."""
        held = self._packed + len(self._recent)
        return (self.header is not None) + len(self._landmarks) + held

    @property
    def complete(self) -> bool:
        return not self.dropped

    def gap_note(self) -> str:
        """One line on what an export from this log lacks; empty when it lacks nothing."""
        if self.complete:
            return ""
        total = sum(self.dropped.values())
        kinds = ", ".join(f"{n} {kind}" for kind, n in self.dropped.most_common())
        since = self._seconds(self.dropped_until_ns)
        return (
            f"{total} events before {since:.1f} s were no longer in memory ({kinds}); "
            "landmarks (prompts, divergences, controls, errors) are kept"
        )

    def _seconds(self, t_ns: int | None) -> float:
        if t_ns is None or self.header is None:
            return 0.0
        return (t_ns - self.header.t_ns) / 1e9

    def export(self) -> Iterator[Event]:
        """The header (with `export_gap` when events were dropped), then every held event in
        stream order. Nothing without a header: a trace starts with one."""
        if self.header is None:
            return
        header = self.header
        if not self.complete:
            gap = {
                "dropped_events": dict(self.dropped),
                "complete_after_t_ns": self.dropped_until_ns,
                "note": self.gap_note(),
            }
            header = header.model_copy(update={"config": header.config | {"export_gap": gap}})
        yield header
        yield from (landmark for landmark, _ in self._landmarks)
        for block in list(self._blocks):
            yield from block.events()
        yield from self._recent
