"""Whose turn a step thread's next claim is, in a worker that loads a class with a key.

Rows without a fairness key are claimed in the ordinary order (``claims.claim_due_execution``
and, on PostgreSQL, the handover), with the statements of a worker that loads no keyed
class; rows with a key by a key's turn (``queries.fairness.claim_fairly``: the key served
least recently). While keys have due rows, each step thread alternates the two: an ordinary
turn, a key's turn, an ordinary turn… When a key's turn finds no key with a due row, the
thread takes :data:`IDLE_ORDINARY_TURNS` ordinary turns before it looks at the keys again, so
a backlog of unkeyed workflows pays one look per that many claims (and a new key's first row
waits for at most that many of this thread's ordinary claims). A turn that finds nothing
gives its claim to the other turn, in the same transaction: neither kind of row waits while
the other has none. The same the other way: when an ordinary turn finds nothing, the thread
takes that many key turns before it tries the ordinary order first again, so a backlog of
keyed workflows does not pay an empty ordinary claim at every claim.

A thread's turns are kept on its ``RunOptions`` (as ``chaining.Handovers`` are): each step
thread has its own, and nothing is shared between threads or workers — the keys' rotation
itself is in the database (``geneva_drive_fair_keys``).
"""

from __future__ import annotations

from dataclasses import dataclass

from geneva_drive.engine.run_options import RunOptions

# Ordinary turns between two looks at the keys while none had a due row.
IDLE_ORDINARY_TURNS = 64


@dataclass
class FairTurns:
    """How many ordinary turns a thread takes before its next key's turn."""

    ordinary_left: int = IDLE_ORDINARY_TURNS
    # Key turns to take without an ordinary turn between them: the last ordinary turn found
    # nothing due.
    keys_only_left: int = 0
    # Key turns that found every key locked by other claims (queries.fairness.claim_fairly):
    # the next such turn starts at the key after the last one's.
    shared: int = 0
    # Whether the last key turn found a key with a due row: PostgreSQL's handover takes the
    # next key's turn only then (chaining.hand_over); an idle look goes through an ordinary
    # claim's transaction, as it did before the handover took key turns.
    keys_were_due: bool = False

    @property
    def keys_next(self) -> bool:
        return self.ordinary_left <= 0 or self.keys_only_left > 0

    def took_ordinary_turn(self, *, found: bool = True) -> None:
        self.ordinary_left -= 1
        # Nothing due in the ordinary order: the next IDLE_ORDINARY_TURNS claims are keys'.
        self.keys_only_left = 0 if found else IDLE_ORDINARY_TURNS

    def took_key_turn(self, *, keys_due: bool, shared: bool = False) -> None:
        # Keys with due rows: one ordinary turn, then a key's again. None: look again later.
        self.ordinary_left = 1 if keys_due else IDLE_ORDINARY_TURNS
        self.keys_only_left = max(0, self.keys_only_left - 1)
        self.keys_were_due = keys_due
        if shared:
            self.shared += 1


_TURNS = "_gd_fair_turns"


def turns_of(options: RunOptions) -> FairTurns:
    """The turns of the runs made with ``options``, created at its first use (a copy made
    with ``dataclasses.replace`` starts afresh)."""
    state = vars(options).get(_TURNS)
    if not isinstance(state, FairTurns):
        state = vars(options)[_TURNS] = FairTurns()
    return state
