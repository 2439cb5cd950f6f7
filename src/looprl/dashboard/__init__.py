"""looprl.dashboard: training, sandbox-fleet and feedback/A-B dashboards in the browser.

    looprl dashboard --run runs/quickstart --store feedback.db --env-server URL --env-token T
    looprl dashboard export --run runs/quickstart --out report.html

``create_app(DashboardConfig(...))`` is the FastAPI app; ``export_html`` writes the static report.
"""

from looprl.dashboard.app import DashboardConfig, create_app, export_html

__all__ = ["DashboardConfig", "create_app", "export_html"]
