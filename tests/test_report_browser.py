"""The report of a real tune (simulator + verification on the real tritonserver) renders in headless Chromium
without errors, with every section present."""

from __future__ import annotations

import json
import shutil
import tempfile
import time

import pytest

from tune_fixtures import write_load, write_profile

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def results(tmp_path_factory, sleep_repo):
    """A results folder: tune with verification on Triton, a simulated run with CPU telemetry."""
    from serving_bench.run.records import save_records
    from serving_bench.serving_config import ServingConfig
    from serving_bench.telemetry import Telemetry
    from serving_bench.tune import adapters
    from serving_bench.tune.run import TuneOptions, run_tune
    from serving_bench.tune.load import load_from_file

    d = tmp_path_factory.mktemp("report")
    profile = write_profile(d / "profile.json", {"sleep_python": (5.0, 1.0, 8)})
    load = write_load(d / "load.yaml", {"sleep_python": 60}, {"sleep_python": 100}, duration_s=4.0)
    out = d / "results"
    doc = run_tune(TuneOptions(load=str(load), profile=str(profile), out=str(out / "tune"), repo=str(sleep_repo),
                               instances=(1, 2), max_batch_sizes=(1, 8), queue_delays_us=(0,), verify_top=1,
                               quiet=True, report=False))
    config = ServingConfig.from_repo(doc["tuned_repo"], ["sleep_python"])
    with Telemetry(None, 0.1, gpu=False) as telemetry:
        records = adapters.simulate(adapters.load_profile(profile), config, load_from_file(load).base)
        time.sleep(0.5)
    save_records(records, out / "simulate")
    telemetry.frame().to_csv(out / "simulate" / "telemetry.csv", index=False)
    from serving_bench.report.cli import write_report

    return write_report(out, title="browser test"), doc


def test_tune_verified_on_triton_and_wrote_a_tuned_repository(results):
    _, doc = results
    (row,) = doc["verification"]
    assert row["server"] == "embedded" and row["measured"]["sleep_python"]["p99_s"] > 0
    measured, simulated = row["measured"]["sleep_python"], row["simulated"]["sleep_python"]
    assert abs(measured["throughput_rps"] - simulated["throughput_rps"]) <= 0.2 * simulated["throughput_rps"]
    from serving_bench.serving_config import ServingConfig

    tuned = ServingConfig.from_repo(doc["tuned_repo"], ["sleep_python"])["sleep_python"]
    best = doc["best"]["config"]["sleep_python"]
    assert (tuned.instance_count, tuned.max_batch_size) == (best["instances"], best["max_batch_size"])
    assert any("Verified on real Triton" in line for line in doc["recommendation"])
    # the pick's capacity is capped at the top of the search (16x): replayed at 1x and there only
    assert doc["best"]["result"]["capacity_capped"] and row["capacity"]["capped"]
    assert [(r["label"], r["scale"]) for r in row["replays"]] == [("load", 1.0), ("capacity", 16.0)]
    assert row["capacity"]["held_at_capacity"] == row["replays"][1]["slo_met"]
    assert "16.00× (superpose) (the top of the search)" in doc["recommendation"][-1]


def test_report_is_self_contained(results):
    html = results[0].read_text()
    for needle in ("http://", "https://", "src=", "@import", "url("):
        assert needle not in html.replace('xmlns="http://www.w3.org/2000/svg"', ""), needle
    data = json.loads(results[0].with_suffix(".json").read_text())
    assert data["tune"]["best"] and data["cdfs"] and data["telemetry"] and data["validation"]


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver "
                    "(apt-get install chromium chromium-driver; .ci/run installs them)")
def test_report_renders_in_headless_chromium_without_errors(results):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    path, doc = results
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile_dir = tempfile.mkdtemp(prefix="chromium-profile-")
    for flag in FLAGS + [f"--user-data-dir={profile_dir}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        driver.get(path.resolve().as_uri())
        status = driver.find_element(By.ID, "js-status")
        assert status.get_attribute("data-ready") == "1", status.text  # the inline script ran to the end
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert errors == []
        rec = driver.find_element(By.CSS_SELECTOR, "#recommendation .recommendation").text
        assert rec.startswith("Deploy: sleep_python") and "Verified on real Triton" in rec
        for section in ("capacity-verification", "latency-cdfs", "throughput-p99", "utilisation-section",
                        "instance-heatmap", "sim-vs-measured-section", "top-configurations"):
            assert driver.find_element(By.ID, section).is_displayed()
        assert driver.find_elements(By.CSS_SELECTOR, "#latency-cdfs svg.chart .series")
        assert driver.find_elements(By.CSS_SELECTOR, "#throughput-p99 svg.chart circle")
        assert driver.find_elements(By.CSS_SELECTOR, "#utilisation svg, svg#utilisation")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#instance-heatmap .cell")) == 4
        rows = driver.find_elements(By.CSS_SELECTOR, "#sim-vs-measured tbody tr")
        assert len(rows) >= 6 and "tune verify #1 at 1.00× (superpose)" in rows[0].text
        (capacity_row,) = driver.find_elements(By.CSS_SELECTOR, "#capacity-table tbody tr")
        assert "16.00× (top)" in capacity_row.text and "1.00× met" in capacity_row.text
        # the script works: a legend click hides its series, sorting reorders the table
        item = driver.find_element(By.CSS_SELECTOR, "#throughput-p99 .legend-item")
        item.click()
        name = item.get_attribute("data-series")
        hidden = driver.find_elements(By.CSS_SELECTOR, f'#throughput-p99 .series.off[data-series="{name}"]')
        assert hidden
        header = driver.find_elements(By.CSS_SELECTOR, "#top-configs th")[2]
        header.click()
        values = [float(td.get_attribute("data-v")) for td in
                  driver.find_elements(By.CSS_SELECTOR, "#top-configs tbody tr td:nth-child(3)")]
        assert values == sorted(values)
        assert [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []
    finally:
        driver.quit()
        shutil.rmtree(profile_dir, ignore_errors=True)
