"""The Prefect UI in a real browser (headless Debian chromium through Playwright): open the build deployment,
start a custom run from its parameter form with a non-default spec path and a run name, and check that the
run completes with exactly that parameter.

Needs `apt-get install chromium` and `pip install playwright` (Playwright's own browser download is not used).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.cluster import (
    PrefectServer,
    seed_unique_model,
    write_spec,
)

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the Python package only)")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.services,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="apt-get install -y chromium (headless browser)"),
]
def runs_of(http, deployment_id: str) -> list[dict[str, object]]:
    found = http.post("/flow_runs/filter", json={"flow_runs": {"deployment_id": {"any_": [deployment_id]}}})
    found.raise_for_status()
    return found.json()


def submit_until_listed(page, run_name: str) -> None:
    """Submit the form; the UI then goes back to the deployment's Runs tab, where the new run is listed by its
    name. A create request that never got an answer from the server (a network error, or a 5xx: the Prefect UI
    shows "Oops. Something went wrong." for both, usePrefectApi's ApiStatusToast) is submitted once more, as a
    user would: seen once in a CI run under load (the SQLite-backed test server logged no error; the browser's
    POST got no answer). Any other failed API call fails the test with what the server said."""
    failed: list[tuple[str, int | str, str]] = []  # (method and URL, status or network error, what it said)

    def on_response(response) -> None:
        if "/api/" in response.url and response.status >= 400:
            failed.append((f"{response.request.method} {response.url}", response.status, response.text()[:300]))

    def on_request_failed(request) -> None:
        if "/api/" in request.url:
            failed.append((f"{request.method} {request.url}", str(request.failure), ""))

    page.on("response", on_response)
    page.on("requestfailed", on_request_failed)
    for attempt in (1, 2):
        failed.clear()
        page.get_by_role("button", name="Submit").click()
        try:
            sync_api.expect(page.get_by_text(run_name).first).to_be_visible(timeout=60_000)
            return
        except AssertionError:
            creates = [outcome for call, outcome, _ in failed if "create_flow_run" in call]
            unanswered = bool(creates) and all(isinstance(o, str) or o >= 500 for o in creates)
            if attempt == 2 or not unanswered:
                calls = [f"{call} -> {outcome} {said}".rstrip() for call, outcome, said in failed]
                raise AssertionError("the run was not listed after Submit; failed API calls:\n"
                                     + "\n".join(calls or ["none"])) from None


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def test_custom_run_from_the_deployment_form(cluster: PrefectServer, stack, tmp_path: Path, unique: str) -> None:
    repo_id = f"tiny-org/ui-{unique}"
    seed_unique_model(Path(stack["EF_HUB_ROOT"]), repo_id, tmp_path, f"ui {unique}")
    spec = write_spec(tmp_path, source=f"hf://{repo_id}@main", store=f"s3://enginefoundry/ui-{unique}",
                      mlflow_uri=stack["MLFLOW_TRACKING_URI"], experiment=f"ui-{unique}",
                      registered_model=f"tiny-chat-{unique}", benchmark=False)  # about the form, not speed
    run_name = f"ui-run-{unique}"
    with cluster.client() as http:
        deployment = http.get("/deployments/name/build-engines/manual").json()
        before = {r["id"] for r in runs_of(http, deployment["id"])}
    assert deployment["parameters"]["spec_path"] != str(spec)

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.goto(f"{cluster.ui}/deployments", wait_until="networkidle")
            page.get_by_role("link", name="manual", exact=True).first.click()
            page.wait_for_url(f"**/deployments/deployment/{deployment['id']}")
            page.get_by_role("button", name="Run", exact=True).click()
            page.get_by_text("Custom run").click()
            page.wait_for_url("**/run?**")
            # The form is rendered from the flow's typed signature and docstring.
            sync_api.expect(page.get_by_text("spec_path (Optional)")).to_be_visible()
            force_help = "build a new build of every unit, even of those published already"
            sync_api.expect(page.get_by_text(force_help)).to_be_visible()
            # Store and MLflow overrides, and a field that takes the spec's YAML pasted as text.
            for field in ("store (Optional)", "mlflow_uri (Optional)", "spec_yaml (Optional)"):
                sync_api.expect(page.get_by_text(field)).to_be_visible()
            sync_api.expect(page.get_by_text("the build spec's YAML text, pasted")).to_be_visible()
            name = page.locator("input[type=text]").first
            name.fill(run_name)
            spec_field = page.locator("textarea").first
            sync_api.expect(spec_field).to_have_value("configs/tiny-cpu.yaml")
            spec_field.fill(str(spec))
            submit_until_listed(page, run_name)
        finally:
            browser.close()

    with cluster.client() as http:
        new = [r for r in runs_of(http, deployment["id"]) if r["id"] not in before]
    assert len(new) == 1
    flow_run_id = new[0]["id"]

    run = cluster.wait(flow_run_id, timeout_s=600)
    # The name typed in the form stays (an unnamed run would be called `build <spec> (cluster)`).
    assert run["name"] == run_name
    assert run["deployment_id"] == deployment["id"]
    assert run["parameters"]["spec_path"] == str(spec)
    assert run["parameters"]["mode"] == "cluster"  # untouched fields keep the deployment's defaults
    assert run["state_type"] == "COMPLETED", run["state"]
    children = cluster.children(flow_run_id)
    assert [c["name"] for c in children] == ["unit fp32-tp1.chat.cpu"]
    assert children[0]["state_type"] == "COMPLETED"
