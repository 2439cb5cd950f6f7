"""looprl.weights: versioned, delta-compressed policy weights over fsspec.

    from looprl.weights import LocalWeightStore
    store = LocalWeightStore()                 # LOOPRL_HOME/weights; FsspecWeightStore("s3://...")
    store.publish(model.state_dict(), version) # trainer
    got = store.load()                         # engine: latest intact weights, fallback reported
    store.rollback(v, model.state_dict())      # trainer resumed from its checkpoint of version v
"""

from looprl.lazy import lazy_exports

# Imported on first use: importing one module of the package (a command's, say) stays light.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "store": ["FsspecWeightStore", "Loaded", "LocalWeightStore", "PublishInfo", "WeightStoreConfig", "prune"],
})
