"""looprl.weights: versioned, delta-compressed policy weights over fsspec.

    from looprl.weights import LocalWeightStore
    store = LocalWeightStore()                 # LOOPRL_HOME/weights; FsspecWeightStore("s3://...")
    store.publish(model.state_dict(), version) # trainer
    got = store.load()                         # engine: latest intact weights, fallback reported
"""

from looprl.weights.store import (
    FsspecWeightStore,
    Loaded,
    LocalWeightStore,
    PublishInfo,
    WeightStoreConfig,
    prune,
)

__all__ = ["FsspecWeightStore", "Loaded", "LocalWeightStore", "PublishInfo", "WeightStoreConfig", "prune"]
