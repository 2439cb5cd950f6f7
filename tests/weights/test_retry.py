"""The weight store's transient failures, injected at the store's own publish and load: retried
until they go through, every failure counted in its class, the weights exact; a refusal that
would say the same again is not retried."""

import pytest
import torch

from looprl import faults
from looprl.errors import InfraKind, WeightStoreError
from looprl.faults import FaultInjector, FaultsConfig, InfraLedger
from looprl.weights.retry import RetryingStore
from looprl.weights.store import LocalWeightStore


@pytest.fixture
def injected():
    inj = FaultInjector(FaultsConfig({"weight_read": 0.4, "weight_write": 0.4}, seed=3))
    before = faults.install(inj)
    yield inj
    faults.install(before)


def _sd(v: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(v)
    return {"w": torch.randn(8, 8), "b": torch.randn(8)}


def test_publishes_and_loads_go_through_and_each_failure_is_counted(tmp_path, injected):
    ledger = InfraLedger()
    store = RetryingStore(LocalWeightStore(str(tmp_path), dtype="float32"), attempts=8,
                          backoff_s=0.0, ledger=ledger)
    for v in range(1, 13):
        store.publish(_sd(v), v)
    assert store.versions() == list(range(1, 13))
    for v in range(1, 13):
        got = store.load(v)
        assert got.version == v and torch.equal(got.state_dict["w"], _sd(v)["w"])
    settled = injected.books()["settled"]
    assert settled["weight_write"] >= 1 and settled["weight_read"] >= 1
    assert {k: n for k, n in ledger.counts().items() if n} == settled
    assert dict(store.failures) == settled


def test_the_last_failure_is_raised_and_a_refusal_at_once(tmp_path):
    inj = FaultInjector(FaultsConfig({"weight_write": 1.0}))
    before = faults.install(inj)
    try:
        store = RetryingStore(LocalWeightStore(str(tmp_path)), attempts=3, backoff_s=0.0)
        with pytest.raises(WeightStoreError, match="injected"):
            store.publish(_sd(1), 1)
        assert store.failures["weight_write"] == 3
    finally:
        faults.install(before)
    store.publish(_sd(1), 1)
    with pytest.raises(WeightStoreError, match="versions must increase") as e:
        store.publish(_sd(1), 1)
    assert e.value.kind == InfraKind.INTERNAL and store.failures["weight_write"] == 3
