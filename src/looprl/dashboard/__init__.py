"""looprl.dashboard: training, sandbox-fleet and feedback/A-B dashboards in the browser.

    looprl dashboard --run runs/quickstart --store feedback.db --env-server URL --env-token T
    looprl dashboard export --run runs/quickstart --out report.html

``create_app(DashboardConfig(...))`` is the FastAPI app; ``export_html`` writes the static report.
"""

from looprl.lazy import lazy_exports

# Imported on first use: importing one module of the package (a command's, say) stays light.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "app": ["DashboardConfig", "create_app", "export_html"],
})
