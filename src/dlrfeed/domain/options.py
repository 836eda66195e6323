"""Integration-specific options of the parser and the rules: named, documented, off by default.

P18: replacing a final status or reading an id in a non-literal way needs a rule that holds for
one integration, written down and switched on explicitly. Every such rule is a field here, and
each is described in docs/rules.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class IntegrationOptions:
    """The integration-specific choices of one deployment; defaults are the conservative ones."""

    deadline_unknown_superseded: bool = False
    """P18 option: the gateway's deadline `UNKNOWN` (F3) may be replaced by a network final
    (`DELIVRD`, `UNDELIV`, ...) for the same message, whatever the arrival order. Off: the two
    are incompatible finals and the second opens a conflict."""

    receipt_ids_hex: bool = False
    """P10 option: receipt ids are the hexadecimal form of the decimal ids returned at submit.
    On: the receipt id is correlated by its decimal value (the raw id is still kept)."""

    bare_digits_are_international: bool = False
    """P5 option: a destination of 8-15 bare digits (no `+`, no `00`) already includes the
    country code, so it is normalised to E.164 by adding `+`. Off: such a value is kept raw."""

    receipt_timezone: str = "UTC"
    """The time zone of the reported `submit date` / `done date` (SMPP gives none)."""

    max_field_chars: int = 4096
    """Longer text fields are truncated in the columns (flagged); the raw payload stays whole."""

    def rules_version(self, rules: str) -> str:
        """P22: the version of the computation under these options - the rules version `rules`
        and each option the planner's rules read (the parser's options act as a receipt is
        stored, and stay with it) - recorded on every status and event: a status computed under
        other options is stale, as one of another rules version."""
        return f"{rules}+deadline_unknown_superseded" if self.deadline_unknown_superseded else rules
