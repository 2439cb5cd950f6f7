"""A weight store whose transient failures (a publish or a load that did not go through) are
retried with back-off and counted by class, so a flaky object store costs a second, not the run.

    store = RetryingStore(FsspecWeightStore("s3://bucket/run"), ledger=ledger)
    store.publish(state_dict, 7)        # up to ``attempts`` tries; each failure counted
    got = store.load(7)

Only ``WEIGHT_WRITE`` failures of ``publish``, ``WEIGHT_READ`` failures of ``load`` and the
``OSError`` of the filesystem under them are retried; a refusal that would say the same again (a
version that does not increase, a tensor dtype the store cannot hold: ``INTERNAL``) is raised at
once, and so is the last failure when every try failed. A publish that failed after its manifest
was renamed into place published the version: the retry finds it listed and stops there (it may
be damaged; readers then fall back to the last intact snapshot, ``FsspecWeightStore.load``).
Everything else goes to the wrapped store unchanged.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from looprl.errors import InfraKind, WeightStoreError
from looprl.faults import InfraLedger

if TYPE_CHECKING:
    import torch

    from looprl.weights.store import FsspecWeightStore, Loaded

log = logging.getLogger(__name__)
T = TypeVar("T")


class RetryingStore:
    """``store`` with ``publish`` and ``load`` retried (module docstring)."""

    def __init__(self, store: FsspecWeightStore, *, attempts: int = 5, backoff_s: float = 0.2,
                 ledger: InfraLedger | None = None) -> None:
        if attempts < 1 or backoff_s < 0:
            raise ValueError(f"RetryingStore needs attempts >= 1 and backoff_s >= 0, got "
                             f"{attempts} and {backoff_s}")
        self.store, self.attempts, self.backoff_s, self.ledger = store, attempts, backoff_s, ledger
        self.failures: Counter[str] = Counter()
        """Failures absorbed so far, by class (a fleet replica reports them to the trainer)."""

    def _retry(self, kind: InfraKind, what: str, call: Callable[[], T],
               done: Callable[[], bool] = lambda: False) -> T:
        for n in range(1, self.attempts + 1):
            try:
                return call()
            except (WeightStoreError, OSError) as e:
                if isinstance(e, WeightStoreError) and e.kind != kind:
                    raise  # says the same however often it is asked
                self.failures[kind.value] += 1
                if self.ledger is not None:
                    self.ledger.failure(kind)
                if n == self.attempts:
                    raise
                log.warning("weight store: %s failed (%s); try %d of %d", what, e, n + 1,
                            self.attempts)
                time.sleep(self.backoff_s * 2 ** (n - 1))
                if done():
                    return None  # type: ignore[return-value]
        raise AssertionError("unreachable: the last try returns or raises")

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self._retry(InfraKind.WEIGHT_WRITE, f"publishing version {version}",
                    lambda: self.store.publish(state_dict, version),
                    done=lambda: version in self.store.versions())

    def load(self, version: int | None = None) -> Loaded:
        return self._retry(InfraKind.WEIGHT_READ, f"loading version {version}",
                           lambda: self.store.load(version))

    def latest(self) -> int | None:
        return self.store.latest()

    def fetch(self, version: int) -> dict[str, torch.Tensor]:
        return self.store.fetch(version)

    def rollback(self, version: int, state_dict: Mapping[str, torch.Tensor] | None = None
                 ) -> list[int]:
        return self.store.rollback(version, state_dict)

    def __getattr__(self, name: str) -> Any:  # versions, manifest, last_publish, ...
        return getattr(self.store, name)
