"""The gate's result: one :class:`CheckResult` per check, gathered in a :class:`GateReport`."""


from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from manifest.gate.policy import GatePolicy
from manifest.judge import GATE_VERDICTS, GateStatus

if TYPE_CHECKING:
    from collections.abc import Callable

    from manifest.rerun.environment import RebuildOptions

Status = GateStatus
"""The gate's statuses (:class:`manifest.judge.GateStatus`), by the name its checks use."""

JSON_FORMAT = "manifest-gate/v1"
UPDATE_HINT = "run `manifest gate --update-baseline` and commit it to accept this change"




# ------------------------------------------------------------------ result


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: a status, one sentence, and the lines behind it."""

    name: str
    status: Status
    reason: str
    details: tuple[str, ...] = ()
    hint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status.value, "reason": self.reason,
                "details": list(self.details), "hint": self.hint}


@dataclass
class GateReport:
    """What the gate found; ``exit_code`` is the CLI's exit status."""

    project: str
    mode: str
    """``full``, ``update-baseline`` or ``no-rerun``."""
    policy: GatePolicy
    baseline: str
    checks: list[CheckResult] = field(default_factory=list)
    run_id: str | None = None
    command: list[str] = field(default_factory=list)
    baseline_written: bool = False
    warnings: list[str] = field(default_factory=list)
    plan: dict[str, Any] | None = None
    """The determinism re-run's plan (``manifest.rerun.plan.RerunPlan.to_json``), when one ran."""
    reason_code: str | None = None
    """The determinism re-run's reason code, as verify gives it
    (``manifest.judge.reasons.ReasonCode``); None when it ran none or gave no reason."""
    environment: dict[str, Any] | None = None
    """Which Python environment the determinism re-run used
    (``manifest.rerun.environment.RunEnvironment.to_json``), as verify says."""

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status is Status.FAIL]

    @property
    def verdict(self) -> str:
        """``pass``, ``fail``, ``no-verdict`` or ``nothing-compared`` (:data:`GATE_VERDICTS`),
        from the checks' statuses by the judge (``manifest.judge.rules.gate``)."""
        from manifest.judge.rules import gate

        return gate([c.status for c in self.checks]).value

    @property
    def exit_code(self) -> int:
        return GATE_VERDICTS[Status(self.verdict)][0]

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": JSON_FORMAT,
            "verdict": self.verdict,
            "reason_code": self.reason_code,
            "exit_code": self.exit_code,
            "mode": self.mode,
            "project": self.project,
            "command": self.command,
            "run_id": self.run_id,
            "baseline": self.baseline,
            "baseline_written": self.baseline_written,
            "policy": self.policy.to_json(),
            "checks": [c.to_json() for c in self.checks],
            "warnings": list(self.warnings),
            "plan": self.plan,
            "environment": self.environment,
        }


@dataclass(frozen=True)
class GateOptions:
    no_rerun: bool = False
    update_baseline: bool = False
    files: tuple[str, ...] = ()
    """Manifests to validate in --no-rerun mode (default: baseline + policy manifests)."""
    warn_hygiene: bool = False
    """Report hygiene problems as warnings that do not fail (the pre-commit hook)."""
    quiet: bool = True
    rebuild: RebuildOptions | None = None
    """``--env run``: the determinism re-run in the run's own environment, rebuilt from the
    fresh capture's records and proven, as verify; None: this machine's."""
    note: Callable[[str], None] | None = None
    """Progress the user sees before the re-run trains (the rebuilt environment's proof)."""


