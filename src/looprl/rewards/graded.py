"""When a SWE-bench-family task is resolved, given the per-test statuses its log reports
(``logparse``): one named rule per family, each a pure function.

    v = verdict("swebench", statuses, f2p, p2p)      # Verdict(resolved=True, ...)
    v = verdict("r2egym", statuses, expected=json.loads(row["expected_output_json"]))

- ``swebench`` (SWE-bench's ``harness/grading.py``, ``EvalType.PASS_AND_FAIL``): every
  FAIL_TO_PASS test ``PASSED`` or ``XFAIL``; every PASS_TO_PASS test that too or ``SKIPPED``
  (maintained). A test absent from the log failed.
- ``swebench_fail_only`` (``EvalType.FAIL_ONLY``, the repositories whose parser records only
  failures): a test failed only when the log says ``FAILED``.
- ``swesmith``: SWE-smith's own grader counts a test absent from the log as *passed* (it runs a
  subset of the suite) and leaves a skipped one out of the count. Here absent, skipped and
  errored are failed (the ``swebench`` rule without the skip allowance): a grader that reads
  absent as passed gives a workspace that breaks test collection, so that nothing runs, full
  marks. ``swesmith_own`` is SWE-smith's rule as it is, for comparing the two, never the default.
- ``r2egym`` (R2E-Gym's ``_calculate_reward_r2e``): reward 1 only when the parsed statuses equal
  ``expected_output_json`` exactly: the same tests (colour codes and `` - message`` tails
  removed from the names), each with the same status, failures included.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from looprl.rewards.logparse import ERROR, FAILED, PASSED, SKIPPED, XFAIL, Statuses


@dataclass(frozen=True)
class Verdict:
    """What a family's rule says of one log."""

    resolved: bool
    failed: tuple[str, ...] = ()
    """Graded tests that did not pass (FAIL_TO_PASS first), or for ``r2egym`` the tests whose
    status differs from the expected one (or that only one side has)."""
    missing: tuple[str, ...] = ()
    """Graded tests the log does not mention (counted failed unless the rule says otherwise)."""

    @property
    def score(self) -> float:
        return 1.0 if self.resolved else 0.0


def _rule(f2p_ok: Callable[[str | None], bool], p2p_ok: Callable[[str | None], bool]
          ) -> Callable[[Statuses, Sequence[str], Sequence[str]], Verdict]:
    def judge(statuses: Statuses, f2p: Sequence[str], p2p: Sequence[str]) -> Verdict:
        failed = [t for t in f2p if not f2p_ok(statuses.get(t))]
        failed += [t for t in p2p if not p2p_ok(statuses.get(t)) and t not in failed]
        missing = tuple(t for t in dict.fromkeys((*f2p, *p2p)) if t not in statuses)
        return Verdict(not failed, tuple(failed), missing)
    return judge


def swebench(statuses: Statuses, f2p: Sequence[str], p2p: Sequence[str]) -> Verdict:
    """SWE-bench's PASS_AND_FAIL rule.

    >>> swebench({"a": "PASSED", "b": "SKIPPED"}, ["a"], ["b"]).resolved
    True
    >>> swebench({"a": "SKIPPED"}, ["a"], []).failed, swebench({}, ["a"], []).missing
    (('a',), ('a',))
    """
    return _rule(lambda s: s in (PASSED, XFAIL), lambda s: s in (PASSED, XFAIL, SKIPPED))(
        statuses, f2p, p2p)


def swebench_fail_only(statuses: Statuses, f2p: Sequence[str], p2p: Sequence[str]) -> Verdict:
    """SWE-bench's FAIL_ONLY rule: only an explicit ``FAILED`` fails.

    >>> swebench_fail_only({"b": "FAILED"}, ["a"], ["b"])
    Verdict(resolved=False, failed=('b',), missing=('a',))
    """
    return _rule(lambda s: s != FAILED, lambda s: s != FAILED)(statuses, f2p, p2p)


def swesmith(statuses: Statuses, f2p: Sequence[str], p2p: Sequence[str]) -> Verdict:
    """SWE-smith rows as looprl grades them: passed means ``PASSED`` or ``XFAIL``; absent,
    skipped or errored is failed.

    >>> swesmith({}, ["a"], []).resolved
    False
    """
    return _rule(lambda s: s in (PASSED, XFAIL), lambda s: s in (PASSED, XFAIL))(
        statuses, f2p, p2p)


def swesmith_own(statuses: Statuses, f2p: Sequence[str], p2p: Sequence[str]) -> Verdict:
    """SWE-smith's grader as it is: absent counts passed, skipped is left out of the count.

    >>> swesmith_own({}, ["a"], []).resolved                # nothing ran: still "resolved"
    True
    """
    return _rule(lambda s: s is None or s not in (FAILED, ERROR),
                 lambda s: s is None or s not in (FAILED, ERROR))(statuses, f2p, p2p)


_COLOUR = re.compile(r"\x1b\[\d+m|\\u001b\[\d+m")


def _names(d: Mapping[str, str]) -> dict[str, str]:
    return {_COLOUR.sub("", k).split(" - ")[0]: str(v) for k, v in d.items()}


def r2egym(statuses: Statuses, expected: Mapping[str, str]) -> Verdict:
    """R2E-Gym's exact match of the parsed statuses with ``expected_output_json``.

    >>> r2egym({"t_a": "PASSED", "t_b": "FAILED"}, {"t_a": "PASSED", "t_b": "FAILED"}).resolved
    True
    >>> r2egym({"t_a": "PASSED", "t_b": "PASSED"}, {"t_a": "PASSED", "t_b": "FAILED"}).failed
    ('t_b',)
    """
    got, want = _names(statuses), _names(expected)
    differ = tuple(sorted(k for k in {*got, *want} if k and got.get(k) != want.get(k)))
    missing = tuple(sorted(k for k in want if k and k not in got))
    return Verdict(not differ and len(got) == len(want), differ, missing)


RULES: dict[str, Callable[[Statuses, Sequence[str], Sequence[str]], Verdict]] = {
    "swebench": swebench, "swebench_fail_only": swebench_fail_only, "swegym": swebench,
    "swesmith": swesmith, "swesmith_own": swesmith_own,
}
CONTRACTS = (*RULES, "r2egym")


def verdict(contract: str, statuses: Statuses, f2p: Sequence[str] = (), p2p: Sequence[str] = (),
            expected: Mapping[str, str] | None = None) -> Verdict:
    """The ``contract``'s verdict on ``statuses``; ``ValueError`` (one line) for an unknown
    contract or an ``r2egym`` one without its expected statuses.

    >>> verdict("swesmith", {"t.py::a": "PASSED"}, ["t.py::a"]).score
    1.0
    """
    if contract == "r2egym":
        if expected is None:
            raise ValueError("the r2egym contract needs the expected statuses "
                             "(the row's expected_output_json)")
        return r2egym(statuses, expected)
    if contract not in RULES:
        raise ValueError(f"grading contract {contract!r} is not known; choose one of "
                         f"{', '.join(CONTRACTS)}")
    if not f2p:
        raise ValueError(f"the {contract} contract needs FAIL_TO_PASS tests")
    return RULES[contract](statuses, f2p, p2p)


__all__ = ["CONTRACTS", "ERROR", "Verdict", "r2egym", "swebench", "swesmith", "verdict"]
